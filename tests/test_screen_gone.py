"""A dashboard whose screen is gone ends, whatever took the screen away: its terminal
hung up without a SIGHUP reaching it, or, in a browser, the `eagle3-tui serve` that
carried its session was killed. Left alone it would live on unseen (before: a core
spinning on the dead terminal; a browser session's app idle for good), its SSH link and
the host's agent with it. Real processes on a real pseudo-terminal and a real server."""

from __future__ import annotations

import asyncio
import os
import pty
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests import checkout
from tests.test_mutants_webserve import Page, port_of, whole_screen, with_cookie
from tests.test_serve import Served, serve
from tui.views.served import SESSIONS_ENV

EXIT_HANGUP = 129  # as a shell reports a process that SIGHUP ended


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ended_within(proc_pid: int, wait: Any, seconds: float) -> int:
    """The exit code of `wait(seconds)`, or a failure that says what the process does."""
    try:
        return int(wait(seconds))
    except subprocess.TimeoutExpired:
        before = cpu_seconds(proc_pid)
        time.sleep(2.0)
        share = (cpu_seconds(proc_pid) - before) / 2.0
        raise AssertionError(f"still running {seconds:.0f} s after its screen went, at {share:.0%} of a core")


def test_a_dashboard_whose_terminal_hangs_up_ends_at_once(tmp_path: Path) -> None:
    """The window is closed or the SSH session drops, and SIGHUP never reaches the app
    (started through `su`/`sudo`, `nohup`, a wrapper that does not pass it on; here: in
    its own session, so the terminal is not its controlling one). The dashboard ends
    within seconds with 129, as a hangup would end it; before, Textual's input thread
    read the dead terminal's empty reads in a loop: alive for good at 40-90 % of a core."""
    (tmp_path / "eagle3.toml").write_text(f'[host]\nruns_dir = "{tmp_path / "runs"}"\n')
    master, slave = pty.openpty()
    os.set_blocking(master, False)
    proc = subprocess.Popen([sys.executable, "-m", "tui.cli", "connect", "local"], cwd=tmp_path,
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                            env=checkout.env(TERM="xterm"))
    os.close(slave)
    out, t0 = b"", time.monotonic()
    try:
        while b"Runs" not in out and proc.poll() is None and time.monotonic() - t0 < 60:
            try:
                out += os.read(master, 65536)
            except (BlockingIOError, OSError):
                time.sleep(0.05)
        assert proc.poll() is None and b"Runs" in out, out.decode("utf-8", "replace")[-2000:]
        time.sleep(1.0)  # connected and drawing
        os.close(master)
        master = -1
        assert ended_within(proc.pid, proc.wait, 10) == EXIT_HANGUP
    finally:
        if master >= 0:
            os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def test_a_browser_sessions_app_ends_when_its_server_is_killed(tmp_path: Path) -> None:
    """`serve` killed outright (SIGKILL, the OOM killer): it has no chance to end its
    sessions, and their pipes close. Each session's app ends within seconds; before, it
    lived on, idle and unseen, holding its link to the host."""

    async def open_session(served: Served) -> None:
        async with with_cookie(served) as http:
            page = Page(http, served, port_of(served))
            await page.open(100, 30)
            await page.until(whole_screen(30))

    with serve(tmp_path) as served:
        asyncio.run(open_session(served))
        apps = [pid for pid in descendants(served.proc.pid)
                if b"\0connect\0" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert apps, "no session app found under the server"
        environ = Path(f"/proc/{apps[0]}/environ").read_bytes().split(b"\0")
        private = Path(next(v for v in environ if v.startswith(SESSIONS_ENV.encode() + b"=")).decode()
                       .split("=", 1)[1]).parent  # serve's own temp dir, which its kill leaves behind
        served.proc.send_signal(signal.SIGKILL)
        served.proc.wait()

        def gone(seconds: float) -> int:
            deadline = time.monotonic() + seconds
            while any(Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]
                      for pid in apps):
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired("session app", seconds)
                time.sleep(0.1)
            return 0

        try:
            ended_within(apps[0], gone, 10)
        finally:
            if private.name.startswith("eagle3-tui-serve-"):
                shutil.rmtree(private, ignore_errors=True)  # the suite leaves nothing in /tmp
            for pid in apps:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
