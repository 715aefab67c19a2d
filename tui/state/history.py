"""The load from history: while a run loads, what the host's earlier loads of the same
command say (the run record's ``expected_load_s``, kept by the shim from
``remote/run/history.py``). Pure: the progress panel and ``runs show`` print these words.

Before the first shard is in, the only estimate is history's: "ETA ~19:40 from last
run". Once shards come, the run's own bar projects the load (time since the launch +
the bar's ETA) and the line says how that compares: "slower than last time (19:40):
~24:10". Within ``SAME`` of history it is "as last time".
"""

from __future__ import annotations

from typing import Any

from tui.protocol.records import RunRecord
from tui.state.format import duration

SAME = 0.10  # a projection within 10 % of history is "as last time"
LOADING = (None, "starting", "loading")


def basis(n: int) -> str:
    return "from last run" if n <= 1 else f"from the last {n} runs"


def load_line(run: RunRecord | None, shards: list[Any], phase: str | None, now: float) -> str | None:
    """The progress panel's history line for a live run that is still loading (``shards``:
    the log's shard bars, ``now`` on the host's clock); None when there is no history or
    the load is over."""
    if run is None or not run.alive or run.expected_load_s is None or run.launched_at is None:
        return None
    if phase not in LOADING:
        return None
    expected, elapsed = run.expected_load_s, max(0.0, now - run.launched_at)
    under_way = [sp for sp in shards if sp.total and sp.done >= 1]
    if not under_way:
        left = expected - elapsed
        if left >= 0:
            return f"ETA ~{duration(left)} {basis(len(run.expected_load_runs))} (its load took {duration(expected)})"
        return f"slower than last time ({duration(expected)}): {duration(elapsed)} so far"
    left_s = [_left(sp) for sp in under_way]
    if any(v is None for v in left_s):
        return f"under way; last time the load took {duration(expected)}"
    projected = elapsed + max(v for v in left_s if v is not None)
    if projected > expected * (1 + SAME):
        word = "slower than last time"
    elif projected < expected * (1 - SAME):
        word = "faster than last time"
    else:
        word = "as last time"
    return f"{word} ({duration(expected)}): ~{duration(projected)}"


def _left(sp: Any) -> float | None:
    """Seconds left on one shard bar: its own ETA, else from its rate."""
    if sp.done >= sp.total:
        return 0.0
    if sp.remaining_s is not None:
        return float(sp.remaining_s)
    if sp.rate_it_s:
        return float((sp.total - sp.done) / sp.rate_it_s)
    return None
