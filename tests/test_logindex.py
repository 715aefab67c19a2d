"""LogDocument / BlockCache / LineIndex against real files, read through a local fetch.

The fetch function does what the agent's ``read_range`` does (pread + size + inode) on
a real temp file, with small blocks and chunks so that block and chunk boundaries fall
inside lines. The expected answers come from reading the whole (small) file directly.
"""

from __future__ import annotations

import os
import random
import re
import time
from pathlib import Path

import pytest

from tui.state.logbytes import split_lines
from tui.state.logpage.document import (
    MATCH_MAX,
    Chunk,
    LineIndex,
    LogDocument,
    RootCause,
    match_text,
    nth_newline,
    nth_newline_back,
)
from tui.state.model import LogTail


def local_fetch(path: Path, calls: list[tuple[int, int]] | None = None):
    """An async fetch like the agent's read_range, on a local file."""

    async def fetch(offset: int, length: int) -> Chunk:
        assert 0 <= length <= 4 << 20
        if calls is not None:
            calls.append((offset, length))
        return pread(path, offset, length)

    return fetch


def pread(path: Path, offset: int, length: int) -> Chunk:
    """What the agent's read_range does: fstat + pread on one open."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        return Chunk(offset, os.pread(f.fileno(), length, offset), st.st_size, st.st_ino)


def append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def expected_lines(path: Path) -> list[tuple[int, str]]:
    """(start offset, cleaned text) of every line, the reference the document must match."""
    raw = path.read_bytes()
    out, pos = [], 0
    lines, partial = split_lines(b"", raw)
    for text in lines + ([split_lines(partial + b"\n", b"")[0][0]] if partial else []):
        out.append((pos, text))
        nl = raw.find(b"\n", pos)
        pos = len(raw) if nl < 0 else nl + 1
    return out


def write_log(path: Path, n: int, seed: int = 1) -> None:
    rnd = random.Random(seed)
    parts = []
    for i in range(1, n + 1):
        kind = rnd.random()
        if i % 97 == 0:
            parts.append(f"ERROR 2026-01-01 worker.py:12] line {i} failed: boom\n")
        elif kind < 0.05:
            parts.append(f"INFO line {i} " + "x" * rnd.randint(500, 3000) + "\n")
        elif kind < 0.1:
            parts.append(f"INFO line {i} caf\u00e9 \u2603 unicode\n")
        else:
            parts.append(f"INFO 01-01 12:00:00 [model_runner.py:42] line {i} tokens={rnd.randint(0, 9999)}\n")
    path.write_text("".join(parts), encoding="utf-8")


@pytest.fixture
def log(tmp_path: Path) -> Path:
    p = tmp_path / "run.log"
    write_log(p, 3000)
    return p


def small_doc(path: Path, calls: list[tuple[int, int]] | None = None) -> LogDocument:
    # Tiny blocks, chunks and index spacing put every boundary case inside the test file.
    return LogDocument(local_fetch(path, calls), block=4096, max_blocks=4, every=64, scan_chunk=10_000)


def test_nth_newline_both_ways() -> None:
    data = b"a\nbb\n\nccc\n" * 20000
    nls = [i for i, c in enumerate(data) if c == 10]
    for n in (1, 2, 3, 17, 9999, len(nls)):
        assert nth_newline(data, n) == nls[n - 1]
        assert nth_newline_back(data, n) == nls[-n]
    assert nth_newline(data, len(nls) + 1) == -1
    assert nth_newline_back(data, len(nls) + 1) == -1
    assert nth_newline(data, 2, 3) == nls[2]


async def test_lines_at_arbitrary_positions_with_bounded_cache(log: Path) -> None:
    exp = expected_lines(log)
    doc = small_doc(log)
    await doc.refresh()
    rnd = random.Random(7)
    for _ in range(60):
        i = rnd.randrange(len(exp))
        got = await doc.lines(exp[i][0], 5)
        assert [(g.start, g.text) for g in got] == exp[i : i + 5]
        assert doc.cache.held_blocks <= 4
        assert doc.cache.held_bytes <= 4 * 4096
    # Moving backward lands on the same line starts.
    for _ in range(40):
        i = rnd.randrange(len(exp))
        k = rnd.randrange(0, 30)
        assert await doc.skip_back(exp[i][0], k) == exp[max(0, i - k)][0]
        assert await doc.skip_forward(exp[i][0], k) == (exp[i + k][0] if i + k < len(exp) else log.stat().st_size)
        assert await doc.line_start(exp[i][0] + 3) == exp[i][0] if len(exp[i][1]) > 3 else True
    assert await doc.skip_back(log.stat().st_size, 1) == exp[-1][0]
    assert await doc.last_page(10) == exp[-10][0]


async def test_line_numbers_from_the_lazy_index(log: Path) -> None:
    exp = expected_lines(log)
    doc = small_doc(log)
    await doc.refresh()
    assert await doc.line_no(exp[500][0]) is None  # nothing scanned yet
    while await doc.index_step():
        pass
    assert doc.index.newlines == len(exp)
    assert len(doc.index.marks) == len(exp) // 64 + 1  # sparse: one mark per 64 lines
    for i in (0, 1, 63, 64, 65, 1234, len(exp) - 1):
        assert await doc.line_no(exp[i][0]) == i + 1
        assert await doc.offset_of_line(i + 1) == exp[i][0]
    assert await doc.offset_of_line(len(exp) + 5) is None


def test_line_index_ignores_gaps() -> None:
    idx = LineIndex(every=2)
    idx.feed(10, b"x\n")  # past the frontier: ignored, no gap
    assert idx.frontier == 0
    idx.feed(0, b"a\nb\nc")
    idx.feed(2, b"b\nc\nd\n")  # overlaps: only the new part counts
    assert (idx.frontier, idx.newlines, idx.marks) == (8, 4, [0, 4, 8])


async def test_line_crossing_blocks_and_a_1mb_line(tmp_path: Path) -> None:
    p = tmp_path / "long.log"
    big = "B" * (1 << 20)
    p.write_bytes(b"head\n" + big.encode() + b" tail\nafter ERROR here\nlast-no-newline")
    doc = small_doc(p)
    await doc.refresh()
    lines = await doc.lines(0, 10)
    assert [ln.start for ln in lines] == [0, 5, 5 + len(big) + 6, 5 + len(big) + 6 + 17]
    assert lines[1].text.startswith("B" * 1000) and "bytes in all" in lines[1].text  # display is capped
    assert len(lines[1].text) < 20000
    assert lines[2].text == "after ERROR here" and lines[3].text == "last-no-newline"
    assert doc.cache.held_blocks <= 4  # a 1 MiB line read through 4 KiB blocks
    assert await doc.skip_back(p.stat().st_size, 2) == lines[2].start
    assert await doc.skip_back(lines[2].start, 1) == 5
    hit = await doc.find(0, [re.compile("ERROR")])
    assert hit is not None and hit.start == lines[2].start and hit.line_no == 3
    back = await doc.find(p.stat().st_size, [re.compile("^BBBB")], forward=False)
    assert back is not None and back.start == 5
    # Filters see only a line's first MATCH_MAX characters: the end of the 1 MB line is not searched.
    assert await doc.find(p.stat().st_size, [re.compile("tail$")], forward=False) is None


async def test_a_backtracking_regex_costs_little_on_long_lines(tmp_path: Path) -> None:
    """``\\w+Z\\b`` is quadratic in a word's length: on an 80 000-character word it takes
    about ten seconds; cut to MATCH_MAX characters, milliseconds."""
    p = tmp_path / "words.log"
    word = "w" * 80_000
    p.write_text(f"head\n{word}\n{word}Z\nthe endZ\n")
    slow = re.compile(r"\w+Z\b")
    for scan_chunk in (10_000, 3 << 20):  # a long line cut across chunks, and whole in one
        doc = LogDocument(local_fetch(p), block=4096, max_blocks=4, every=64, scan_chunk=scan_chunk)
        t0 = time.monotonic()
        hits = await doc.collect(0, 10, [slow])
        elapsed = time.monotonic() - t0
        assert [(h.line_no, h.text) for h in hits] == [(4, "the endZ")]  # the Z past MATCH_MAX is unseen
        assert elapsed < 4, f"{elapsed:.1f} s"
        back = await doc.collect(p.stat().st_size, 10, [slow], forward=False)
        assert [h.line_no for h in back] == [4]
    assert len(match_text(word.encode() + b"\n")) == MATCH_MAX


async def test_invalid_utf8_ansi_and_redraws(tmp_path: Path) -> None:
    p = tmp_path / "odd.log"
    p.write_bytes(
        b"ok\n"
        b"bad \xff\xfe bytes \xe2\n"
        b"\x1b[31mERROR\x1b[0m colored\n"
        b"Loading 10%\rLoading 50%\rLoading 100%\n"
        b"caf\xc3\xa9 ERROR after multibyte\n"
    )
    doc = small_doc(p)
    await doc.refresh()
    texts = [ln.text for ln in await doc.lines(0, 10)]
    assert texts == ["ok", "bad \ufffd\ufffd bytes \ufffd", "ERROR colored", "Loading 100%",
                     "café ERROR after multibyte"]
    hits = await doc.collect(0, 10, [re.compile("ERROR")])
    assert [(h.line_no, h.text) for h in hits] == [(3, "ERROR colored"), (5, "café ERROR after multibyte")]
    # A redrawn-away segment is not shown, so it does not match.
    assert await doc.find(0, [re.compile("50%")]) is None


@pytest.mark.parametrize("scan_chunk", [10_000, 3 << 20])
async def test_search_forward_and_backward_line_numbers(log: Path, scan_chunk: int) -> None:
    exp = expected_lines(log)
    doc = LogDocument(local_fetch(log), block=4096, max_blocks=4, every=64, scan_chunk=scan_chunk)
    pat = [re.compile(r"line \d+ failed")]
    want = [i + 1 for i, (_, t) in enumerate(exp) if pat[0].search(t)]
    assert want[:3] == [97, 194, 291]
    # forward from the top: every match, in order, with its line number
    got = [h.line_no for h in await doc.collect(0, 1000, pat)]
    assert got == want
    # forward from the middle
    mid = exp[1500][0]
    hit = await doc.find(mid, pat)
    assert hit is not None and hit.line_no == next(n for n in want if n > 1500)
    # backward from the end, and from the middle
    back = await doc.find(log.stat().st_size, pat, forward=False)
    assert back is not None and back.line_no == want[-1]
    back = await doc.find(mid, pat, forward=False)
    assert back is not None and back.line_no == max(n for n in want if n <= 1500)
    assert back.start == exp[back.line_no - 1][0]
    # two patterns are AND-ed (filter and errors-only together)
    both = await doc.collect(0, 1000, [re.compile("ERROR"), re.compile(r"line 19\d ")])
    assert [h.line_no for h in both] == [194]


async def test_progress_is_reported_and_growth_and_truncation_are_seen(tmp_path: Path) -> None:
    p = tmp_path / "grow.log"
    write_log(p, 500)
    calls: list[tuple[int, int]] = []
    doc = small_doc(p, calls)
    seen: list[float] = []
    assert await doc.find(0, [re.compile("no such thing")], progress=seen.append) is None
    assert seen and seen == sorted(seen) and seen[-1] == pytest.approx(1.0)
    size = doc.size
    await doc.lines(await doc.skip_back(size, 1), 1)  # the tail block is cached now
    append(p, "appended ERROR line\n")
    calls.clear()
    assert not await doc.refresh()
    assert doc.size > size
    last = (await doc.lines(await doc.skip_back(doc.size, 1), 1))[0]
    assert last.text == "appended ERROR line"
    # Following costs the new bytes only: one read at the old end, the tail block extended.
    assert calls == [(size, 4096 - size % 4096)]
    p.write_text("short\n")
    assert await doc.refresh()  # truncated: reported, index reset
    assert doc.index.frontier == 0
    assert [ln.text for ln in await doc.lines(0, 5)] == ["short"]


async def test_root_cause_anchor_from_a_log_tail(log: Path) -> None:
    exp = expected_lines(log)
    # A dashboard tail that started at line 2001 and saw 1000 lines: its line 120 is file line 2120.
    tail_start = exp[2000][0]

    class Failure:
        line_no = 120
        line = exp[2119][1]

    class Analysis:
        root_cause = Failure()

    tail = LogTail(path=str(log), offset=log.stat().st_size, lines=tuple(t for _, t in exp[-200:]),
                   first_line_no=1000 - 200 + 1, analysis=Analysis())
    assert tail_start and tail.total_lines == 1000
    rc = RootCause.from_log(tail)
    assert rc is not None
    doc = small_doc(log)
    await doc.refresh()
    off = await doc.skip_back(rc.end_offset, rc.lines_back)
    assert off == exp[2119][0]
    assert RootCause.from_log(LogTail(path=str(log))) is None
    hit = await doc.locate(rc)
    assert hit is not None and hit.start == exp[2119][0] and hit.line_no is None  # index not built
    # A stale anchor (the file grew since) still finds the line by its text.
    append(log, "more\nmore\n")
    hit = await doc.locate(rc)
    assert hit is not None and hit.start == exp[2119][0]
