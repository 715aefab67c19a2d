"""The client's smaller hardening items: config keys and shapes, relaunch's confirmation,
the notify hook's process group, the stale warning beside a kill's banner.

Real parts: the CLI runs as a subprocess against the real local agent; hooks are real
processes whose children are looked for in /proc.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tui.services.config import ConfigError, parse_config
from tui.state import view
from tui.state.model import Action, AppState, Link

ROOT = Path(__file__).resolve().parent.parent


def e3(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The CLI with no terminal on stdin (as under cron or a pipe)."""
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=str(ROOT)))


# ---- eagle3.toml ------------------------------------------------------------------------
def test_unknown_key_names_are_quoted_with_their_controls_escaped() -> None:
    cfg = parse_config('[run]\n"na\\u001bcme" = 1\n"\\u202ex" = 2\nnmae = 3\n["se\\u009b2J"]\n')
    text = "\n".join(cfg.warnings)
    assert 'unknown key run."na\\u001bcme" ignored (did you mean run.name?)' in text
    assert 'unknown key run."\\u202ex" ignored' in text
    assert "unknown key run.nmae ignored (did you mean run.name?)" in text  # a bare key as it is
    assert 'unknown section ["se\\u009b2J"] ignored' in text
    assert not any(c in text for c in "\x1b\x9b\u202e")


def test_a_string_of_fleet_hosts_is_refused_not_spread_into_letters() -> None:
    with pytest.raises(ConfigError, match=r"fleet.hosts: must be a list of targets"):
        parse_config('hosts = ["a"]\n[fleet]\nhosts = "node1"\n')
    with pytest.raises(ConfigError, match=r"fleet.hosts: must be a list of targets"):
        parse_config('[fleet]\nhosts = "node1"\n')


@pytest.mark.parametrize("deep", ["a = " + "[" * 5000 + "]" * 5000, "a = " + "{b=" * 3000 + "1" + "}" * 3000])
def test_a_deeply_nested_config_is_one_line_and_exit_2(tmp_path: Path, deep: str) -> None:
    (tmp_path / "eagle3.toml").write_text(deep + "\n")
    res = e3("runs", cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-500:]
    assert res.stderr.count("\n") == 1 and "nested too deeply" in res.stderr and "Traceback" not in res.stderr


# ---- relaunch asks first ------------------------------------------------------------------
def _config(tmp: Path) -> None:
    (tmp / "eagle3.toml").write_text(
        f'[host]\nruns_dir = "{tmp / "runs"}"\ninterval = 0.3\n'
        f'[run]\nname = "hardening"\ncommand = ["{sys.executable}", "-c", "print(1)"]\ncwd = "{tmp}"\n'
        "graces = [0.5, 0.5]\ngpu_wait = 0\n")


def _runs(tmp: Path) -> list[dict[str, object]]:
    res = e3("runs", "local", "--json", cwd=tmp)
    assert res.returncode == 0, res.stderr
    return list(json.loads(res.stdout)["runs"])


