"""The log tail: a bounded line widget of its own (Textual's line API: a `ScrollView`
with `render_line`) that only ever appends the new lines, plus one line below it for the
bar being redrawn in place (`\\r` without a newline).

`show()` only records the newest tail; the lines that arrived since the last frame are
written in one append: the first tail of a log as soon as all of it is in, a line that
follows a quiet spell with the next frame, and, only while lines keep coming (more than
`SPARSE_PER_S` updates in the last second), once per slot (`busy_slot`): about the time
the pane's rows take to fill at the lines' rate, so each repaint brings about a paneful
and few lines scroll by unseen, at most twice a second (`BUSY_S`) and at least once
(`CALM_S`). A log of 20
or 2,000 lines/s so costs one or two repaints a second, not one per line (each repaint
redraws every visible row), and a line every few seconds is on screen within a frame. (The
agent sends a busy log's bytes at most every 0.2 s, remote/agent/follow.py GATHER_S: five
updates a second, still more than SPARSE_PER_S.)"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from math import ceil
from typing import Any

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.cache import LRUCache
from textual.containers import Vertical
from textual.geometry import Offset, Region, Size
from textual.scroll_view import ScrollView
from textual.scrollbar import ScrollBar
from textual.selection import Selection
from textual.strip import Strip
from textual.widgets import Static

from tui import trace
from tui.protocol.hosttext import clean
from tui.state.model import LOG_LINES, LogTail
from tui.views.widgets.render import StyleOncePerRepaint, set_title

# `\b[A-Za-z_]\w*Error` starts only at word boundaries, so a long run of word characters
# costs one linear scan (an unanchored `\w+Error` was quadratic: minutes on a 1 MB line).
ERROR_PATTERN = re.compile(r"\b(?:ERROR|CRITICAL|FATAL|Traceback)\b|Error:|Exception:|\b[A-Za-z_]\w*Error\b")
_WARN = re.compile(r"\bWARN(?:ING)?\b")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # the edge's sanitizer drops these; never drawn raw
SCAN = 4096  # only a line's head decides its colour
SHOW = 2000  # characters of a line shown in the tail pane (the viewer shows more)
FRAME_S = 0.05  # the shortest wait before a throttled repaint
BUSY_S = 0.5  # while lines keep coming, one repaint per this many seconds at most
CALM_S = 1.0  # ... and at least one per this many seconds
FILL = 0.9  # the share of the pane a busy repaint brings, on average (`busy_slot`)
SPARSE_PER_S = 4  # up to this many updates in the last second, each is drawn at once
MARK = "── "  # a restart marker line: "── log was truncated ──"


def busy_slot(rows: int, lines_per_s: float) -> float:
    """Seconds between repaints while lines keep coming: a little less than the pane's
    `rows` take to fill at `lines_per_s` (lines come in bursts), so each repaint brings
    about a paneful and few lines scroll by unseen; between BUSY_S (a flood, whose lines
    cannot all be seen anyway) and CALM_S. At 20 lines/s a 16-row pane repaints every
    0.72 s, not every 0.5 s: each repaint redraws every row, so it costs 0.7 as much."""
    if rows <= 0 or lines_per_s <= 0:
        return BUSY_S
    return min(CALM_S, max(BUSY_S, FILL * rows / lines_per_s))


def repaint_wait(now: float, last: float, slot: float = BUSY_S) -> float:
    """Seconds until a throttled repaint, `last` the previous one (monotonic times):
    the next frame after a quiet spell; while updates keep coming, `slot` after the last
    (one timer draws the log and the panels together: dashboard.py `_repaint_soon`)."""
    return max(FRAME_S, last + slot - now)


def line_style(line: str) -> str:
    """The colour of a log line by severity."""
    head = line[:SCAN]
    if line.startswith(MARK) and line.endswith(" ──"):
        return "bold magenta"
    if ERROR_PATTERN.search(head):
        return "red"
    if _WARN.search(head):
        return "yellow"
    if "Loading" in head and "Completed" in head:
        return "cyan"
    return ""


def clip(line: str) -> str:
    return line if len(line) <= SHOW else line[:SHOW] + f" … (+{len(line) - SHOW} chars)"


def style_line(line: str) -> Text:
    """A log line as styled text; markup in the log is never interpreted."""
    return Text(clip(line), style=line_style(line))


class TailLog(StyleOncePerRepaint, ScrollView, can_focus=True):
    """The newest `max_lines` lines of a log, one row each, coloured by severity.

    It owns its lines and a cache of their rendered rows keyed by (text, style), so a
    line is styled and rendered once, not again each time the tail scrolls by one row;
    only the visible rows are asked for. Selection (mouse drag, copy) works on the
    lines as written."""

    ALLOW_SELECT = True
    DEFAULT_CSS = """
    TailLog { background: $surface; color: $foreground; overflow: scroll; }
    TailLog:focus { background-tint: $foreground 5%; }
    """

    def __init__(self, max_lines: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_lines = max_lines
        self._rows: list[str] = []
        self._first = 0  # the number of `_rows[0]`: rows count on from the first one written
        self._bar_drawn: tuple[int, list[Segment]] | None = None  # the scrollbar as last repainted (track, bar)
        self._widest = 0
        self._strips: LRUCache[tuple[str, Style], Strip] = LRUCache(256)
        # Rows as drawn, by (number, scroll_x, width, style): a tail that scrolls by N
        # rows draws only those N again; the rest were drawn at their numbers before.
        self._drawn: LRUCache[tuple[int, int, int, Style], Strip] = LRUCache(512)
        self._frame: tuple[int, int, int, Selection | None] | None = None  # while a repaint runs

    @property
    def lines(self) -> Sequence[str]:
        """The rows held, oldest first (read only)."""
        return self._rows

    def clear_render_cache(self) -> None:
        """Forget every rendered row (they are made again when next shown)."""
        self._strips.clear()
        self._drawn.clear()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self.clear_render_cache()

    def write_lines(self, lines: Iterable[str]) -> None:
        """Append rows (a line holding line breaks becomes several); keep the view at
        the end if it was there, else leave the user where they scrolled to."""
        new = [_CONTROL.sub("\ufffd", ln.expandtabs()) for line in lines for ln in line.splitlines()]
        if not new:
            return
        at_end = self.is_vertical_scroll_end
        self._rows.extend(new)
        if len(self._rows) > self.max_lines:
            drop = len(self._rows) - self.max_lines
            del self._rows[:drop]
            self._first += drop
        self._widest = max(self._widest, max(cell_len(ln) for ln in new))
        size = Size(self._widest, len(self._rows))
        laid_out = not (size.width == self.virtual_size.width and self.virtual_size.height and self.is_mounted)
        if not laid_out:
            # Only taller (a tail still short of max_lines): the scrollbar's range
            # follows, nothing moves on screen, so no layout of the whole screen, which
            # would repaint every panel the log pane's region crosses.
            self.set_reactive(TailLog.virtual_size, size)
            self.vertical_scrollbar.set_reactive(ScrollBar.window_virtual_size, size.height)
        else:
            self.virtual_size = size
            self._bar_drawn = None  # the layout repaints the scrollbar as Textual sets it
        self._refresh_rows()
        scrolled_from = self.scroll_y
        if at_end and not self.is_vertical_scrollbar_grabbed:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
            if laid_out:
                # A first wide line brings the horizontal scrollbar, which takes a row only
                # once laid out: end again then, or the newest line sits under the bar.
                self.call_after_refresh(self.scroll_end, animate=False, immediate=True, x_axis=False)
        if not laid_out and self.scroll_y == scrolled_from:
            self._follow_bar()  # its range moved alone (a scroll follows it: watch_scroll_y)

    def watch_scroll_y(self, old: float, new: float) -> None:
        """ScrollView's, but a scroll repaints the rows, and the scrollbar beside them
        only if its bar moved (`_follow_bar`)."""
        if self.show_vertical_scrollbar:
            bar = self.vertical_scrollbar
            bar.set_reactive(ScrollBar.position, bar.validate_position(new))
            self._follow_bar()
        if round(old) != round(new):
            self._refresh_rows()

    def _follow_bar(self) -> None:
        """Repaint the vertical scrollbar when the bar it draws changed.

        While a tail grows toward `max_lines` at its end, every append moves the bar's
        range and position, and Textual's scrollbar repaints on each move (as many rows
        as the pane, through the widget render path: at 20 lines/s as costly as the log
        rows). A thumb already at its least size at the bottom does not move on screen.
        So the tail sets range and position without that repaint (`set_reactive`) and
        compares the bar as Textual draws it (`ScrollBarRender.render_bar`, ~25 us) with
        the one it last repainted. Hover, grab and layout repaint it as before."""
        bar = self.vertical_scrollbar
        virtual, window, track = bar.window_virtual_size, bar.window_size, bar.size.height
        drawn = (track, bar.renderer.render_bar(  # the arguments ScrollBar._render_bar hands it
            size=track, virtual_size=ceil(virtual), window_size=ceil(window) if window < virtual else 0,
            position=bar.position, thickness=bar.thickness, vertical=True).segments)
        if drawn != self._bar_drawn:
            self._bar_drawn = drawn
            bar.refresh()

    def _refresh_rows(self) -> None:
        """Repaint the rows, not the scrollbars beside them: a full `refresh()` marks the
        whole region dirty, scrollbar gutters too, and at 20 lines/s a log past its
        `max_lines` redrew an unchanged scrollbar with every frame (a tenth of the
        dashboard's render time). A scrollbar whose thumb moves repaints itself."""
        rows = self.scrollable_content_region
        self.refresh(Region(0, 0, rows.width, rows.height))

    def clear(self) -> None:
        """Empty the tail (another log follows): rows count from 0 again, so a selection
        made in the old log goes too, or it would mark the new log's rows of its numbers."""
        self._rows.clear()
        self._first = self._widest = 0
        self._bar_drawn = None
        self.clear_render_cache()
        if self.is_mounted and self in self.screen.selections:
            self.screen.selections = {w: sel for w, sel in self.screen.selections.items() if w is not self}
        self.virtual_size = Size(0, 0)
        self.refresh()

    def render_lines(self, crop: Region) -> list[Strip]:
        """What every row of one repaint shares (the scroll, the width, the selection),
        read once: each is a walk up the DOM or a reactive read."""
        scroll_x, scroll_y = self.scroll_offset
        self._frame = (scroll_x, scroll_y, self.size.width, self.text_selection)
        try:
            return super().render_lines(crop)
        finally:
            self._frame = None

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y, width, selection = self._frame or (*self.scroll_offset, self.size.width,
                                                              self.text_selection)
        index, base = scroll_y + y, self.rich_style
        if index >= len(self._rows):
            return Strip.blank(width, base)
        # A row's mouse offsets carry its number, not its place in `_rows` (which moves
        # as old rows go): so a row drawn once is the same strip while it scrolls up.
        number = self._first + index
        key = (number, scroll_x, width, base)
        if selection is None and (strip := self._drawn.get(key)) is not None:
            return strip
        strip = self._row(index, base, selection).crop_extend(scroll_x, scroll_x + width, base)
        strip = strip.apply_offsets(scroll_x, number)
        if selection is None:
            self._drawn[key] = strip
        return strip

    def _row(self, index: int, base: Style, selection: Selection | None) -> Strip:
        line = self._rows[index]
        span = selection.get_span(self._first + index) if selection is not None else None
        if span is None:
            strip = self._strips.get((line, base))
            if strip is None:
                # One style for the whole row (its severity's over the widget's): one
                # segment, made directly; Rich's Text rendering (span stacks, style
                # combining per span) made the same segment at twice the cost.
                style = line_style(line)
                segments = [Segment(line, base + Style.parse(style) if style else base)] if line else []
                strip = self._strips[(line, base)] = Strip(segments, cell_len(line))
            return strip
        text = Text(line, no_wrap=True, end="")
        text.stylize(base)
        if style := line_style(line):
            text.stylize(style)
        start, end = span
        text.stylize(self.screen.get_component_rich_style("screen--selection"), start, len(text) if end == -1 else end)
        return Strip(text.render(self.app.console), cell_len(line))

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        """The selected text; `selection` counts rows by number (see `render_line`),
        and rows that went since it was made are left out."""
        first = self._first
        start, end = selection
        if end is not None and end.y < first:
            return None  # all of it went
        if start is not None and start.y < first:
            start = Offset(0, first)
        held = Selection(*(None if o is None else Offset(o.x, o.y - first) for o in (start, end)))
        return held.extract("\n".join(self._rows)), "\n"

    def selection_updated(self, selection: Selection | None) -> None:
        self.refresh()


NO_LOG = "Log · none yet: the selected run's log is tailed here"


class LogPane(Vertical):
    DEFAULT_CSS = """
    LogPane TailLog { height: 1fr; overflow-x: auto; overflow-y: scroll; }
    LogPane #live { height: auto; max-height: 1; color: $accent; }
    LogPane #note { height: auto; max-height: 1; color: $warning; }
    """

    def __init__(self, pace: Callable[[float], None] | None = None, **kwargs: Any) -> None:
        """``pace(wait)``: have `flush` run in ``wait`` seconds, on an owner's timer that
        repaints its other panels in the same screen update (the default: a timer of the
        pane's own)."""
        super().__init__(**kwargs)
        self._pace = pace or (lambda wait: self.set_timer(wait, self.flush))
        self._shown = 0  # log.total_lines (less log.prepended) already written
        self._generation = 0
        self._path: str | None = None
        self._pending: LogTail | None = None  # the newest tail not on screen yet
        self._drawn: LogTail | None = None
        self._flushed_at = 0.0  # monotonic time of the last repaint
        # The last updates, (when, log.total_lines): whether lines keep coming, and their rate.
        self._arrivals: deque[tuple[float, int]] = deque(maxlen=12)
        self._live: str | None = None  # None: never drawn (an empty Static is one row high)
        self._note = ""
        self._tail_of: tuple[str | None, str | None] | None = None  # (path, sub) whose first tail is drawn
        self.border_title = NO_LOG  # until a run's log (or [run] log) is followed

    def compose(self) -> ComposeResult:
        yield Static("", id="note")
        yield TailLog(max_lines=LOG_LINES)
        yield Static("", id="live")

    def show(self, log: LogTail) -> None:
        """Record the newest tail; one `flush` per frame draws what came since the last."""
        if log is self._drawn:
            return
        first = log.tail_end is not None and (log.path, log.sub) != self._tail_of
        if first and log.offset >= log.tail_end:  # type: ignore[operator]
            self._tail_of = (log.path, log.sub)  # this log's first tail is all in: drawn now
            self._pending = log
            self.flush()
            trace.mark("first tail drawn")
            return
        now = time.monotonic()
        self._arrivals.append((now, log.total_lines))
        busy = self.busy(now)
        if self._pending is None and not busy and not first:  # a line after a quiet spell: this frame
            self._pending = log
            self.flush()
            return
        if self._pending is None:
            # Throttle only while lines keep coming; while the first tail still comes, a
            # partial draw would only be drawn over.
            self._pace(BUSY_S if first else repaint_wait(now, self._flushed_at, self.slot()))
        self._pending = log

    def slot(self) -> float:
        """`busy_slot` for this pane's visible rows and the lines' rate over the updates
        of the last 2 s (at most 12 of them)."""
        if len(self._arrivals) < 2:
            return BUSY_S
        t1, n1 = self._arrivals[-1]
        t0, n0 = next((t, n) for t, n in self._arrivals if t1 - t <= 2.0)
        rate = (n1 - n0) / (t1 - t0) if t1 - t0 >= 0.2 else 0.0
        return busy_slot(self.query_one(TailLog).scrollable_content_region.height, rate)

    def busy(self, now: float) -> bool:
        """Lines keep coming: more than SPARSE_PER_S updates in the last second."""
        return len(self._arrivals) > SPARSE_PER_S and now - self._arrivals[-SPARSE_PER_S - 1][0] < 1.0

    def flush(self) -> None:
        log, self._pending = self._pending, None
        if log is None:
            return
        self._drawn, self._flushed_at = log, time.monotonic()
        view = self.query_one(TailLog)
        out: list[str] = []
        if log.path != self._path:  # another run's log: start afresh
            view.clear()
            self._path, self._shown, self._generation = log.path, 0, log.generation
            set_title(self, f"Log {clean(log.path, newline=False)}" if log.path else NO_LOG)
        if log.generation != self._generation:
            # The stream restarted (truncation/rotation): mark it instead of clearing,
            # so what the user was reading stays on screen. Line counts start again.
            out.append(f"{MARK}{log.note or 'log restarted'} ──")
            self._generation = log.generation
            self._shown = 0
        new = log.total_lines - log.prepended - self._shown  # lines put before the first tail are not new
        if new > 0:
            # One row per line: a line holding other line breaks Python knows is joined.
            out.extend(" ".join(clip(line).splitlines()) or " " for line in log.lines[-min(new, len(log.lines)) :])
            self._shown = log.total_lines - log.prepended
        if out:
            view.write_lines(out)
            trace.mark("log lines drawn")
        live, note = log.live[-500:], log.note or ""
        if live != self._live:
            self._live = live
            self.query_one("#live", Static).update(Text(live))
        if note != self._note:
            self._note = note
            self.query_one("#note", Static).update(Text(note))
