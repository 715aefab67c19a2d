"""A periodic snapshot carries only the run records that changed since the last one.

A host keeps every run it ran: with 30 finished runs a snapshot was 22 KB, sent, parsed
and drawn again each second for records that never change again (client and agent
0.25 % of a core each, idle; 5 MB/s for a fleet of 256 such hosts). So the periodic
snapshot names every run in `run_ids`, in order, and holds in `runs` only the records
that are new or differ from the ones the last periodic snapshot sent; the client keeps
the rest (tui/state/reducer.py). `configure`'s snapshot, the first of a connection, and
the `snapshot` op's reply are whole. Standard library only (Python 3.9+)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional


class RunsSent:
    """The records the last periodic snapshot sent, by run id."""

    def __init__(self) -> None:
        self.sent: Optional[Dict[str, Any]] = None  # None: the next snapshot goes whole

    def reset(self) -> None:
        self.sent = None

    def trim(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        """`msg` with `runs` cut to the changed records and `run_ids` added; whole when
        there is nothing to compare with, or the runs are not one record per str id."""
        runs = msg.get("runs")
        ids: List[Any] = [r.get("run_id") if isinstance(r, dict) else None for r in runs] \
            if isinstance(runs, list) else []
        if not isinstance(runs, list) or not all(isinstance(i, str) for i in ids) or len(set(ids)) < len(ids):
            self.sent = None
            return msg
        before, self.sent = self.sent, dict(zip(ids, runs))
        if before is not None:
            msg["runs"] = [r for i, r in zip(ids, runs) if before.get(i) != r]
            msg["run_ids"] = ids
        return msg
