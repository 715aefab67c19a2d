"""Score the training-log analysis on real excerpts from public issue threads (issue 28).

``tests/fixtures/logs/training/dev/`` and ``…/heldout/`` hold excerpts copied verbatim
from HF Trainer, Lightning, torchtune, DeepSpeed, Megatron, NeMo, torchrun, mmengine and
other threads (sources in each ``expected.toml``), with what a human reading each one
concludes, written before the training parser existed. This runs ``eagle3-tui inspect``'s
analysis on each and prints, per set, the fraction right on training progress
(step/total), latest loss, failed-or-not, phase and cause. The dev set is what the parser
was tuned on (goal: ≥ 90 % on progress, failed and cause, ≥ 85 % on loss); the held-out
set never is: its misses are pinned in ``KNOWN_MISSES`` with their reason, so a new miss
fails, and so does a listed miss that now passes.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # the client supports 3.10, where tomli is the same parser
    import tomli as tomllib

from tui.services.inspect import inspect_log

ROOT = Path(__file__).parent / "fixtures" / "logs" / "training"
ASPECTS = ("progress", "loss", "failed", "phase", "cause")
GOALS = {"progress": 0.90, "loss": 0.85, "failed": 0.90, "phase": 0.85, "cause": 0.90}

# (file, aspect) -> why the parser gets it wrong (diagnosed after scoring; not tuned away)
KNOWN_MISSES: dict[tuple[str, str], str] = {
    ("trlx342_rl_bar_desc_losses_overflow.log", "loss"):
        "the bar's description is itself in brackets ('[losses/total_loss: 4.35 | …]:'), and "
        "the description is cut at the last ']' before the bar",
}


def _entries(folder: Path) -> list[dict[str, Any]]:
    return list(tomllib.loads((folder / "expected.toml").read_text())["log"])


def _loss_ok(want: Any, got: Any) -> bool:
    if want is None or got is None:
        return want is None and got is None
    if isinstance(want, str) or isinstance(got, str):
        return str(want) == str(got)
    return math.isclose(float(want), float(got), rel_tol=1e-3, abs_tol=1e-9)


def score(entry: dict[str, Any], folder: Path) -> dict[str, tuple[bool, str]]:
    """Per aspect: (right?, what the analysis said)."""
    r = inspect_log((folder / entry["file"]).read_bytes())
    tr = r["train"] or {}
    got_prog = [tr.get("step"), tr.get("total")]
    want_prog = [entry.get("step"), entry.get("total")]
    failed = r["root_cause"] is not None
    phase = r["failed_in"] if failed else r["phase"]
    line = r["root_cause"]["line"] if failed else None
    want_cause = entry.get("cause")
    cause_ok = (line is None) if want_cause is None else (line is not None and want_cause in line)
    return {
        "progress": (got_prog == want_prog, str(got_prog)),
        "loss": (_loss_ok(entry.get("loss"), tr.get("loss")), repr(tr.get("loss"))),
        "failed": (failed == entry["failed"], str(failed)),
        "phase": ("phase" not in entry or phase == entry["phase"], str(phase)),
        "cause": (cause_ok, repr(line)),
    }


def _fractions(folder: Path, label: str) -> tuple[dict[str, float], dict[tuple[str, str], str]]:
    entries = _entries(folder)
    right = dict.fromkeys(ASPECTS, 0)
    misses: dict[tuple[str, str], str] = {}
    for e in entries:
        for aspect, (ok, got) in score(e, folder).items():
            right[aspect] += ok
            if not ok:
                misses[(e["file"], aspect)] = got
    n = len(entries)
    print(f"\n{label} ({n} real training excerpts): "
          + ", ".join(f"{k} {right[k]}/{n} ({right[k] / n:.0%})" for k in ASPECTS))
    for (f, aspect), got in misses.items():
        print(f"  {f}: {aspect} got {got}")
    return {k: right[k] / n for k in ASPECTS}, misses


@pytest.mark.parametrize("part", ["dev", "heldout"])
def test_training_corpus_is_complete(part: str) -> None:
    folder = ROOT / part
    entries = _entries(folder)
    assert {e["file"] for e in entries} == {p.name for p in folder.glob("*.log")}
    assert len(entries) >= 15
    for e in entries:
        assert e["source"].startswith("https://github.com/"), e["file"]
        assert e["failed"] == ("cause" in e), e["file"]
        assert "total" not in e or "step" in e, e["file"]


def test_training_corpus_dev(capsys: Any) -> None:
    with capsys.disabled():
        fractions, misses = _fractions(ROOT / "dev", "training dev set")
    assert all(fractions[k] >= GOALS[k] for k in ASPECTS), (fractions, misses)


def test_training_corpus_heldout(capsys: Any) -> None:
    with capsys.disabled():
        _, misses = _fractions(ROOT / "heldout", "training held-out set")
    assert set(misses) == set(KNOWN_MISSES), misses
