"""Small text renderers shared by widgets: bars, sparklines, N/A-aware numbers; and the
terminal writer for notification escapes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from rich.style import Style
from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

# A plain mixin at run time: Textual inherits CSS and component classes along each
# class's first DOMNode base, so a Widget subclass put first would hide DataTable's.
if TYPE_CHECKING:
    _Mixin = Widget
else:
    _Mixin = object

BLOCKS = "▁▂▃▄▅▆▇█"


def bar(fraction: float | None, width: int, style: str = "green") -> Text:
    """A horizontal bar; an unknown fraction draws a dim N/A track, not an empty bar."""
    width = max(width, 1)
    if fraction is None:
        return Text("·" * width, style="dim")
    fraction = min(max(fraction, 0.0), 1.0)
    full = round(fraction * width)
    if fraction >= 0.9:
        style = "red" if style == "green" else style
    elif fraction >= 0.7:
        style = "yellow" if style == "green" else style
    return Text.assemble(("█" * full, style), ("░" * (width - full), "grey37"))


def sparkline(values: Iterable[float | None], width: int, top: float = 1.0) -> Text:
    """Values as block characters, squeezed into `width` cells by taking each bucket's
    peak (so the whole history stays visible); missing samples are blank."""
    vals = list(values) if width > 0 else []
    if len(vals) > width:
        step = len(vals) / width
        buckets = [vals[int(i * step) : int((i + 1) * step)] for i in range(width)]
        vals = [max((v for v in b if v is not None), default=None) for b in buckets]
    out = Text(" " * (width - len(vals)))
    for v in vals:
        if v is None:
            out.append(" ")
            continue
        level = min(max(v / top, 0.0), 1.0)
        out.append(BLOCKS[min(int(level * len(BLOCKS)), len(BLOCKS) - 1)], style="cyan")
    return out


def terminal_write(app: Any, seq: str) -> None:
    """Bell and desktop-notification escapes, through Textual's own writer (not in tests):
    the driver an app built by `tui.views.driver.remembering` hands it as ``app.terminal``."""
    terminal = getattr(app, "terminal", None)
    if not app.is_headless and terminal is not None:
        terminal.write(seq)


def set_title(widget: Any, title: str | None) -> None:
    """Set a border title only when it changed: every assignment repaints the widget.
    The title is plain text (a str title is parsed as markup, and titles carry run ids
    and log paths from the host)."""
    if getattr(widget, "_shown_title", None) != title:
        widget._shown_title = title
        widget.border_title = None if title is None else Text(title)


def set_content(static: Any, content: Text | str, layout: bool = True) -> bool:
    """`Static.update` only when the content changed (an update lays the screen out
    again); True when it was updated. A str is shown as plain text, never markup."""
    if isinstance(content, str):
        content = Text(content)
    key = (content.plain, tuple(content.spans), str(content.style)) if isinstance(content, Text) else content
    if getattr(static, "_shown_content", None) == key:  # (Text's own == ignores its style)
        return False
    static._shown_content = key
    static.update(content, layout=layout)
    return True


class StyleOncePerRepaint(_Mixin):
    """A line-API widget's `rich_style`, made once per repaint: each call walks up the
    DOM, and `render_line` wants it for every line (DataTable three times a line). Put
    it first among the bases (`class TailLog(StyleOncePerRepaint, ScrollView)`)."""

    _base: Style | None = None  # the widget's style while a repaint runs

    def render_lines(self, crop: Region) -> list[Strip]:
        self._base = super().rich_style
        try:
            return super().render_lines(crop)
        finally:
            self._base = None

    @property
    def rich_style(self) -> Style:
        return self._base if self._base is not None else super().rich_style
