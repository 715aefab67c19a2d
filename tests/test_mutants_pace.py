"""The shim's pace (remote/pace.py): survivors of issue 41's mutation sample."""

from __future__ import annotations

from pathlib import Path


def test_the_pace_thread_never_raises_when_its_run_dir_is_gone(tmp_path: Path) -> None:
    """The shim's pace thread shares the shim's stderr (the run's log): a failure of its
    own (the run dir removed under it, a full disk) ends the thread quietly, never with a
    traceback the log analysis would read as the run's failure."""
    import threading

    from remote import pace

    log = tmp_path / "output.log"
    log.write_text("step 1\n")
    stop = threading.Event()
    stop.set()
    assert pace.follow(str(tmp_path / "removed-run-dir"), str(log), stop, tick=0.01) is None
