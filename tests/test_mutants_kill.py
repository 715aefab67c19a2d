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
import subprocess
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


def test_a_card_the_run_never_used_hides_none_the_run_still_holds(tmp_path: Path) -> None:
    """GPU-free proof on a multi-GPU host: a card the run never touched (a stranger's
    job on it) listed before the card where a process of the run still holds memory
    after the kill (a driver that frees late, a process the GPU source lists after its
    end). The kill must still name that card and never say the GPUs are free."""
    runs = str(tmp_path / "runs")
    rec = runner.launch(runs, "multi", [sys.executable, "-c", SLEEPER], str(tmp_path), {})
    stranger = {"pid": 4242424, "mem": 5 * 2**30}

    def cards() -> list[dict]:
        return [{"index": 0, "processes": [stranger]}, {"index": 1, "processes": []},
                {"index": 2, "processes": [{"pid": rec["pid"], "mem": 7 * 2**30}]}]

    report = killer.kill(runs, rec["run_id"], graces=(0.5, 0.5), gpu_wait=0.3, gpu_query=cards)
    assert not _alive(rec["pid"], rec["start_ticks"])
    assert report["gpus_free"] is False and report["ok"] is False, report
    assert [(g["index"], g["run_pids"]) for g in report["gpus"]] == [(2, [rec["pid"]])], report


def test_a_manifest_of_another_boot_signals_no_one_its_numbers_name_now(tmp_path: Path) -> None:
    """After a reboot a run's recorded pid, start ticks, session and group may name
    someone else's processes (pids and ticks restart from zero). A kill of that run
    finds it by its marker alone and signals none of them, even when every recorded
    number matches a live process exactly."""
    runs = tmp_path / "runs"
    anchor = runner.launch(str(runs), "anchor", [sys.executable, "-c", SLEEPER], str(tmp_path), {})
    killer.kill(str(runs), anchor["run_id"], graces=(0.5, 0.5), gpu_wait=0)
    stranger = subprocess.Popen([sys.executable, "-c", SLEEPER], start_new_session=True)
    try:
        st = procfs.read_stat(stranger.pid)
        assert st is not None
        run_dir = runs / "20250101-000000-boot"
        run_dir.mkdir(mode=0o700)
        manifest = {"pid": stranger.pid, "start_ticks": st["start_ticks"], "pgid": st["pgid"],
                    "sid": st["sid"], "shim_pid": stranger.pid, "shim_start_ticks": st["start_ticks"],
                    "boot_id": "a-boot-before-this-one", "boot_time": procfs.boot_time() - 86400,
                    "argv": ["x"], "name": "old"}
        (run_dir / "manifest.json").write_text(json.dumps(manifest))
        report = killer.kill(str(runs), run_dir.name, graces=(0.2, 0.2), gpu_wait=0)
        assert report["stages"] == [], report
        assert _alive(stranger.pid, st["start_ticks"]) and procfs.read_stat(stranger.pid)["state"] != "T"
    finally:
        stranger.kill()
        stranger.wait()
