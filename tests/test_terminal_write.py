"""A notification's escapes reach the real terminal through Textual's own writer, found by
public API (`EagleApp.get_driver_class`, tui/views/widgets/render.py `remembering`), not
through the driver Textual keeps private. Run in a pseudo-terminal: a headless app has
no terminal to write to."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time
from pathlib import Path

from tests import checkout

ROOT = Path(__file__).resolve().parent.parent
MARK = "\x1b]9;eagle3-tui terminal-write check\x07"
APP = f"""
from textual.screen import Screen
from textual.widgets import Static
from tui.views.app import EagleApp
from tui.views.widgets.render import terminal_write

class First(Screen):
    def compose(self):
        yield Static("x")

    def on_mount(self):
        self.set_timer(0.2, self.send)

    def send(self):
        terminal_write(self.app, {MARK!r})
        self.app.exit()

EagleApp(First()).run()
"""


def run_app_in_pty(code: str, timeout: float = 60) -> tuple[int | None, str]:
    master, slave = pty.openpty()
    os.set_blocking(master, False)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=slave, stdout=slave, stderr=slave,
                            env=checkout.env(TERM="xterm"))
    os.close(slave)
    out, t0 = b"", time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < timeout:
        try:
            out += os.read(master, 65536)
        except (BlockingIOError, OSError):
            time.sleep(0.02)
    if proc.poll() is None:
        proc.kill()
    try:
        out += os.read(master, 65536)
    except OSError:
        pass
    os.close(master)
    return proc.wait(), out.decode("utf-8", "replace")


def test_a_notification_escape_reaches_the_terminal() -> None:
    code, out = run_app_in_pty(APP)
    assert code == 0, out[-2000:]
    assert MARK in out, out[-2000:]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            before = cpu_seconds(proc.pid)
            time.sleep(2.0)
            share = (cpu_seconds(proc.pid) - before) / 2.0
            raise AssertionError(f"still running 10 s after its terminal hung up, at {share:.0%} of a core")
        assert code == 129
    finally:
        if master >= 0:
            os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
