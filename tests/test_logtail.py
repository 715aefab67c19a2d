"""The log pane's colouring stays linear on pathological lines (a 1 MB line of word
characters froze the dashboard for minutes with an unanchored `\\w+Error`)."""

from __future__ import annotations

import time
from typing import Any

from rich.style import Style
from textual.app import App, ComposeResult

from tui.state.model import LogTail
from tui.views.widgets.logtail import BUSY_S, FILL, LogPane, TailLog, style_line


def test_long_lines_are_coloured_quickly_and_shown_cut() -> None:
    t0 = time.perf_counter()
    for line in ("a" * 1_000_000, "x" * 1_000_000 + " RuntimeError: boom", "é" * 500_000):
        text = style_line(line)
        assert len(text.plain) < 2100 and "chars)" in text.plain
    assert time.perf_counter() - t0 < 0.5


def test_severity_colours() -> None:
    assert style_line("ERROR 11-30 02:00:00 [x.py:1] boom").style == "red"
    assert style_line("RuntimeError: Worker failed with error 'State error'").style == "red"
    assert style_line("WARNING 11-30 02:00:00 [x.py:1] slow").style == "yellow"
    assert style_line("INFO ValueErrors are counted").style == ""


class _PaneApp(App[None]):
    def compose(self) -> ComposeResult:
        yield LogPane()


def _tail(n: int) -> LogTail:
    return LogTail(path="/srv/x.log", lines=tuple(f"line {i}" for i in range(n)), offset=7 * n)


async def test_a_line_after_a_quiet_spell_is_drawn_within_a_frame_and_a_flood_is_throttled() -> None:
    """The repaint throttle costs latency only under a flood: a line every ~0.35 s is
    written to the view at once (drawn with the next frame, no timer); 50 updates a
    second repaint at most once per BUSY_S."""
    app = _PaneApp()
    async with app.run_test(size=(100, 20)) as pilot:
        pane, view = app.query_one(LogPane), app.query_one(TailLog)
        delays: list[float] = []
        timer = pane.set_timer

        def spy(delay: float, callback: Any) -> Any:
            delays.append(delay)
            return timer(delay, callback)

        pane.set_timer = spy  # type: ignore[method-assign]
        for n in range(1, 4):  # sparse: ~3 lines a second
            await pilot.pause(0.35)
            pane.show(_tail(n))
            assert list(view.lines) == [f"line {i}" for i in range(n)]
        assert delays == []
        await pilot.pause(0.6)
        drawn: list[int] = []
        write = view.write_lines
        view.write_lines = lambda lines: (drawn.append(1), write(lines))  # type: ignore[method-assign,func-returns-value]
        t0, n = time.monotonic(), 3
        while time.monotonic() - t0 < 2.0:  # a flood: an update every 20 ms for 2 s
            n += 1
            pane.show(_tail(n))
            await pilot.pause(0.02)
        await pilot.pause(BUSY_S + 0.2)
        assert list(view.lines)[-1] == f"line {n - 1}"  # everything arrived on screen
        assert len(drawn) <= 2.0 / BUSY_S + 3, drawn  # ~2 repaints a second, not 50


async def test_the_newest_line_stays_in_sight_when_a_wide_line_brings_the_scrollbar() -> None:
    """A line wider than the pane adds a horizontal scrollbar, which takes a row: the
    view still ends on the newest line, and keeps following as more arrive."""
    app = _PaneApp()
    async with app.run_test(size=(80, 12)) as pilot:
        pane, view = app.query_one(LogPane), app.query_one(TailLog)
        rows = [f"line {i}" for i in range(30)]
        pane.show(LogTail(path="/srv/x.log", lines=tuple(rows), offset=1))
        await pilot.pause(0.1)
        for i in range(3):
            rows.append(f"wide {i} " + "w" * 200)
            pane.show(LogTail(path="/srv/x.log", lines=tuple(rows), offset=2 + i))
            await pilot.pause(0.3)
            assert view.scroll_y == view.max_scroll_y
            shown = [view.render_line(y).text for y in range(view.scrollable_content_region.height)]
            assert shown[-1].startswith(f"wide {i} "), shown[-3:]


