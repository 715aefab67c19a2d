"""A kill's verdict when the run does not die (issue 41): never "ok" while any process
of the run lives, whatever the GPU source says -- none, a failing one, or one that
reads the cards as free.

A process that outlives SIGKILL is real (a worker in uninterruptible sleep on a hung
NFS mount or a wedged GPU driver: the signal is delivered, the process stays). Here no
process can be put in that state on purpose, so the kill's signal primitive is replaced
by one that delivers nothing and says it did: the run's real processes stay alive, as
they would in D state, and everything else (finding them, waiting, the GPU proof, the
record) is the real kill's.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from remote.base import procfs
from remote.run import kill as killer
from remote.run import runner

SLEEPER = "import time\nwhile True:\n    time.sleep(0.05)\n"


def _alive(pid: int, ticks: int) -> bool:
    st = procfs.read_stat(pid)
    return st is not None and st["state"] not in ("Z", "X") and st["start_ticks"] == ticks


def _broken() -> list[dict]:
    raise RuntimeError("NVML_ERROR_GPU_IS_LOST")


def _free() -> list[dict]:  # the source reads every card as free (the run holds none it can see)
    return [{"index": 0, "mem_used": 0, "mem_total": 80 * 2**30, "processes": []}]


SOURCES: dict[str, Callable[[], list[dict]] | None] = {"none": None, "failing": _broken, "free cards": _free}


@pytest.mark.parametrize("source", list(SOURCES))
def test_a_run_that_outlives_every_signal_is_never_reported_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   source: str) -> None:
    runs = str(tmp_path / "runs")
    rec = runner.launch(runs, "stuck", [sys.executable, "-c", SLEEPER], str(tmp_path), {})
    sent: list[tuple[int, int]] = []

    def undelivered(pid: int, ticks: int, sig: int) -> bool:  # D state: taken, never acted on
        sent.append((pid, sig))
        return procfs.read_stat(pid) is not None

    monkeypatch.setattr(killer, "_send", undelivered)
    monkeypatch.setattr(killer, "KILL_WAIT", 0.3)
    try:
        report = killer.kill(runs, rec["run_id"], graces=(0.2, 0.2), gpu_wait=0.3, gpu_query=SOURCES[source])
        assert _alive(rec["pid"], rec["start_ticks"])  # the stand-in held: the run is still there
        assert [s["signal"] for s in report["stages"]] == ["SIGINT", "SIGTERM", "SIGKILL"], report
        assert report["ok"] is False, report
        assert rec["pid"] in report["remaining"], report
        # what `runs` and a later dashboard read: the record says the same
        killed = json.loads((Path(runs) / rec["run_id"] / "killed.json").read_text())
        assert killed["ok"] is False and rec["pid"] in killed["remaining"], killed
    finally:
        monkeypatch.undo()
        for pgid in {os.getpgid(p) for p, _ in sent if procfs.read_stat(p) is not None}:
            os.killpg(pgid, signal.SIGKILL)


def test_a_run_that_dies_is_ok_with_no_gpu_source(tmp_path: Path) -> None:
    """The other side of the verdict: no GPU source is no reason to say "failed"."""
    runs = str(tmp_path / "runs")
    rec = runner.launch(runs, "svc", [sys.executable, "-c", SLEEPER], str(tmp_path), {})
    report = killer.kill(runs, rec["run_id"], graces=(0.5, 0.5), gpu_wait=0)
    assert report["ok"] is True and report["remaining"] == [] and report["gpus_free"] is None, report
    assert not _alive(rec["pid"], rec["start_ticks"])
