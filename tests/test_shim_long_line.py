"""A run that prints one 1 MB line, under the real shim (issue 35.3).

The shim's pace thread reads every line the run writes, holding the GIL while a regex
runs: a pattern that backtracked on "step 1 step 1 …" (hours on 1 MB) froze the shim's
main thread, so the run's end was recorded late (a 6 s job as 65 s) or never, and a
kill left the run "running" though its processes were gone. Now the run's record keeps
its real duration and a kill ends it at once."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from remote.base import procfs
from remote.run import kill as killer
from remote.run import runner

LINE = "step 1 " * ((1 << 20) // 7)  # the report's worst shape: "step N" with no loss after it, 1 MB


def _wait_for(pred: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _run(runs: str) -> dict:
    (rec,) = runner.list_runs(runs)
    return rec


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("EAGLE3_TUI_PACE_S", "0.2")  # the shim's pace thread looks every 0.2 s
    monkeypatch.setenv("EAGLE3_TUI_TIMELINE", "0")
    runs_dir = str(tmp_path / "runs")
    yield runs_dir
    for rec in runner.list_runs(runs_dir):
        if rec["state"] == "running":
            killer.kill(runs_dir, rec["run_id"], graces=(0, 0), gpu_wait=0)
        for pid in (rec.get("shim_pid"), rec.get("pid")):
            st = procfs.read_stat(pid) if pid else None
            if st is not None and st["state"] not in ("Z", "X"):
                os.kill(pid, signal.SIGKILL)


def _job(tmp: Path, then: str) -> list[str]:
    script = tmp / "job.py"
    script.write_text("import sys, time\nsys.stdout.write(%r + '\\n')\nsys.stdout.flush()\n%s\n" % (LINE, then))
    return [sys.executable, str(script)]


def test_a_1mb_line_leaves_the_runs_duration_true(runs: str, tmp_path: Path) -> None:
    rec = runner.launch(runs, "long-line", _job(tmp_path, "time.sleep(3)"), str(tmp_path), {})
    done = _wait_for(lambda: _run(runs)["state"] == "exited" and _run(runs), 20, "the run to be recorded as ended")
    assert isinstance(done, dict) and done["run_id"] == rec["run_id"] and done["exit_code"] == 0
    assert 3 - 2 <= done["duration"] <= 3 + 2, done["duration"]
    pace = Path(runs, rec["run_id"], "pace.json").read_text()
    assert '"size": %d' % (len(LINE) + 1) in pace  # the pace thread did read the line


def test_kill_ends_a_run_that_printed_a_1mb_line_at_once(runs: str, tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    rec = runner.launch(runs, "long-line", _job(tmp_path, "time.sleep(600)"), str(tmp_path), {}, log=str(log))
    _wait_for(lambda: log.is_file() and log.stat().st_size == len(LINE) + 1, 10, "the line in the log")
    time.sleep(1.0)  # the pace thread (every 0.2 s) is reading it
    t0 = time.monotonic()
    killer.kill(runs, rec["run_id"], graces=(0.5, 0.5), gpu_wait=0)
    _wait_for(lambda: _run(runs)["state"] != "running", 5, "the killed run to be recorded as ended")
    assert _run(runs)["state"] == "killed"
    assert time.monotonic() - t0 < 6
