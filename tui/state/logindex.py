"""A remote log file read on demand: an LRU of byte blocks plus a sparse line index.

Pure (no Textual). The bytes live on the host and arrive through an async ``fetch``
(``read_range`` of the agent protocol), so nothing here ever holds the whole file:

* ``BlockCache`` keeps at most ``max_blocks`` aligned blocks (1 MiB each by default);
* ``LineIndex`` keeps the byte offset of every ``every``-th line (4096 by default) up to
  a *frontier*; line numbers are known exactly for offsets before the frontier;
* scans (search, filter, indexing) stream ``SCAN_CHUNK`` ranges straight from ``fetch``
  and do not pass through the cache, so a search over 10 GB does not evict the screen.

Positions are byte offsets of line starts. The line number of a line start ``off`` is
``1 + (newlines in [0, off))``. Lines are decoded with ``errors="replace"``, ANSI
stripped and ``\\r`` redraws collapsed, exactly as the dashboard's log pane does.
"""

from __future__ import annotations

import asyncio
import bisect
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tui.state.lines import collapse_cr, strip_ansi

__all__ = [
    "BLOCK",
    "MAX_BLOCKS",
    "BlockCache",
    "Chunk",
    "FileChanged",
    "Line",
    "LineIndex",
    "LogDocument",
    "MATCH_MAX",
    "RootCause",
    "clean",
    "match_text",
    "nth_newline",
    "nth_newline_back",
]

BLOCK = 1 << 20  # bytes per cached block
MAX_BLOCKS = 32  # cached blocks held at most (32 MiB)
SCAN_CHUNK = 2 << 20  # bytes per scan request: small enough that one chunk's work is a short UI pause
INDEX_EVERY = 4096  # one index mark every this many lines
MAX_LINE = 16 << 20  # a "line" with no newline this long is cut, so odd files stay bounded
DISPLAY_MAX = 16384  # characters of one line decoded for display
MATCH_MAX = 4096  # characters of one line a filter or search looks at: bounds a backtracking regex
_WINDOW = 64 * 1024  # count newlines this many bytes at a time when looking for the n-th


@dataclass(frozen=True)
class Chunk:
    """What one ``read_range`` returned: ``data`` starts at ``offset``."""

    offset: int
    data: bytes
    size: int
    inode: int | None


Fetch = Callable[[int, int], Awaitable[Chunk]]


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


class FileChanged(Exception):
    """The file was truncated or replaced under us; positions are meaningless now."""


def clean(raw: bytes, total: int | None = None) -> str:
    """Displayed text of one physical line (no terminator): decode, strip ANSI, collapse ``\\r``.

    At most ``DISPLAY_MAX`` characters are kept; ``total`` is the line's full byte
    length when ``raw`` is only its head.
    """
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    full = len(raw) if total is None else total
    text = collapse_cr(strip_ansi(raw[: DISPLAY_MAX * 4].decode("utf-8", "replace")))
    if len(text) > DISPLAY_MAX or full > len(raw) or len(raw) > DISPLAY_MAX * 4:
        return text[:DISPLAY_MAX] + f" … ({full} bytes in all)"
    return text


def match_text(raw: bytes) -> str:
    """What filters and searches see of one line: its first ``MATCH_MAX`` cleaned characters.

    A regex that backtracks (``\\w+Error\\b`` is quadratic in the length of a word) costs
    at most that much on a 1 MB line, so the UI never stalls on one.
    """
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    return collapse_cr(strip_ansi(raw[: MATCH_MAX * 4].decode("utf-8", "replace")))[:MATCH_MAX]


def _has_long_line(data: bytes) -> bool:
    """True when some line of ``data`` is longer than ``MATCH_MAX`` bytes."""
    if len(data) <= MATCH_MAX:
        return False
    return max(map(len, data.split(b"\n"))) > MATCH_MAX


def nth_newline(data: bytes, n: int, start: int = 0) -> int:
    """Index of the ``n``-th (1-based) ``\\n`` in ``data[start:]``, or -1 if there are fewer."""
    pos = start
    while n > 0:
        # Skip whole windows with bytes.count (C speed) before looking line by line.
        end = min(len(data), pos + _WINDOW)
        if end <= pos:
            return -1
        c = data.count(b"\n", pos, end)
        if c < n:
            n -= c
            pos = end
            continue
        for _ in range(n):
            pos = data.index(b"\n", pos) + 1
        return pos - 1
    return start - 1


def nth_newline_back(data: bytes, n: int, end: int | None = None) -> int:
    """Index of the ``n``-th (1-based) ``\\n`` going backward from ``data[:end]``, or -1."""
    pos = len(data) if end is None else end
    while n > 0:
        lo = max(0, pos - _WINDOW)
        if pos <= 0:
            return -1
        c = data.count(b"\n", lo, pos)
        if c < n:
            n -= c
            pos = lo
            continue
        for _ in range(n):
            pos = data.rindex(b"\n", 0, pos)
        return pos
    return pos


