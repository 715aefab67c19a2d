"""The log tail: a bounded `Log` (plain lines, only the visible ones are rendered) that
only ever appends the new lines, plus one line below it for the bar being redrawn in
place (`\\r` without a newline).

`show()` only records the newest tail; the lines that arrived since the last frame are
written in one append: the first tail of a log as soon as all of it is in, then
`FRAME_S` after a line that follows a quiet spell, and at most once per `BUSY_S` while
lines keep coming, so a log of 20 or 2,000 lines/s costs two
repaints a second, not one per line (each repaint redraws every visible row, and Textual
asks every top-level widget for its lines, so fewer frames is the lever that counts)."""

from __future__ import annotations

import re
import time
from typing import Any

from rich.cells import cell_len
from rich.highlighter import Highlighter
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.cache import LRUCache
from textual.containers import Vertical
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Log, Static

from tui import trace
from tui.protocol.hosttext import clean
from tui.state.model import LOG_LINES, LogTail
from tui.views.widgets.render import set_title

# `\b[A-Za-z_]\w*Error` starts only at word boundaries, so a long run of word characters
# costs one linear scan (an unanchored `\w+Error` was quadratic: minutes on a 1 MB line).
_ERROR = re.compile(r"\b(?:ERROR|CRITICAL|FATAL|Traceback)\b|Error:|Exception:|\b[A-Za-z_]\w*Error\b")
_WARN = re.compile(r"\bWARN(?:ING)?\b")
SCAN = 4096  # only a line's head decides its colour
SHOW = 2000  # characters of a line shown in the tail pane (the viewer shows more)
FRAME_S = 0.05  # a line after a quiet spell is on screen this long after it arrives
BUSY_S = 0.5  # while lines keep coming, one repaint per this many seconds at most
MARK = "── "  # a restart marker line: "── log was truncated ──"


def line_style(line: str) -> str:
    """The colour of a log line by severity."""
    head = line[:SCAN]
    if line.startswith(MARK) and line.endswith(" ──"):
        return "bold magenta"
    if _ERROR.search(head):
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


class SeverityHighlighter(Highlighter):
    """Colours a whole line by its severity, when the `Log` renders it (visible lines only)."""

    def highlight(self, text: Text) -> None:
        style = line_style(text.plain)
        if style:
            text.stylize(style)


class TailLog(Log):
    """`Log` whose appends never lay the whole screen out again.

    `Log.write_lines` assigns `virtual_size`, a reactive declared with `layout=True`, so
    each append that grows the log re-lays and repaints the whole dashboard (41 % of the
    client's samples at 20 lines/s in py-spy), and measures widths in a thread worker.
    The log's own box never changes size, so here the virtual size is set without a
    layout and only the scrollbars and the log itself are refreshed. Each line is
    styled and rendered once, not again each time the tail scrolls by one line."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._strips: LRUCache[tuple[str, Style], Strip] = LRUCache(256)

    def _render_line_strip(self, y: int, rich_style: Style) -> Strip:
        if self.text_selection is not None:
            return super()._render_line_strip(y, rich_style)
        key = (self._lines[y], rich_style)
        strip = self._strips.get(key)
        if strip is None:
            strip = self._strips[key] = super()._render_line_strip(y, rich_style)
        return strip

    def write_lines(self, lines: Any, scroll_end: bool | None = None) -> TailLog:
        new = [ln for line in lines for ln in line.splitlines()]
        if not new:
            return self
        at_end = self.is_vertical_scroll_end
        self._lines.extend(new)
        if self.max_lines is not None and len(self._lines) > self.max_lines:
            self._prune_max_lines()
        self._width = max(self._width, max(cell_len(self._process_line(ln)) for ln in new))
        size = Size(self._width, len(self._lines))
        if size != self.virtual_size:
            self.set_reactive(Widget.virtual_size, size)
            self._scroll_update(size)
        self.refresh()
        auto = self.auto_scroll if scroll_end is None else scroll_end
        if auto and at_end and not self.is_vertical_scrollbar_grabbed:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
        return self


class LogPane(Vertical):
    DEFAULT_CSS = """
    LogPane Log { height: 1fr; background: $surface; color: $foreground; overflow-x: auto; overflow-y: scroll; }
    LogPane #live { height: auto; max-height: 1; color: $accent; }
    LogPane #note { height: auto; max-height: 1; color: $warning; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._shown = 0  # log.total_lines (less log.prepended) already written
        self._generation = 0
        self._path: str | None = None
        self._pending: LogTail | None = None  # the newest tail not on screen yet
        self._drawn: LogTail | None = None
        self._flushed_at = 0.0  # monotonic time of the last repaint
        self._live: str | None = None  # None: never drawn (an empty Static is one row high)
        self._note = ""
        self._tail_of: tuple[str | None, str | None] | None = None  # (path, sub) whose first tail is drawn

    def compose(self) -> ComposeResult:
        yield Static("", id="note")
        view = TailLog(max_lines=LOG_LINES, highlight=True, auto_scroll=True)
        view.highlighter = SeverityHighlighter()
        yield view
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
        if self._pending is None:
            since = time.monotonic() - self._flushed_at
            # While the first tail still comes, a partial draw would only be drawn over.
            self.set_timer(BUSY_S if first else max(FRAME_S, BUSY_S - since), self.flush)
        self._pending = log

    def flush(self) -> None:
        log, self._pending = self._pending, None
        if log is None:
            return
        self._drawn, self._flushed_at = log, time.monotonic()
        view = self.query_one(Log)
        out: list[str] = []
        if log.path != self._path:  # another run's log: start afresh
            view.clear()
            self._path, self._shown, self._generation = log.path, 0, log.generation
            set_title(self, f"Log {clean(log.path or '(none)', newline=False)}")
        if log.generation != self._generation:
            # The stream restarted (truncation/rotation): mark it instead of clearing,
            # so what the user was reading stays on screen. Line counts start again.
            out.append(f"{MARK}{log.note or 'log restarted'} ──")
            self._generation = log.generation
            self._shown = 0
        new = log.total_lines - log.prepended - self._shown  # lines put before the first tail are not new
        if new > 0:
            # `Log` splits on every line break Python knows and drops empty lines: one row each.
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
