"""The log tail: a bounded RichLog that only ever appends the new lines, plus one
line below it for the bar being redrawn in place (`\\r` without a newline)."""

from __future__ import annotations

import re
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import RichLog, Static

from tui.state.model import LOG_LINES, LogTail

# `\b[A-Za-z_]\w*Error` starts only at word boundaries, so a long run of word characters
# costs one linear scan (an unanchored `\w+Error` was quadratic: minutes on a 1 MB line).
_ERROR = re.compile(r"\b(?:ERROR|CRITICAL|FATAL|Traceback)\b|Error:|Exception:|\b[A-Za-z_]\w*Error\b")
_WARN = re.compile(r"\bWARN(?:ING)?\b")
SCAN = 4096  # only a line's head decides its colour
SHOW = 2000  # characters of a line shown in the tail pane (the viewer shows more)


def style_line(line: str) -> Text:
    """Colour a log line by severity; markup in the log is never interpreted."""
    head = line[:SCAN]
    shown = line if len(line) <= SHOW else line[:SHOW] + f" … (+{len(line) - SHOW} chars)"
    if _ERROR.search(head):
        return Text(shown, style="red")
    if _WARN.search(head):
        return Text(shown, style="yellow")
    if "Loading" in head and "Completed" in head:
        return Text(shown, style="cyan")
    return Text(shown)


class LogPane(Vertical):
    DEFAULT_CSS = """
    LogPane RichLog { height: 1fr; background: $surface; }
    LogPane #live { height: auto; max-height: 1; color: $accent; }
    LogPane #note { height: auto; max-height: 1; color: $warning; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._shown = 0  # log.total_lines already written
        self._generation = 0
        self._path: str | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="note")
        yield RichLog(max_lines=LOG_LINES, wrap=False, markup=False, auto_scroll=True)
        yield Static("", id="live")

    def show(self, log: LogTail) -> None:
        view = self.query_one(RichLog)
        if log.path != self._path:  # another run's log: start afresh
            view.clear()
            self._path, self._shown, self._generation = log.path, 0, log.generation
        if log.generation != self._generation:
            # The stream restarted (truncation/rotation): mark it instead of clearing,
            # so what the user was reading stays on screen. Line counts start again.
            view.write(Text(f"── {log.note or 'log restarted'} ──", style="bold magenta"))
            self._generation = log.generation
            self._shown = 0
        new = log.total_lines - self._shown
        if new > 0:
            for line in log.lines[-min(new, len(log.lines)) :]:
                view.write(style_line(line))
            self._shown = log.total_lines
        self.query_one("#live", Static).update(Text(log.live[-500:]))
        self.query_one("#note", Static).update(log.note or "")
        self.border_title = f"Log {log.path or '(none)'}"
