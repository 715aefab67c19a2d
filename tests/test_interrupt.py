"""A run the user interrupts (Ctrl-C, SIGTERM) ends killed, not failed (issue 15):
real processes get the real signal and print what Python prints; their logs go through
the real parser and the watch's ending."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote.run.rundir import signal_name
from tui.protocol.records import RunRecord
from tui.services.inspect import inspect_log
from tui.state.advice import summarize
from tui.state.loganalysis import fold
from tui.state.watch import WatchState, ending, observe

JOB = r"""
import sys, time
print("Loading safetensors checkpoint shards: 100% Completed | 8/8 [00:08<00:00, 1.0it/s]", flush=True)
print("INFO Model loading took 3.1 GiB and 8.0 seconds", flush=True)
if sys.argv[1] == "fail-first":
    try:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    except RuntimeError:
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
print("ready", flush=True)
time.sleep(60)
"""


def _interrupted(tmp_path: Path, mode: str, sig: int) -> tuple[RunRecord, object]:
    """Run the job, send ``sig`` once it is ready; (its run record, its log's analysis)."""
    log = tmp_path / "out.log"
    with log.open("wb") as out:
        # SIGINT at its default in the job, as the supervisor shim leaves it: a test
        # session started in the background (`cmd &`) inherits it ignored, and then
        # Python never raises KeyboardInterrupt
        proc = subprocess.Popen([sys.executable, "-c", JOB, mode], stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 20
        while b"ready" not in log.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(sig)
        rc = proc.wait(timeout=20)
    run = RunRecord.parse({"run_id": "r1", "name": "x", "state": "exited",
                         "exit_code": rc if rc >= 0 else None,
                         "signal": signal_name(-rc) if rc < 0 else None})
    done, partial = fold.split_lines(b"", log.read_bytes())
    a = fold.LogAnalysis()
    for no, line in enumerate(done + fold.finish_lines(partial), 1):
        a = fold.step(a, line, no)
    return run, a


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_users_interrupt_ends_killed_not_failed(tmp_path: Path, sig: int) -> None:
    run, a = _interrupted(tmp_path, "plain", sig)
    assert run.signal == signal_name(sig)  # Python re-raises SIGINT after KeyboardInterrupt
    assert getattr(a, "root_cause") is None
    if sig == signal.SIGINT:
        assert getattr(a, "interrupted_at") is not None  # the KeyboardInterrupt line
    assert ending(run, a) == "killed"
    ws = observe(WatchState(), RunRecord.parse({"run_id": "r1", "name": "x", "state": "running"}), a, 3, (), (),
                 1000.0)
    ws = observe(ws, run, a, 9, (), (), 1001.0)
    ws = observe(ws, run, a, 9, (), (), 1002.0)
    assert [e.kind for e in ws.events] == ["killed"]
    assert ws.events[0].message.startswith(f"interrupted (by {signal_name(sig)})" if run.signal
                                           else "interrupted (exit")


def test_a_failure_before_the_interrupt_still_fails(tmp_path: Path) -> None:
    run, a = _interrupted(tmp_path, "fail-first", signal.SIGINT)
    root = getattr(a, "root_cause")
    assert root is not None and "illegal memory access" in root.line
    assert ending(run, a) == "failed"


def test_aborted_exit_130_and_echoes_after_the_interrupt() -> None:
    log = (b"INFO Model loading took 3.1 GiB and 8.0 seconds\n"
           b"(EngineCore pid=7) INFO 05-26 19:19:56 [core.py:1155] trigger received signal=SIGINT\n"
           b"Traceback (most recent call last):\n"
           b'  File "/srv/worker.py", line 9, in loop\n'
           b"RuntimeError: Engine core proc EngineCore died unexpectedly\n"
           b"Aborted!\n")
    r = inspect_log(log)
    assert r["root_cause"] is None  # the engine dying of the interrupt is its echo
    exited = RunRecord.parse({"run_id": "r1", "name": "x", "state": "exited", "exit_code": 130})
    assert ending(exited, None) == "killed"
    assert ending(RunRecord.parse({"run_id": "r1", "name": "x", "state": "exited", "exit_code": 1}), None) == "failed"
    # without an interrupt the same death is a failure
    assert inspect_log(log.replace(b"trigger received signal=SIGINT", b"ok"))["root_cause"] is not None


def test_the_ledger_summary_of_an_interrupted_run_is_killed(tmp_path: Path) -> None:
    """The banner's history (advice.summarize over inspect_log) agrees with the watch."""
    run, _ = _interrupted(tmp_path, "plain", signal.SIGINT)
    record = {"run_id": "r1", "state": "exited", "exit_code": run.exit_code, "signal": run.signal,
              "launched_at": 0.0, "ended_at": 10.0}
    summary = summarize(RunRecord.parse(record), inspect_log((tmp_path / "out.log").read_bytes()))
    assert summary.outcome == "killed"
    assert summarize(RunRecord.parse(dict(record, signal=None, exit_code=130)), inspect_log(b"")).outcome == "killed"
    assert summarize(RunRecord.parse(dict(record, signal=None, exit_code=1)), inspect_log(b"")).outcome == "failed"
