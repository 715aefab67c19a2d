"""Every log fixture's full result, pinned: a change in what the analysis concludes on
any excerpt -- failed or not, phase, stage, root cause (id, line number), every failure
reported, shard and extract progress, the summary -- fails here, even where the scored
corpora's fractions would not move.

The pins are tests/fixtures/pinned_results.json. After a deliberate change, rewrite them
with `EAGLE3_PIN_UPDATE=1 pytest tests/test_corpus_pinned.py`, read the diff, and say in
the commit why each changed result is right.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tui.services.inspect import inspect_log

FIXTURES = Path(__file__).parent / "fixtures"
PINS = FIXTURES / "pinned_results.json"


def pinned_view(r: dict[str, Any]) -> dict[str, Any]:
    """The parts of an analysis a user sees (timestamps and rates left out: they are
    computed, not concluded)."""
    sh, ex, cause = r["shards"], r["extract"], r["root_cause"]
    return {
        "phase": r["phase"], "stage": r["stage"], "failed_in": r["failed_in"],
        "failed_stage": r["failed_stage"], "summary": r["summary"],
        "shards": [sh["done"], sh["total"], sh["worker"]] if sh else None,
        "extract": ex,
        "failures": [[f["id"], f["line_no"]] for f in r["failures"]],
        "root_cause": [cause["id"], cause["line_no"], cause["line"]] if cause else None,
        "loaded_at_line": r["loaded_at_line"], "lines": r["lines"],
        "train": r.get("train"),
    }


def current() -> dict[str, Any]:
    return {str(p.relative_to(FIXTURES)): pinned_view(inspect_log(p.read_bytes()))
            for p in sorted(FIXTURES.rglob("*.log"))}


def test_every_fixture_result_is_as_pinned() -> None:
    now = json.loads(json.dumps(current()))  # tuples as lists, as in the file
    if os.environ.get("EAGLE3_PIN_UPDATE"):
        PINS.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
    pins = json.loads(PINS.read_text())
    assert set(now) == set(pins), f"fixtures without a pin or pins without a fixture: {set(now) ^ set(pins)}"
    changed = {name: {k: (pins[name].get(k), v) for k, v in got.items() if pins[name].get(k) != v}
               for name, got in now.items() if got != pins[name]}
    assert not changed, "results changed (pinned, now):\n" + "\n".join(
        f"  {name}: {diff}" for name, diff in changed.items())
