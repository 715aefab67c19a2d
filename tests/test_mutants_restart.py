"""The host's restart decision reads a log the way the client does (issue 41's sample of
remote/run/restartpolicy.py): what the user stopped and what a logger marks as a mere
warning are no failure to restart for, on either side, in every prefix shape."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from remote.run.restartpolicy import Matcher, decide
from tests.test_restart import OOM, POLICY, WATCHDOG, _both

# One quiet-level line in each prefix shape a launcher or logger puts before the text.
QUIET_SHAPES = [
    "2025-03-21 02:07:08,408 - trainer - WARNING - {}",  # Python logging's " - name - LEVEL - "
    "2025-03-21 02:07:08,408 - trainer - INFO - {}",
    "[warning] {}",  # a bracketed level
    "[W106 12:41:43.88 ProcessGroupNCCL.cpp:1553] {}",  # glog
    "WARNING 12 [trainer.py:88] {}",  # a level before [file:line]
    # the same behind a vLLM worker's prefix
    "(Worker_TP0 pid=12) - trainer - WARNING - {}",
    "(Worker_TP0 pid=12) [warning] {}",
    "(Worker_TP0 pid=12) WARNING 12 [trainer.py:88] {}",
]


@pytest.mark.parametrize("shape", QUIET_SHAPES)
def test_a_failure_quoted_at_a_quiet_level_is_no_cause_on_either_side(shape: str) -> None:
    """A warning that quotes an OOM (a retry, a fallback that worked) is not why a run
    died: with nothing else in the log neither side names a cause, and a real failure
    after it is the cause on both."""
    line = shape.format(OOM)
    assert _both([line]) == (None, None), line
    assert _both([line, WATCHDOG]) == ("nccl-timeout", "nccl-timeout"), line


def test_what_dies_after_the_users_interrupt_is_not_restarted() -> None:
    """Ctrl-C (or a SIGINT the user sent) ends a run with a KeyboardInterrupt, and the
    ranks it leaves behind then fail on their own (an OOM, a watchdog): that is no
    failure to restart for. A failure *before* the interrupt is still the cause."""
    after = ["Traceback (most recent call last):", "KeyboardInterrupt", OOM]
    assert _both(after) == (None, None)
    cause = Matcher(POLICY).root_cause(after)
    assert decide(POLICY, [], {"exit_code": 130, "cause": cause, "ended_at": 0.0}, 0.0)[0] is False
    assert _both([WATCHDOG, "KeyboardInterrupt", OOM]) == ("nccl-timeout", "nccl-timeout")


def test_the_decision_and_its_words_never_disagree() -> None:
    """What the user reads ("gave up", "not restarted", "restarting") is what the
    host does: a run that used its max_restarts, hit the thrash guard or was stopped
    is not started again, whatever the words; only "restarting" restarts."""
    now = 1000.0
    nccl = {"id": "nccl-timeout", "title": "NCCL collective timed out", "class": "transient"}
    other = {"id": "python-traceback", "title": "Python exception", "class": "unclassified"}

    def end(cause: dict | None, **kw: object) -> dict:
        return {"exit_code": 1, "cause": cause, "progress": {"batch": kw.pop("batch", None)},
                "ended_at": now - 5000, **kw}

    cases = [
        (POLICY, [], end(nccl)),
        (POLICY, [end(nccl, restarted=True) for _ in range(3)], end(nccl)),  # max_restarts = 3
        (dict(POLICY, max_restarts=1), [end(nccl, restarted=True)], end(nccl)),
        (dict(POLICY, max_restarts=0), [], end(nccl)),
        (dict(POLICY, thrash_failures=2), [end(nccl, ended_at=now - 1)], end(nccl)),  # thrash guard
        (POLICY, [], end(other, batch=3)),
        (POLICY, [end(other, batch=3, restarted=True)], end(other, batch=3)),  # no progress
        (POLICY, [], end(nccl, killed=True)),
        (POLICY, [], end(nccl, diverged=True)),
        (POLICY, [], end(nccl, stopped="idle")),
        (POLICY, [], {"exit_code": 0, "cause": None}),
        (dict(POLICY, on_hang="kill"), [], end(None, hung=True)),
        (dict(POLICY, on_hang="restart"), [], end(None, hung=True)),
    ]
    seen = set()
    for policy, attempts, ended in cases:
        restarted, why = decide(policy, attempts, ended, now)
        assert restarted == why.startswith("restarting: "), (why, ended)
        seen.add(why.split(":")[0].split(" (")[0])
    assert {"restarting", "gave up", "not restarted", "killed", "diverged", "idle", "finished",
            "hung"} <= seen, seen


NAN = "{'loss': nan, 'grad_norm': 2.1, 'learning_rate': 1e-05}"


def test_a_divergence_after_a_specific_failure_leaves_that_failure_the_cause() -> None:
    """An OOM, then NaN losses from the ranks still printing: the OOM came first and is
    specific, so it stays the cause on both sides (not restarted: deterministic); a
    divergence alone is the cause of its own."""
    streak = [NAN] * 4
    assert _both([OOM, *streak]) == ("cuda-oom", "cuda-oom")
    assert _both(streak) == ("training-diverged", "training-diverged")
    assert _both([*streak, OOM]) == ("training-diverged", "training-diverged")


@pytest.mark.parametrize("first", ["ValueError: boom",
                                   "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "])
def test_a_catch_all_then_a_divergence_is_named_alike_on_both_sides(first: str) -> None:
    """A catch-all or wrapper failure the run lived on after, then a NaN streak: the
    divergence is the cause on both sides (the host's watch stops the run for it; the
    dashboard must not name the earlier line)."""
    assert _both([first, *[NAN] * 4]) == ("training-diverged", "training-diverged")
    before_the_streak = "python-traceback" if "Value" in first else "torchrun-child-failed"
    assert _both([first, NAN, NAN]) == (before_the_streak, before_the_streak)


def test_on_idle_waits_for_the_log_to_be_quiet_too(tmp_path: Path) -> None:
    """on_idle stops an attempt only when its GPUs hold memory at ~0 % *and* its log and
    CPU have been quiet for idle_s: a run still printing (a data loader's "waiting for
    shards…") is not waste yet. The host's judgement over the shim's real pace record."""
    import time

    from remote.run import pace
    from remote.run.restart import Supervisor

    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    policy = dict(POLICY, on_idle="kill", idle_s=30.0)
    sup = Supervisor(str(run_dir), {"restart": policy, "cwd": str(tmp_path), "argv": ["true"]})
    now = time.time()
    base = {"idle_since": now - 300, "phase": "loaded", "held": 30 * 2**30, "gpu": "1 card, 0 %"}

    def judged(**kw: object) -> str | None:
        pace.save(str(run_dir), dict(base, **kw))
        verdict = sup._judge(started=now - 600)
        return verdict and verdict[0]

    assert judged(grew_at=now - 2) is None  # the log printed 2 s ago
    assert judged(grew_at=now - 300) == "idle"
    assert judged(grew_at=None) == "idle"  # a run that never printed a line
    assert judged(grew_at=now - 300, held=0) is None  # no GPU memory held: not GPU waste


def test_a_run_that_finishes_has_no_cause_in_its_record(tmp_path: Path) -> None:
    """An attempt that exits 0 finished, whatever its log quoted on the way (a handled
    OOM its trainer retried at a smaller batch): the record the dashboard and `runs show`
    read names no cause for it, and its log is the job's own output. Real run, real shim
    and supervisor."""
    from remote.run import launch as launcher
    from tests.test_restart import FAST, _ended, _policy

    runs = str(tmp_path / "runs")
    job = "print(%r, flush=True)\nprint('retrying at batch size 4', flush=True)\n" % OOM
    rec = launcher.launch(runs, "ok", [sys.executable, "-c", job], str(tmp_path), {}, restart=_policy(FAST))
    ended = _ended(runs, rec["run_id"])
    assert (ended["state"], ended["exit_code"], ended["restarts"]) == ("exited", 0, 0), ended
    (only,) = ended["attempts"]
    assert only["why"] == "finished" and only["cause"] is None, only
    # a run that finished at its first attempt keeps its own output alone: no supervisor line
    assert Path(ended["log"]).read_text() == "%s\nretrying at batch size 4\n" % OOM


def test_an_attempts_record_that_cannot_be_written_never_ends_the_run(tmp_path: Path) -> None:
    """attempts.json is the supervisor's note for the dashboard; when it cannot be
    written (a full disk, a name taken by a directory) the run goes on and its exit is
    still recorded by the shim: saving says nothing and raises nothing."""
    from remote.run.restart import ATTEMPTS_FILE, Supervisor

    run_dir = tmp_path / "run"
    (run_dir / ATTEMPTS_FILE / "taken").mkdir(parents=True)  # rename onto it fails (EISDIR)
    sup = Supervisor(str(run_dir), {"restart": POLICY, "cwd": str(tmp_path), "argv": ["true"]})
    sup.attempts.append({"n": 1, "started_at": 0.0})
    sup.save(restart_at=5.0, note="restarting")
    assert (run_dir / ATTEMPTS_FILE).is_dir()

