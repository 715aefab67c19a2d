"""The bytes of a remote log: an LRU of aligned blocks and a sparse line index.

Pure (no Textual); the layer under `tui.state.logpage.document.LogDocument`. ``BlockCache``
keeps at most ``max_blocks`` blocks fetched through an async ``fetch`` (the agent's
``read_range``); ``LineIndex`` keeps the byte offset of every ``every``-th line up to a
frontier; ``clean`` decodes one physical line as the dashboard's log pane shows it.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from tui.protocol.hosttext import clean as sanitize
from tui.protocol.ops import (
    Chunk,  # what one ``read_range`` returned: ``data`` starts at ``offset``
)
from tui.state.logbytes import collapse_cr

BLOCK = 1 << 20  # bytes per cached block
MAX_BLOCKS = 32  # cached blocks held at most (32 MiB)
SCAN_CHUNK = 2 << 20  # bytes per scan request: small enough that one chunk's work is a short UI pause
INDEX_EVERY = 4096  # one index mark every this many lines
MAX_LINE = 16 << 20  # a "line" with no newline this long is cut, so odd files stay bounded
DISPLAY_MAX = 16384  # characters of one line decoded for display
MATCH_MAX = 4096  # characters of one line a filter or search looks at: bounds a backtracking regex
WINDOW = 64 * 1024  # count newlines this many bytes at a time when looking for the n-th


Fetch = Callable[[int, int], Awaitable[Chunk]]


class FileChanged(Exception):
    """The file was truncated or replaced under us; positions are meaningless now."""


def clean(raw: bytes, total: int | None = None) -> str:
    """Displayed text of one physical line (no terminator): decode, sanitize, collapse ``\\r``.

    At most ``DISPLAY_MAX`` characters are kept; ``total`` is the line's full byte
    length when ``raw`` is only its head.
    """
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    full = len(raw) if total is None else total
    text = collapse_cr(sanitize(raw[: DISPLAY_MAX * 4], cr=True))
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
    return collapse_cr(sanitize(raw[: MATCH_MAX * 4], cr=True))[:MATCH_MAX]


def has_long_line(data: bytes) -> bool:
    """True when some line of ``data`` is longer than ``MATCH_MAX`` bytes."""
    if len(data) <= MATCH_MAX:
        return False
    return max(map(len, data.split(b"\n"))) > MATCH_MAX


def nth_newline(data: bytes, n: int, start: int = 0) -> int:
    """Index of the ``n``-th (1-based) ``\\n`` in ``data[start:]``, or -1 if there are fewer."""
    pos = start
    while n > 0:
        # Skip whole windows with bytes.count (C speed) before looking line by line.
        end = min(len(data), pos + WINDOW)
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
        lo = max(0, pos - WINDOW)
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
        self.observe(await self.fetch_uncached(0, 0))
        assert self.size is not None
        return self.size

    async def fetch_uncached(self, offset: int, length: int) -> Chunk:
        """One read through ``fetch``, counted in ``fetches``, that the cache does not keep
        (the cache's own reads, and a scan's: a search must not evict the screen)."""
        self.fetches += 1
        return await self.fetch(offset, length)

    async def get(self, no: int) -> bytes:
        """Block ``no`` (short at end of file, empty past it)."""
        data = self._blocks.get(no)
        if data is not None:
            self._blocks.move_to_end(no)
            return data
        gen = self.generation
        chunk = await self.fetch_uncached(no * self.block, self.block)
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
        chunk = await self.fetch_uncached(old, self.block - old % self.block)
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
        self.open_end = False  # the bytes counted end inside a line (no newline yet)

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
        if len(data) > pos:
            self.open_end = not data.endswith(b"\n")
        self.frontier = offset + len(data)

    @property
    def lines(self) -> int:
        """Lines in [0, frontier): the newlines, and a last line that has none yet (a
        tqdm bar redrawn with ``\\r``, a log cut mid-line) is a line too."""
        return self.newlines + (1 if self.open_end else 0)

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