async def test_a_steady_stream_repaints_about_once_a_paneful_and_few_lines_pass_unseen() -> None:
    """Lines at a steady rate that fills the pane in 0.8 s (updates every 0.2 s, as the
    agent sends a busy log): the pane repaints about once per paneful, not twice a
    second, and nearly every line is on screen after some repaint (a repaint that brings
    more lines than the pane has rows scrolls the surplus by unseen)."""
    app = _PaneApp()
    async with app.run_test(size=(100, 24)) as pilot:
        pane, view = app.query_one(LogPane), app.query_one(TailLog)
        await pilot.pause()
        rows = view.scrollable_content_region.height
        batch = max(1, round(rows / 4))  # a paneful every 0.8 s
        n = 0
        for _ in range(8):  # the stream gets going: its first lines are drawn at once
            n += batch
            pane.show(_tail(n))
            await pilot.pause(0.2)
        writes: list[int] = []
        write = view.write_lines
        view.write_lines = lambda lines: (writes.append(len(lines)), write(lines))  # type: ignore[method-assign,func-returns-value]
        n0, t0 = n, time.monotonic()
        while time.monotonic() - t0 < 4.0:
            n += batch
            pane.show(_tail(n))
            await pilot.pause(0.2)
        seconds = time.monotonic() - t0
        await pilot.pause(1.2)
        assert view.lines[-1] == f"line {n - 1}"  # all of it on screen in the end
        assert sum(max(0, w - rows) for w in writes) <= 0.1 * (n - n0), (rows, writes)
        rate = (n - n0) / seconds
        assert len(writes) <= seconds * rate / (FILL * rows) + 2, (rows, rate, writes)  # twice a second: ~9


class _TailApp(App[None]):
    def compose(self) -> ComposeResult:
        yield TailLog(max_lines=50)


async def _drag(pilot: Any) -> None:
    """The mouse dragged over the tail from row 2 to row 4."""
    await pilot.mouse_down(TailLog, offset=(0, 2))
    await pilot.hover(TailLog, offset=(5, 4))
    await pilot.mouse_up(TailLog, offset=(5, 4))


async def test_a_selection_in_a_live_tail_keeps_to_the_lines_dragged_over_while_more_arrive() -> None:
    """Dragging the mouse over the tail selects those lines; as new lines arrive and the
    oldest are let go, the selection (what is copied, what is highlighted) stays on the
    same lines, not on whatever now sits at the same place in the tail. Once they are
    let go too, nothing of them is copied; nor when the tail is cleared for another log."""
    app = _TailApp()
    async with app.run_test(size=(40, 12)) as pilot:
        view = app.query_one(TailLog)
        view.write_lines([f"row {i:03d}" for i in range(120)])  # 70 let go already
        await pilot.pause()
        top = view.scroll_offset.y
        a, b, c = (view.lines[top + y] for y in (2, 3, 4))
        await _drag(pilot)
        await pilot.pause()
        copied = app.screen.get_selected_text()
        assert copied is not None
        first, second, third = copied.split("\n")
        assert (first, second) == (a, b) and third and c.startswith(third), copied

        def highlighted() -> list[str]:
            marked = app.screen.get_component_rich_style("screen--selection").bgcolor
            rows = [view.render_line(y) for y in range(view.size.height)]
            return [row.text.rstrip() for row in rows if any(seg.style and seg.style.bgcolor == marked for seg in row)]

        assert highlighted() == [a, b, c]
        view.write_lines(["row 120", "row 121"])  # two more, two let go: the three rows move up two
        await pilot.pause()
        assert view.lines[top + 2] != a  # the place dragged over shows another line now
        assert app.screen.get_selected_text() == copied
        assert highlighted() == [a, b, c]
        view.write_lines([f"row {i:03d}" for i in range(122, 185)])  # the selected lines let go too
        await pilot.pause()
        assert not app.screen.get_selected_text()
        assert highlighted() == []
        await _drag(pilot)  # a selection, then another log
        assert app.screen.get_selected_text()
        view.clear()
        view.write_lines([f"new {i:03d}" for i in range(200)])  # numbered from 0 again, past the old numbers
        await pilot.pause()
        assert not app.screen.get_selected_text() and highlighted() == []


async def test_each_row_shows_its_line_in_the_colour_of_its_severity() -> None:
    """A row is its line, whole (wide characters too), in its severity's colour over the
    pane's background; nothing of it is read as markup."""
    lines = ["ERROR 12-07 04:00:00 [x.py:1] boom", "WARNING slow [bold]not markup[/bold]",
             "Loading safetensors checkpoint shards: Completed | 3/5", "── log restarted ──",
             "INFO plain line", "wide 漢字 and 🙂", "ValueError: bad"]
    app = _TailApp()
    async with app.run_test(size=(80, 12)) as pilot:
        view = app.query_one(TailLog)
        view.write_lines(lines)
        await pilot.pause()
        base = view.rich_style
        for y, line in enumerate(lines):
            row = view.render_line(y)
            assert row.text.rstrip() == line
            want = base + Style.parse(style_line(line).style or "none")
            text_segments = [seg for seg in row if seg.text.strip()]
            assert text_segments and all(seg.style.color == want.color and seg.style.bgcolor == base.bgcolor
                                         and seg.style.bold == want.bold for seg in text_segments), (line, list(row))