class BlockCache:
    """An LRU of aligned blocks fetched on demand; never more than ``max_blocks`` held."""

    def __init__(self, fetch: Fetch, block: int = BLOCK, max_blocks: int = MAX_BLOCKS) -> None:
        self.fetch = fetch
        self.block = block
        self.max_blocks = max_blocks
        self.size: int | None = None  # file size as last seen
        self.inode: int | None = None
        self.generation = 0  # bumped when the file is truncated or replaced
        self.fetches = 0
        self._blocks: OrderedDict[int, bytes] = OrderedDict()

    @property
    def held_blocks(self) -> int:
        return len(self._blocks)

    @property
    def held_bytes(self) -> int:
        return sum(len(b) for b in self._blocks.values())

    def observe(self, chunk: Chunk) -> None:
        """Learn size and inode from any fetch; drop everything if the file was replaced."""
        if self.size is not None and (
            chunk.size < self.size or (chunk.inode is not None and self.inode is not None and chunk.inode != self.inode)
        ):
            self.clear()
            self.generation += 1
        elif self.size is not None and chunk.size > self.size:
            # The block that held the old end of file was short; it is stale now.
            self._blocks.pop(self.size // self.block, None)
        self.size, self.inode = chunk.size, chunk.inode

    def clear(self) -> None:
        self._blocks.clear()

    async def stat(self) -> int:
        """Refresh and return the size (a zero-length read)."""
        self.observe(await self._fetch(0, 0))
        assert self.size is not None
        return self.size

    async def _fetch(self, offset: int, length: int) -> Chunk:
        self.fetches += 1
        return await self.fetch(offset, length)

    async def get(self, no: int) -> bytes:
        """Block ``no`` (short at end of file, empty past it)."""
        data = self._blocks.get(no)
        if data is not None:
            self._blocks.move_to_end(no)
            return data
        gen = self.generation
        chunk = await self._fetch(no * self.block, self.block)
        self.observe(chunk)
        if self.generation != gen:
            raise FileChanged("the log was truncated or replaced")
        self._blocks[no] = chunk.data
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)
        return chunk.data

    async def poll(self) -> None:
        """Refresh the size; bytes appended to a cached tail block extend it in place.

        Following a growing log thus costs only the new bytes, not the whole tail block.
        """
        if self.size is None:
            await self.stat()
            return
        old, no = self.size, self.size // self.block
        chunk = await self._fetch(old, self.block - old % self.block)
        tail = self._blocks.get(no)
        gen = self.generation
        self.observe(chunk)
        if self.generation == gen and tail is not None and len(tail) == old - no * self.block and chunk.data:
            self._blocks[no] = tail + chunk.data

    async def read(self, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset+length)`` (shorter at end of file)."""
        out = bytearray()
        pos, stop = offset, offset + length
        while pos < stop:
            no = pos // self.block
            data = await self.get(no)
            lo = pos - no * self.block
            piece = data[lo : lo + (stop - pos)]
            if not piece:
                break
            out += piece
            pos += len(piece)
            if len(data) < self.block:
                break  # end of file
        return bytes(out)


class LineIndex:
    """Offsets of every ``every``-th line start, from 0 up to ``frontier``.

    ``feed`` extends it with bytes read at the frontier (by the indexer or a forward
    scan); bytes elsewhere are ignored, so it never has gaps.
    """

    def __init__(self, every: int = INDEX_EVERY) -> None:
        self.every = every
        self.reset()

    def reset(self) -> None:
        self.marks: list[int] = [0]  # marks[k]: start of line k*every + 1
        self.frontier = 0  # every byte before this was counted
        self.newlines = 0  # newlines in [0, frontier)

    def feed(self, offset: int, data: bytes) -> None:
        """Count ``data`` (which starts at ``offset``) if it reaches past the frontier."""
        if offset > self.frontier or offset + len(data) <= self.frontier:
            return
        pos = self.frontier - offset
        count = data.count(b"\n", pos)
        # Record a mark each time the line count crosses a multiple of `every`.
        upto = self.newlines + count
        nxt = (self.newlines // self.every + 1) * self.every
        while nxt <= upto:
            i = nth_newline(data, nxt - self.newlines, pos)
            self.newlines = nxt
            pos = i + 1
            self.marks.append(offset + pos)
            nxt += self.every
        self.newlines = upto
        self.frontier = offset + len(data)

    def knows(self, offset: int) -> bool:
        return offset <= self.frontier

    def mark_before(self, offset: int) -> tuple[int, int]:
        """(line number, offset) of the last mark at or before ``offset``."""
        k = bisect.bisect_right(self.marks, offset) - 1
        return k * self.every + 1, self.marks[k]

    def mark_for_line(self, line_no: int) -> tuple[int, int]:
        """(line number, offset) of the last mark at or before line ``line_no``."""
        k = min((line_no - 1) // self.every, len(self.marks) - 1)
        return k * self.every + 1, self.marks[k]


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
        chunk = await self.cache._fetch(offset, length)
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
        return Line(start, pos, clean(bytes(head), pos - start - (1 if head.endswith(b"\n") and pos - start == len(head) else 0)))

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
        if "\x1b" in text or "\r" in text or _has_long_line(data):
            # Escapes or redraws change what is shown, and a long line must be cut before a
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