def test_relaunch_of_an_ended_run_asks_and_without_a_terminal_refuses(tmp_path: Path) -> None:
    """It launched at once; now it asks as kill does, and with no terminal to ask on and
    no --yes it refuses in one line (exit 2) and launches nothing."""
    _config(tmp_path)
    first = json.loads(e3("launch", "local", "--json", cwd=tmp_path).stdout)
    deadline = time.monotonic() + 30
    while [r["state"] for r in _runs(tmp_path) if r["run_id"] == first["run_id"]] != ["exited"]:
        assert time.monotonic() < deadline, "the run did not end"
        time.sleep(0.2)
    res = e3("relaunch", "local", cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.count("\n") == 1 and "pass --yes" in res.stderr, res.stderr
    assert len(_runs(tmp_path)) == 1  # nothing launched
    again = e3("relaunch", "local", "--yes", "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["run_id"] != first["run_id"] and len(_runs(tmp_path)) == 2


# ---- the notify hook ----------------------------------------------------------------------
HOOK = ("import os, subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        "open(sys.argv[1], 'w').write(str(child.pid)); sys.stdin.read(); time.sleep(120)")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_pid(path: Path) -> int:
    deadline = time.monotonic() + 20
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, "the hook did not start its child"
        time.sleep(0.05)
    return int(path.read_text())


def test_a_hook_past_its_timeout_dies_with_its_children(tmp_path: Path) -> None:
    from tui.services.notify import run_hook

    pidfile = tmp_path / "child.pid"
    th = run_hook([sys.executable, "-c", HOOK, str(pidfile)], {"event": "x"}, timeout=1.0)
    child = _wait_pid(pidfile)
    th.join(20)
    assert not th.is_alive()
    deadline = time.monotonic() + 5
    while _alive(child):
        assert time.monotonic() < deadline, f"the hook's child {child} outlived the hook's timeout"
        time.sleep(0.05)


def test_a_hanging_hook_is_killed_when_the_notifier_closes(tmp_path: Path) -> None:
    """`watch` (and the dashboard) close their notifier on exit: a hook still hanging then
    is killed with its children, after a short grace to deliver."""
    from tui.services.notify import Notifier

    class Ev:
        seq, kind, run_id, message = 1, "failed", "r1", "boom"

        def to_json(self) -> dict[str, str]:
            return {"event": "failed", "run_id": "r1"}

    class Watch:
        events = (Ev(),)

    pidfile = tmp_path / "child.pid"
    n = Notifier([sys.executable, "-c", HOOK, str(pidfile)], host="h")
    n.send_new(Watch())
    child = _wait_pid(pidfile)
    (hook,) = n.procs
    t0 = time.monotonic()
    n.close(grace=0.5)
    assert time.monotonic() - t0 < 5
    assert hook.poll() is not None
    deadline = time.monotonic() + 5
    while _alive(child):
        assert time.monotonic() < deadline, "the hanging hook's child outlived the watch"
        time.sleep(0.05)


def test_watch_kills_a_hanging_hook_when_it_exits(tmp_path: Path) -> None:
    """`watch` itself, end to end: the run fails while watched, the `[notify] command`
    hook starts and hangs with a child; `watch` exits with the run's outcome and, after
    its grace, nothing of the hook is left (it lived on after `watch` exited)."""
    pidfile, go = tmp_path / "child.pid", tmp_path / "go"
    hook = json.dumps([sys.executable, "-c", HOOK, str(pidfile)])
    job = json.dumps([sys.executable, "-c",
                      f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
                      "raise SystemExit(3)"])
    (tmp_path / "eagle3.toml").write_text(
        f'[host]\nruns_dir = "{tmp_path / "runs"}"\ninterval = 0.3\n[run]\nname = "hook"\ncommand = {job}\n'
        f'cwd = "{tmp_path}"\n[notify]\ncommand = {hook}\n')
    assert e3("launch", "local", cwd=tmp_path).returncode == 0
    watch = subprocess.Popen([sys.executable, "-m", "tui.cli", "watch", "local"], cwd=tmp_path, text=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert watch.stderr is not None and "watching run" in watch.stderr.readline()
        go.touch()  # the run fails now, while watched: news, so the hook runs
        out, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
    assert watch.returncode == 1 and "failed" in out, out + err
    child = _wait_pid(pidfile)  # the hook did start
    deadline = time.monotonic() + 5
    while _alive(child):
        assert time.monotonic() < deadline, "the hanging hook's child outlived `watch`"
        time.sleep(0.05)


# ---- k while the agent is frozen ---------------------------------------------------------
def test_a_kill_banner_keeps_the_stale_warning_in_view() -> None:
    now = time.time()
    state = AppState(link=Link(state="connected", last_data=now - 30),
                     actions=(Action("a1", "kill", "r1", started_at=now - 1),))
    text, kind = view.banner(state, now)
    assert text is not None and "Killing run r1" in text and "stale for 30s" in text and kind == ""
    fresh = AppState(link=Link(state="connected", last_data=now), actions=state.actions)
    text, kind = view.banner(fresh, now)
    assert text == "Killing run r1…" and kind == ""


# ---- line counts with \r redraws ---------------------------------------------------------
REDRAWN = (b"INFO start\nRuntimeError: CUDA error: an illegal memory access was encountered\n"
           b"Loading 1\rLoading 2\rLoading 3\rLoading 4\rLoading 5\rLoading 6\r")  # a bar still redrawn


def test_inspect_numbers_file_lines_through_redraws() -> None:
    from tui.services.inspect import inspect_log

    for data, line in ((REDRAWN, 2), (b"a\rb\rc\rd\re\rf\rg\n" + REDRAWN, 3), (b"x\r\r\r\n\r\n" + REDRAWN, 4)):
        r = inspect_log(data)
        assert r["root_cause"]["line_no"] == line and r["lines"] == data.count(b"\n") + 1, (data, r["lines"])


async def test_the_viewer_counts_a_last_line_being_redrawn_as_a_line() -> None:
    """The viewer said "lines 1-3 of 2": the last line, a bar redrawn with \\r and no
    newline yet, is on screen as line 3 and must count in the total."""
    from textual.app import App
    from textual.widgets import Static

    from tui.state.logpage.blocks import Chunk
    from tui.state.logpage.document import LogDocument
    from tui.views.screens.logviewer import LogViewerScreen

    async def fetch(offset: int, length: int) -> Chunk:  # stands in for the agent's read_range
        return Chunk(offset, REDRAWN[offset:offset + length], len(REDRAWN), 7)

    screen = LogViewerScreen(client=None, path="/x.log", doc=LogDocument(fetch), follow=False)

    class Host(App[None]):
        def on_mount(self) -> None:
            self.push_screen(screen)

    app = Host()
    async with app.run_test(size=(100, 20)) as pilot:
        deadline = time.monotonic() + 20
        while "of " not in str(screen.query_one("#lv-status", Static).render()):
            assert time.monotonic() < deadline, "the viewer never finished counting"
            await pilot.pause(0.05)
        assert [(ln.line_no, ln.text) for ln in screen.window][-1] == (3, "Loading 6")
        assert "lines 1-3 of 3 " in str(screen.query_one("#lv-status", Static).render())
