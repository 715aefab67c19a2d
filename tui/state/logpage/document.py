"""A remote log file read on demand: an LRU of byte blocks plus a sparse line index.

Pure (no Textual). The bytes live on the host and arrive through an async ``fetch``
(``read_range`` of the agent protocol), so nothing here ever holds the whole file:

* ``BlockCache`` keeps at most ``max_blocks`` aligned blocks (1 MiB each by default);
* ``LineIndex`` keeps the byte offset of every ``every``-th line (4096 by default) up to
  a *frontier*; line numbers are known exactly for offsets before the frontier;
* scans (search, filter, indexing) stream ``SCAN_CHUNK`` ranges straight from ``fetch``
  and do not pass through the cache, so a search over 10 GB does not evict the screen.

The block cache, the line index and line cleaning live in `tui.state.logpage.blocks` (and are
re-exported here). Positions are byte offsets of line starts. The line number of a line start ``off`` is
``1 + (newlines in [0, off))``. Lines are decoded with ``errors="replace"``, ANSI
stripped and ``\\r`` redraws collapsed, exactly as the dashboard's log pane does.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tui.protocol.hosttext import has_controls
from tui.protocol.ops import Chunk
from tui.state.logpage.blocks import (
    BLOCK,
    DISPLAY_MAX,
    INDEX_EVERY,
    MATCH_MAX,
    MAX_BLOCKS,
    MAX_LINE,
    SCAN_CHUNK,
    BlockCache,
    Fetch,
    FileChanged,
    LineIndex,
    clean,
    has_long_line,
    match_text,
    nth_newline,
    nth_newline_back,
)

__all__ = [
    "BLOCK",
    "MATCH_MAX",
    "MAX_BLOCKS",
    "BlockCache",
    "Chunk",
    "FileChanged",
    "Line",
    "LineIndex",
    "LogDocument",
    "RootCause",
    "clean",
    "match_text",
    "nth_newline",
    "nth_newline_back",
]


@dataclass(frozen=True)
class Line:
    """One line of the file: bytes ``[start, end)`` (``end`` is the next line's start)."""

    start: int
    end: int
    text: str
    line_no: int | None = None


@dataclass(frozen=True)
class RootCause:
    """Where the dashboard's root-cause line is, anchored to the tail it analysed.

    The dashboard numbers lines from where its tail subscription started, not from the
    top of the file, so the anchor is "``lines_back`` lines before byte ``end_offset``",
    and ``text`` (the cleaned line, maybe truncated) confirms it.
    """

    end_offset: int
    lines_back: int
    text: str
    line_no: int  # the dashboard's own number, for messages only

    @classmethod
    def from_log(cls, log: Any) -> RootCause | None:
        """The anchor for ``log.analysis.root_cause`` of a ``tui.state.model.LogTail``."""
        root = getattr(getattr(log, "analysis", None), "root_cause", None)
        if root is None or log.path is None:
            return None
        back = log.total_lines - root.line_no + 1
        if back < 1:
            return None
        return cls(log.offset - len(log.partial), back, root.line, root.line_no)


Patterns = Sequence["re.Pattern[str]"]


def _matches(text: str, patterns: Patterns) -> bool:
    return all(p.search(text) for p in patterns)


class LogDocument:
    """A remote file as lines: random access by byte offset, line numbers where known."""

    def __init__(self, fetch: Fetch, block: int = BLOCK, max_blocks: int = MAX_BLOCKS,
                 every: int = INDEX_EVERY, scan_chunk: int = SCAN_CHUNK) -> None:
        self.cache = BlockCache(fetch, block, max_blocks)
        self.index = LineIndex(every)
        self.scan_chunk = scan_chunk
        self._gen = 0

    # -- size and changes ------------------------------------------------------

    @property
    def size(self) -> int:
        return self.cache.size or 0

    async def refresh(self) -> bool:
        """Re-read the size; True when the file was truncated or replaced (all reset)."""
        await self.cache.poll()
        return self._sync()

    def _sync(self) -> bool:
        if self.cache.generation != self._gen:
            self._gen = self.cache.generation
            self.index.reset()
            return True
        return False

    async def _scan_fetch(self, offset: int, length: int) -> bytes:
        """A scan read, not cached; raises FileChanged if the file changed meanwhile."""
        gen = self.cache.generation
        chunk = await self.cache.fetch_uncached(offset, length)
        self.cache.observe(chunk)
        if self.cache.generation != gen:
            self._sync()
            raise FileChanged("the log was truncated or replaced")
        return chunk.data

    # -- moving by lines -------------------------------------------------------

    async def line_at(self, start: int) -> Line | None:
        """The line that starts at ``start``, or None at end of file."""
        if self.size and start >= self.size:
            return None
        head = bytearray()  # only the displayed head of a long line is kept
        pos = start
        while pos - start < MAX_LINE:
            data = await self.cache.read(pos, self.cache.block - pos % self.cache.block)
            if not data:
                break
            i = data.find(b"\n")
            piece = data if i < 0 else data[: i + 1]
            if len(head) < DISPLAY_MAX * 4:
                head += piece[: DISPLAY_MAX * 4 - len(head)]
            pos += len(piece)
            if i >= 0:
                break
        if pos == start:
            return None
        return Line(start, pos, clean(bytes(head),
                                      pos - start - (1 if head.endswith(b"\n") and pos - start == len(head) else 0)))

    async def lines(self, start: int, n: int) -> list[Line]:
        """Up to ``n`` lines from the line start ``start``."""
        out: list[Line] = []
        pos = start
        while len(out) < n:
            line = await self.line_at(pos)
            if line is None:
                break
            out.append(line)
            pos = line.end
        return out

    async def skip_forward(self, start: int, n: int) -> int:
        """The start of the line ``n`` lines after ``start`` (clamped to end of file)."""
        pos = start
        while n > 0:
            data = await self.cache.read(pos, self.cache.block - pos % self.cache.block)
            if not data:
                return pos
            i = nth_newline(data, n)
            if i >= 0:
                return pos + i + 1
            n -= data.count(b"\n")
            pos += len(data)
        return pos

    async def skip_back(self, offset: int, n: int) -> int:
        """The start of the line ``n`` lines before the line start ``offset``.

        ``offset`` may be end of file: then ``n=1`` gives the last line's start, also
        when the file does not end with a newline.
        """
        offset = min(offset, self.size) if self.size else offset
        if offset <= 0 or n <= 0:
            return max(0, offset)
        # The n-th line back starts after the (n+1)-th newline before `offset`; the first
        # of those ends the line just above, unless that line has no newline (end of file).
        need = n + 1
        if offset >= self.size and not (await self.cache.read(offset - 1, 1)).endswith(b"\n"):
            need = n
        pos = offset
        while pos > 0 and offset - pos < MAX_LINE * (n + 1):
            lo = max(0, ((pos - 1) // self.cache.block) * self.cache.block)
            data = await self.cache.read(lo, pos - lo)
            i = nth_newline_back(data, need)
            if i >= 0:
                return lo + i + 1
            need -= data.count(b"\n")
            pos = lo
        return pos

    async def line_start(self, offset: int) -> int:
        """The start of the line that contains byte ``offset``."""
        pos = offset
        while pos > 0 and offset - pos < MAX_LINE:
            lo = max(0, ((pos - 1) // self.cache.block) * self.cache.block)
            data = await self.cache.read(lo, pos - lo)
            i = data.rfind(b"\n")
            if i >= 0:
                return lo + i + 1
            pos = lo
        return pos

    async def last_page(self, n: int) -> int:
        """The start of the first of the last ``n`` lines."""
        await self.refresh()
        return await self.skip_back(self.size, n)

    # -- line numbers ----------------------------------------------------------

    async def count_newlines(self, a: int, b: int) -> int:
        total, pos = 0, a
        while pos < b:
            data = await self.cache.read(pos, min(b - pos, self.cache.block - pos % self.cache.block))
            if not data:
                break
            total += data.count(b"\n")
            pos += len(data)
        return total

    async def line_no(self, offset: int) -> int | None:
        """The line number of the line start ``offset``, if the index reaches it."""
        if not self.index.knows(offset):
            return None
        no, mark = self.index.mark_before(offset)
        return no + await self.count_newlines(mark, offset)

    async def numbered(self, lines: list[Line]) -> list[Line]:
        """``lines`` with line numbers filled in where the index knows them."""
        out = []
        prev: Line | None = None
        for line in lines:
            no: int | None
            if prev is not None and prev.line_no is not None and prev.end == line.start:
                no = prev.line_no + 1  # consecutive lines: no need to count
            else:
                no = await self.line_no(line.start)
            prev = Line(line.start, line.end, line.text, no)
            out.append(prev)
        return out

    async def offset_of_line(self, line_no: int) -> int | None:
        """The start of line ``line_no`` (1-based), if the index reaches it."""
        if line_no < 1 or line_no - 1 > self.index.newlines:
            return None
        no, mark = self.index.mark_for_line(line_no)
        return await self.skip_forward(mark, line_no - no)

    async def locate(self, rc: RootCause) -> Line | None:
        """The root-cause line: at its anchor if the text agrees, else the last line with that text."""
        await self.refresh()
        line = await self.line_at(await self.skip_back(rc.end_offset, rc.lines_back))
        if line is not None and rc.text and line.text.startswith(rc.text):
            return (await self.numbered([line]))[0]
        # The file moved on (rotated, or the anchor is stale): look for the text itself.
        return await self.find(self.size, [re.compile(re.escape(rc.text))], forward=False) if rc.text else None

    async def index_step(self) -> bool:
        """Count one more chunk at the index frontier; False once the index is complete."""
        if self.size and self.index.frontier >= self.size:
            await self.refresh()
            if self.index.frontier >= self.size:
                return False
        start = self.index.frontier
        data = await self._scan_fetch(start, self.scan_chunk)
        self.index.feed(start, data)
        return bool(data) and self.index.frontier < self.size

    # -- scanning --------------------------------------------------------------

    async def _pieces(self, start: int, forward: bool) -> AsyncIterator[tuple[int, bytes]]:
        """Whole-line pieces from the line start ``start`` to the end (or back to 0).

        The next range is requested before the current one is searched, so the agent
        reads and encodes while we match (a pipeline of one). A line longer than
        ``MAX_LINE`` is cut, so a file without newlines stays bounded.
        """
        size = self.size
        step = self.scan_chunk

        def rng(p: int) -> tuple[int, int]:
            return (p, min(step, size - p)) if forward else (max(0, p - step), p - max(0, p - step))

        pos = start
        pending = asyncio.ensure_future(self._scan_fetch(*rng(pos))) if (pos < size if forward else pos > 0) else None
        carry = b""
        try:
            while pending is not None:
                data = await pending
                lo, n = rng(pos)
                pos = lo + n if forward else lo
                more = pos < size if forward else pos > 0
                pending = asyncio.ensure_future(self._scan_fetch(*rng(pos))) if more and data else None
                if forward:
                    buf = carry + data
                    base = pos - len(buf)
                    cut = buf.rfind(b"\n") + 1 if pending is not None else len(buf)
                    if cut == 0 and len(buf) >= MAX_LINE:
                        cut = len(buf)
                    carry = buf[cut:]
                    if cut:
                        yield base, buf[:cut]
                else:
                    buf = data + carry
                    base = pos
                    # the first (partial) line continues in the range before; `buf` ends at a line start
                    cut = buf.find(b"\n") + 1 if pending is not None else 0
                    if pending is not None and cut == 0:  # no line starts in here yet
                        carry = buf
                        if len(buf) >= MAX_LINE:  # too long: emit it cut, so memory stays bounded
                            carry = b""
                            yield base, buf
                        continue
                    carry = buf[:cut]
                    if cut < len(buf):
                        yield base + cut, buf[cut:]
        finally:
            if pending is not None:
                pending.cancel()
                if pending.done() and not pending.cancelled():
                    pending.exception()  # retrieved: the caller is leaving anyway

    @staticmethod
    def _matching(base: int, data: bytes, patterns: Patterns) -> list[Line]:
        """Lines of ``data`` (whole lines starting at byte ``base``) that match all patterns."""
        text = data.decode("utf-8", "replace")
        out: list[Line] = []
        if has_controls(text) or has_long_line(data):
            # Escapes, controls or redraws change what is shown, and a long line must be cut before a
            # regex sees it: judge each cleaned (and capped) line on its own.
            pos = 0
            for raw in data.split(b"\n"):
                if pos >= len(data):
                    break
                end = pos + len(raw) + 1
                if _matches(match_text(raw), patterns):
                    out.append(Line(base + pos, base + min(end, len(data)), clean(raw)))
                pos = end
            return out
        # Fast path: search the whole chunk with the first pattern, confirm per line. No line
        # here is longer than MATCH_MAX, so the chunk-wide search is bounded per line too.
        ascii_ = len(text) == len(data)
        # MULTILINE, so that ^ and $ mean line start and end inside a chunk.
        first = re.compile(patterns[0].pattern, patterns[0].flags | re.MULTILINE)
        tpos = 0  # where to search next in `text`
        cur_t, cur_b = 0, 0  # a line start in text and bytes, moving forward
        while True:
            m = first.search(text, tpos)
            if m is None:
                break
            ls_t = text.rfind("\n", 0, m.start()) + 1
            ls_t = max(ls_t, cur_t)  # a match that began in a line already judged
            if ascii_:
                ls_b = ls_t
            else:
                k = text.count("\n", cur_t, ls_t)  # '\n' survives decoding one for one
                ls_b = nth_newline(data, k, cur_b) + 1 if k else cur_b
            le_t = text.find("\n", ls_t)
            le_t = len(text) if le_t < 0 else le_t + 1
            le_b = data.find(b"\n", ls_b)
            le_b = len(data) if le_b < 0 else le_b + 1
            raw = data[ls_b:le_b]
            if _matches(match_text(raw), patterns):
                out.append(Line(base + ls_b, base + le_b, clean(raw)))
            cur_t, cur_b, tpos = le_t, le_b, le_t
            if tpos >= len(text):
                break
        return out

    async def scan(self, start: int, patterns: Patterns, forward: bool = True,
                   progress: Callable[[float], None] | None = None) -> AsyncIterator[Line]:
        """Lines matching all ``patterns``, from the line start ``start`` on (or back).

        Forward scans also extend the line index when they pass its frontier.
        """
        await self.refresh()
        origin, size = start, max(1, self.size)
        async for base, data in self._pieces(start, forward):
            if forward:
                self.index.feed(base, data)
            found = self._matching(base, data, patterns)
            for line in found if forward else reversed(found):
                yield line
            if progress:
                done = base + len(data) - origin if forward else origin - base
                progress(done / max(1, size - origin if forward else origin))
            await asyncio.sleep(0)  # let the UI breathe between chunks

    async def find(self, start: int, patterns: Patterns, forward: bool = True,
                   progress: Callable[[float], None] | None = None) -> Line | None:
        """The first matching line from ``start`` in the given direction, numbered."""
        async for line in self.scan(start, patterns, forward, progress):
            return (await self.numbered([line]))[0]
        return None

    async def collect(self, start: int, n: int, patterns: Patterns, forward: bool = True) -> list[Line]:
        """Up to ``n`` matching lines from ``start``, in file order, numbered."""
        got: list[Line] = []
        if n > 0:
            async for line in self.scan(start, patterns, forward):
                got.append(line)
                if len(got) >= n:
                    break
        if not forward:
            got.reverse()
        return await self.numbered(got)
