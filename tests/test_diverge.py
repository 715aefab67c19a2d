"""Divergence in any common phrasing, told from its look-alikes (issue 37), by the one fold
both sides run (remote/run/diverge.py): the host's pace (with no client) and the client's
analysis (``inspect --json``). Each case is a line as trainers print it; the real
excerpts with their sources are in the training corpus (tests/test_corpus_training.py).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from remote.run import diverge, pace
from tui.protocol.records import RunRecord
from tui.services.inspect import inspect_log
from tui.state.loganalysis.record import default_signatures

HF = "{{'loss': {}, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.1}}"


def verdict(lines: list[str]) -> dict | None:
    st = diverge.State()
    for i, line in enumerate(lines, 1):
        st = diverge.fold(st, line, i)
    return st.to_dict()


def client(lines: list[str]) -> dict:
    return inspect_log("\n".join(lines).encode())


@pytest.mark.parametrize("bad", [
    "{'loss': nan, 'grad_norm': 2.1, 'learning_rate': 1e-05}",
    "{'loss': 0.2051, 'grad_norm': nan, 'learning_rate': 4e-05, 'epoch': 0.01}",
    "Epoch 3:  12%|█▏        | 120/1000 [01:02<07:40,  1.91it/s, loss=nan, v_num=3]",
    "{'loss': tensor(nan, device='cuda:0', grad_fn=<AddBackward0>), 'acc': 0.5}",
    "iteration      120/   10000 | lm loss: nan | grad norm: inf | number of skipped iterations:   0 |",
    "step 12: kd_loss=inf ce_loss=2.31",
    "train/loss_step=-inf, lr=0.001",
    "[Epoch 2] training loss is nan",
])
def test_three_non_finite_metric_lines_in_a_row_diverge_in_every_spelling(bad: str) -> None:
    got = verdict(["{'loss': 2.0, 'grad_norm': 1.0}", bad, bad, bad])
    assert got is not None and got["id"] == "training-diverged" and got["line_no"] == 2
    assert verdict(["{'loss': 2.0}", bad, bad]) is None  # two are not yet a divergence


@pytest.mark.parametrize("line, sid", [
    ("Loss is nan, stopping training", "loss-nan-stopped"),
    ("Batch 212: Invalid loss, terminating training", "loss-nan-stopped"),
    ("RuntimeError: Rank 3: found NaN in local grad norm in backward pass before data-parallel "
     "communication collective. Device: 3, node: gpu-7", "loss-nan-stopped"),
    ("RuntimeError: Function 'LogSoftmaxBackward0' returned nan values in its 0th output.", "loss-nan-stopped"),
    ("Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 0.0", "loss-scale-underflow"),
    ("Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 0.5", "loss-scale-underflow"),
    ("Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.",
     "loss-scale-minimum"),
    ("FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding.",
     "loss-scale-minimum"),
])
def test_a_trainer_that_says_so_in_one_line_diverged(line: str, sid: str) -> None:
    got = verdict(["{'loss': 2.0}", line])
    assert got is not None and (got["id"], got["line_no"]) == (sid, 2), got
    r = client(["{'loss': 2.0}", line])
    assert r["root_cause"] is not None and r["root_cause"]["id"] == sid and r["failed_in"] == "training"
    assert r["diverged"]["id"] == sid and r["phase"] == "diverged"


def test_the_one_line_signatures_match_what_the_fold_calls_them() -> None:
    """The table's patterns (for the restart matcher at an attempt's end) say the same."""
    sigs = default_signatures()
    for line, sid in [("Loss is nan, stopping training", "loss-nan-stopped"),
                      ("Batch 3: Invalid loss, terminating training", "loss-nan-stopped"),
                      ("loss scaler 0 reducing loss scale to 0.0", "loss-scale-underflow")]:
        hit = sigs.match(line)
        assert hit is not None and hit[0].id == sid, line


OVER = ("[2024-03-01 10:00:00,000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! "
        "Rank {} Skipping step. Attempted loss scale: {}, reducing to {}")


def _overflows(n: int, ranks: int = 1) -> list[str]:
    out = []
    for i in range(n):
        scale = 2 ** (32 - i)
        out += [OVER.format(r, scale, scale // 2) for r in range(ranks)]
    return out


def test_skip_step_overflows_with_no_normal_step_between_diverge_after_the_window() -> None:
    assert diverge.OVERFLOW_STREAK == 32  # 2**32, the largest initial scale in use, halved to 1
    got = verdict(_overflows(diverge.OVERFLOW_STREAK))
    assert got is not None and got["id"] == "loss-scale-underflow" and got["line_no"] == 1
    assert verdict(_overflows(diverge.OVERFLOW_STREAK - 1)) is None
    # eight ranks print each skipped step: counted once per step, not once per rank
    assert verdict(_overflows(diverge.OVERFLOW_STREAK - 1, ranks=8)) is None
    assert verdict(_overflows(diverge.OVERFLOW_STREAK, ranks=8)) is not None


def test_overflows_that_recover_are_not_divergence() -> None:
    """fp16 start-up: a few overflows while the scale is found, then finite losses, again
    and again: each finite loss starts the count again."""
    lines = []
    for _ in range(10):
        lines += _overflows(8) + [HF.format("2.31")]
    assert verdict(lines) is None
    assert client(lines)["root_cause"] is None


@pytest.mark.parametrize("lines", [
    # NaN/inf in evaluation metrics only
    [HF.format("2.1"), "{'eval_loss': nan, 'eval_runtime': 12.3, 'epoch': 1.0}"] * 4,
    ["Epoch 1: val_loss=nan val/loss=inf test_loss: nan", "{'loss': 1.2}"] * 4,
    # warnings about NaN inputs, then finite losses
    ["UserWarning: NaN or Inf found in input tensor.", "Warning: NaN detected in inputs, skipping batch",
     HF.format("1.9")] * 4,
    # HF Trainer's closing summary (its train_loss is the run's mean)
    ["{'train_runtime': 10.0, 'train_samples_per_second': 1.0, 'train_loss': nan, 'epoch': 3.0}"] * 4,
])
def test_look_alikes_are_not_divergence(lines: list[str]) -> None:
    assert verdict(lines) is None
    r = client(lines)
    assert r["root_cause"] is None and r["diverged"] is None and r["phase"] != "diverged"


def test_a_recovered_nan_does_not_hide_a_later_divergence() -> None:
    """Recover, then diverge: the count starts again at each finite loss, so a later
    streak is told, quoting its own first line (issue 41's logtrain survivor)."""
    lines = [HF.format(x) for x in ("2.1", "nan", "nan", "2.0", "1.9", "nan", "1.8", "nan", "nan", "nan")]
    got = verdict(lines)
    assert got is not None and got["line_no"] == 8, got
    r = client(lines)
    assert r["root_cause"]["id"] == "training-diverged" and r["root_cause"]["line_no"] == 8
    # and the other way round: NaNs split by finite losses never add up to a streak
    split = [HF.format(x) for x in ("nan", "nan", "2.0", "nan", "2.0", "nan", "nan", "1.5")]
    assert verdict(split) is None and client(split)["root_cause"] is None


def test_the_regexes_are_linear_on_hostile_lines() -> None:
    """A long line of near-misses costs about what a short one does (a capped slice,
    no nested or adjacent overlapping quantifiers)."""
    hostile = ["loss" + "=" * 5000, "a" * 100_000 + " loss: nan", "loss: " + "9" * 100_000,
               "'loss': tensor(" * 5000, "reducing loss scale to " + "0" * 100_000,
               "overflow " * 20_000, ("x_loss: 1e" + "5" * 40 + " ") * 2000]
    for line in hostile:
        t = time.perf_counter()
        for _ in range(20):
            diverge.look(line)
        assert (time.perf_counter() - t) / 20 < 0.01, line[:40]
    for rx in diverge.PATTERNS:
        assert not re.search(r"\)[*+]|[*+]\)[*+?]", rx.pattern), rx.pattern  # no nested quantifier


def test_the_host_pace_enters_diverged_and_keeps_the_verdict(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    log.write_text("".join(HF.format(x) + "\n" for x in ("2.1", "2.0")))
    p = pace.Pace(str(log))
    p.update(100.0)
    assert p.phase == "training" and p.diverged is None
    with log.open("a") as f:
        f.write("".join(HF.format("nan") + "\n" for _ in range(3)) + HF.format("1.0") + "\n")
    p.update(200.0)
    assert p.phase == "diverged", p.phase
    assert p.diverged is not None and p.diverged["id"] == "training-diverged"
    assert p.diverged["at"] == 200.0 and p.diverged["line_no"] == 3
    rec = json.loads(json.dumps(p.record()))
    again = pace.Pace(str(log), rec)  # the shim's record read back: still diverged
    assert again.diverged == rec["diverged"]
    with log.open("a") as f:  # a restart's next attempt begins afresh
        f.write("[eagle3-tui] attempt 2/4 starts\n" + HF.format("2.2") + "\n")
    p.update(300.0)
    assert p.phase == "training" and p.diverged is None


# ---------------------------------------------------------------- watch, status --json, the dashboard

from tui.protocol.records import RunRecord  # noqa: E402
from tui.state import view  # noqa: E402
from tui.state.loganalysis import fold  # noqa: E402
from tui.state.model import AppState, LogTail  # noqa: E402
from tui.state.watch import WatchState, judge, observe  # noqa: E402

RUN = {"run_id": "20261205-210000-ab12", "name": "lr1e6", "state": "running"}


def test_watch_tells_a_divergence_once_and_not_again_as_the_runs_end() -> None:
    run = RunRecord.parse(RUN)
    a, ws = fold.LogAnalysis(), WatchState()
    for no, x in enumerate(("2.1", "nan", "nan", "nan", "nan"), 1):
        a = fold.step(a, HF.format(x), no)
        ws = observe(ws, run, a, no, (), (), 1000.0 + no)
    assert [e.kind for e in ws.events] == ["diverged"], ws.events
    ev = ws.events[0]
    assert ev.detail["id"] == "training-diverged" and "'loss': nan" in str(ev.detail["cause"])
    ended = RunRecord.parse(dict(RUN, state="exited", signal="SIGINT", exit_code=None))
    for t in (2000.0, 2001.0):
        ws = observe(ws, ended, a, 5, (), (), t)
    assert [e.kind for e in ws.events] == ["diverged"]  # the host's kill is the same news


def test_status_json_and_the_dashboard_say_diverged_from_the_hosts_pace() -> None:
    """No client watched: the pace's record alone says it (``status --json``'s ``watch``)."""
    verdict = {"id": "loss-scale-underflow", "why": "the loss scale fell to 0.0", "line_no": 9,
               "line": "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 0.0", "at": 1500.0}
    rec = dict(RUN, pace={"source": "shim", "phase": "diverged", "step_at": 1400.0, "step": "step 9",
                          "intervals": [1.0], "diverged": verdict})
    seen = judge(RunRecord.parse(rec), None, 1600.0)
    assert seen is not None and seen["condition"] == "diverged", seen
    assert seen["cause"] == verdict["line"] and seen["message"] == "diverged: the loss scale fell to 0.0"
    assert judge(RunRecord.parse(dict(rec, pace=dict(rec["pace"], diverged=None, phase="training"))), None, 1600.0)[  # type: ignore[index]
        "condition"] == "ok"
    state = AppState(runs=(RunRecord.parse(rec),), log=LogTail())
    assert view.phase(state, state.runs[0], 1600.0) == "diverged"


def test_a_divergence_alerts_like_a_failure() -> None:
    """The bell / desktop notification and the [notify] hook hear of it (the watch command
    prints every event; the notifier alerts on the kinds that need a human)."""
    from tui.services.notify import Notifier

    run = RunRecord.parse(RUN)
    a, ws = fold.LogAnalysis(), WatchState()
    for no, x in enumerate(("nan", "nan", "nan"), 1):
        a = fold.step(a, HF.format(x), no)
        ws = observe(ws, run, a, no, (), (), 1000.0 + no)
    said: list[str] = []
    Notifier(write=said.append, tmux=False).send_new(ws)
    assert len(said) == 1 and "diverged" in said[0], said
