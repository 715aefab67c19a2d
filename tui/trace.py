"""Start-up milestones with their wall-clock times, for `bench/bench_client.py`'s
breakdown of the first frame: written only when `EAGLE3_TUI_TRACE` names a file.

Each step is written once (its first time), as `EPOCH_SECONDS STEP` on its own line;
unset, `mark` is one dictionary lookup."""

from __future__ import annotations

import os
import time

_PATH = os.environ.get("EAGLE3_TUI_TRACE")
_done: set[str] = set()


def mark(step: str) -> None:
    """Record that `step` happened now (only its first time)."""
    if _PATH is None or step in _done:
        return
    _done.add(step)
    try:
        with open(_PATH, "a") as f:
            f.write(f"{time.time():.4f} {step}\n")
    except OSError:
        pass  # a trace is never worth failing for
