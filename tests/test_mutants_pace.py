"""The shim's pace (remote/run/pace.py): survivors of issue 41's mutation sample."""

from __future__ import annotations

from pathlib import Path


def test_the_pace_thread_never_raises_when_its_run_dir_is_gone(tmp_path: Path) -> None:
    """The shim's pace thread shares the shim's stderr (the run's log): a failure of its
    own (the run dir removed under it, a full disk) ends the thread quietly, never with a
    traceback the log analysis would read as the run's failure."""
    import threading

    from remote.run import pace

    log = tmp_path / "output.log"
    log.write_text("step 1\n")
    stop = threading.Event()
    stop.set()
    assert pace.follow(str(tmp_path / "removed-run-dir"), str(log), stop, tick=0.01) is None


def test_a_divergence_in_the_logs_last_line_is_told_at_once(tmp_path: Path) -> None:
    """A trainer that prints its third NaN loss and then prints nothing more (stopped by
    its own check, or hung): the host's pace calls the run diverged from that line, not
    from a next line that never comes, so on_diverge = "kill" acts on it."""
    from remote.run import pace
    from tests.test_diverge import HF

    log = tmp_path / "out.log"
    log.write_text("".join(HF.format(x) + "\n" for x in ("2.1", "2.0", "nan", "nan", "nan")))
    p = pace.Pace(str(log))
    p.update(100.0)
    assert p.phase == "diverged", p.phase
    assert p.diverged is not None and p.diverged["id"] == "training-diverged" and p.diverged["at"] == 100.0
