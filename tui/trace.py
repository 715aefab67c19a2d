"""Start-up milestones with their wall-clock times, for `bench/bench_client.py`'s
breakdown of the first frame: written only when `EAGLE3_TUI_TRACE` names a file.

Each step is written once (its first time), as `EPOCH_SECONDS STEP` on its own line;
unset, `mark` is one dictionary lookup."""

from __future__ import annotations

import os
import time

_PATH = os.environ.get("EAGLE3_TUI_TRACE")
_done: set[str] = set()


def _started() -> float | None:
    """When this process started (Linux: /proc), as epoch seconds."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def mark(step: str) -> None:
    """Record that `step` happened now (only its first time)."""
    if _PATH is None or step in _done:
        return
    lines = []
    if not _done:
        started = _started()
        if started is not None:
            lines.append(f"{started:.4f} process started (imports follow)\n")
    _done.add(step)
    lines.append(f"{time.time():.4f} {step}\n")
    try:
        with open(_PATH, "a") as f:
            f.writelines(lines)
    except OSError:
        pass  # a trace is never worth failing for
