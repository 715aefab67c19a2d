"""extract.py's shared pieces: the fatal-error type, the progress-line formats, one
input sequence. Stdlib only (shipped with the agent's files; the job imports it)."""

from __future__ import annotations

import sys
from typing import List, Optional

PREFIX = "[extract]"
BAR_DESC = "Loading safetensors checkpoint shards"


class Fail(Exception):
    """A fatal problem: its message is the one line printed on stderr; `code` the exit."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def hms(seconds: float) -> str:
    """0:00:04 — elapsed/eta in the progress lines."""
    s = max(0, int(round(seconds)))
    return "%d:%02d:%02d" % (s // 3600, s // 60 % 60, s % 60)


def tqdm_interval(seconds: float) -> str:
    """MM:SS, or H:MM:SS past an hour — tqdm's format_interval, as vLLM's bar shows it."""
    s = max(0, int(seconds))
    h, m, sec = s // 3600, s // 60 % 60, s % 60
    return "%d:%02d:%02d" % (h, m, sec) if h else "%02d:%02d" % (m, sec)


def shard_bar(n: int, total: int, elapsed: float) -> str:
    """One line of vLLM's shard bar: `<desc>:  37% Completed | 24/64 [00:07<00:12,  3.21it/s]`."""
    pct = 100.0 * n / total if total else 100.0
    rate = n / elapsed if n and elapsed > 0 else None
    if rate is None:
        remaining, rate_s = "?", "?it/s"
    else:
        remaining = tqdm_interval((total - n) / rate)
        rate_s = "%5.2fs/it" % (1.0 / rate) if rate < 1.0 else "%5.2fit/s" % rate
    return "%s: %3.0f%% Completed | %d/%d [%s<%s, %s]" % (
        BAR_DESC, pct, n, total, tqdm_interval(elapsed), remaining, rate_s)


def say(line: str) -> None:
    """A progress line on stdout, flushed so a tailing log sees it at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def note(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class Sample:
    """One sequence: token ids and an optional loss mask (1 = train on this token)."""

    __slots__ = ("ids", "mask")

    def __init__(self, ids: List[int], mask: Optional[List[int]]) -> None:
        self.ids = ids
        self.mask = mask



def mask_of(s: Sample) -> List[int]:
    """The sample's loss mask; all ones when the input has none (as speculators writes)."""
    return s.mask if s.mask is not None else [1] * len(s.ids)
