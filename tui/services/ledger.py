"""The run ledger: summaries of ended runs, read from their logs through the agent.

``fetch_summaries`` reads the tail of each ended run's log with the agent's
``read_range`` op, analyses it with ``tui.services.inspect.inspect_log`` (in a worker thread,
so a 2 MiB log does not stall the event loop) and condenses it with
``tui.state.advice.summarize``. An ended run never changes, so its summary is cached
(a log the agent reports as gone is cached as "nothing to say", a lost link is not).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from tui.protocol.records import RunRecord
from tui.services.inspect import inspect_log
from tui.state.advice import RunSummary, summarize
from tui.transport import AgentApi, AgentRequestError

__all__ = ["ENDED", "LedgerError", "fetch_summaries", "read_tail"]

ENDED = frozenset({"exited", "killed", "lost", "failed"})
# The agent allows 4 MiB per read_range, but the answer is one JSON line of ~4/3 that
# in base64, and LocalLink reads lines of at most 4 MiB: a full 4 MiB read kills the
# link. 2 MiB (~2.7 MiB of base64) stays clear of it.
READ_CHUNK = 2 * 1024 * 1024
CACHE_MAX = 512  # entries kept in the default cache

_CACHE: dict[tuple[str, str, Any], RunSummary | None] = {}


class LedgerError(Exception):
    """A log that could not be read consistently; `str()` is one line."""


async def read_span(client: AgentApi, path: str, start: int, end: int, inode: int | None) -> bytes:
    """Bytes ``[start, end)`` of ``path`` in ``READ_CHUNK`` reads; shorter if the file was
    truncated under us. Raises the client's errors, or LedgerError when the file is no
    longer inode ``inode``."""
    parts: list[bytes] = []
    offset = start
    while offset < end:
        r = await client.read_range(path, offset, min(READ_CHUNK, end - offset))
        if r.inode != inode:
            raise LedgerError(f"{path} was replaced while being read")
        data = r.data
        if not data:  # truncated under us: keep what we have
            break
        parts.append(data)
        offset += len(data)
    return b"".join(parts)


async def read_tail(client: AgentApi, path: str, tail_bytes: int) -> tuple[bytes, bool]:
    """The last ``tail_bytes`` of ``path`` (from the first line break when cut) and
    whether that is the whole file. Raises the client's errors, or LedgerError when
    the file changes identity while being read."""
    probe = await client.read_range(path, 0, 0)
    size, inode = probe.size, probe.inode
    start = max(0, size - max(0, tail_bytes))
    data = await read_span(client, path, start, size, inode)
    if start > 0:
        # the first line is cut; drop it so line-level patterns see whole lines only
        cut = data.find(b"\n")
        data = data[cut + 1:] if cut >= 0 else b""
    return data, start == 0


def _key(run: RunRecord) -> tuple[str, str, Any]:
    return (run.run_id, str(run.log), run.ended_at)


async def _summary(client: AgentApi, run: RunRecord, tail_bytes: int) -> RunSummary:
    data, whole = await read_tail(client, str(run.log), tail_bytes)
    result = await asyncio.to_thread(inspect_log, data)
    return summarize(run, result, whole=whole)


async def fetch_summaries(client: AgentApi, runs: Iterable[RunRecord], limit: int = 10,
                          tail_bytes: int = 2 * 1024 * 1024,
                          cache: dict[tuple[str, str, Any], RunSummary | None] | None = None,
                          ) -> dict[str, RunSummary]:
    """Summaries of the ``limit`` newest ended runs that have a log, by run_id.

    ``runs``: the host's run records (``AppState.runs``).
    A run whose log cannot be read is left out; this never raises for one run.
    ``cache`` defaults to a module-wide one; pass a dict to keep hosts apart.
    """
    store = _CACHE if cache is None else cache
    ended = [r for r in runs if r.state in ENDED and r.log]
    ended.sort(key=lambda r: (r.launched_at or 0.0, r.run_id), reverse=True)
    out: dict[str, RunSummary] = {}
    for run in ended[:max(0, limit)]:
        key = _key(run)
        if key not in store:
            try:
                store[key] = await _summary(client, run, tail_bytes)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - one bad log must not hide the others
                if _permanent(exc):
                    store[key] = None
                continue
            if cache is None and len(store) > CACHE_MAX:
                del store[next(iter(store))]  # oldest insertion first
        summary = store[key]
        if summary is not None:
            out[run.run_id] = summary
    return out


def _permanent(exc: Exception) -> bool:
    """The agent answered (the log is gone, unreadable): asking again will not help.
    A lost link or a timeout may heal, so those are retried next time."""
    return isinstance(exc, (AgentRequestError, LedgerError, ValueError, KeyError))
