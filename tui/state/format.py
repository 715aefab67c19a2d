"""Human formatting of readings, shared by the CLI and the widgets. Pure.

Every formatter shows a missing reading (None, or not a number) as N/A, never as 0.
"""

from __future__ import annotations

from typing import Any

NA = "N/A"


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def duration(seconds: Any) -> str:
    """`MM:SS`, or `H:MM:SS` from an hour on."""
    if not _is_num(seconds) or seconds < 0:
        return NA
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def size(n: Any) -> str:
    """Bytes as `1.5 GiB` or `300 MiB`."""
    if not _is_num(n):
        return NA
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.0f} MiB"


def gib(n: Any, digits: int = 1) -> str:
    """Bytes as a bare number of GiB (the unit is in a column header)."""
    return f"{n / 2**30:.{digits}f}" if _is_num(n) else NA


def num(value: Any, fmt: str = "{}") -> str:
    return fmt.format(value) if _is_num(value) else NA
