"""Human formatting of readings, shared by the CLI and the widgets. Pure.

Every formatter shows a missing reading (None, or not a number) as N/A, never as 0.
"""

from __future__ import annotations

from typing import Any

NA = "N/A"
DAY = 86400


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def duration(seconds: Any) -> str:
    """How long, the way `kubectl get` (`duration.HumanDuration`), k9s and `docker ps`
    print ages: seconds only while young, so a clock on screen moves once a second for its
    first ten minutes, then once a minute, then less often.

    `42s` · `5m12s` under 10 min (`5m` on the minute) · `37m` under 3 h · `5h12m` under
    8 h · `17h` under 2 days · `3d4h` under 8 days · `12d`. Under 10 s a fraction keeps
    one decimal (`1.5s`: a delay, not a clock that ticks). A second of clock skew
    between host and client reads `0s`; more, or NaN, or beyond a century, is N/A."""
    if not _is_num(seconds) or not -2 < seconds < 100 * 365 * DAY:  # NaN compares false
        return NA
    if seconds < 10 and seconds != int(seconds) and seconds > 0:
        return f"{seconds:.1f}".rstrip("0").rstrip(".") + "s"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    m, h, d = s // 60, s // 3600, s // DAY
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    return f"{d}d"


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
