"""Small text renderers shared by widgets: bars, sparklines, N/A-aware numbers; and the
terminal writer for notification escapes."""

from __future__ import annotations

import os
import select
import threading
from typing import TYPE_CHECKING, Any, Iterable

from rich.text import Text

if TYPE_CHECKING:
    from textual.driver import Driver

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
    the driver an app built by `remembering` hands it as ``app.terminal``."""
    terminal = getattr(app, "terminal", None)
    if not app.is_headless and terminal is not None:
        terminal.write(seq)


def remembering(driver_class: type[Driver]) -> type[Driver]:
    """``driver_class``, made to hand each driver it builds to its app as ``app.terminal``.

    Textual writes to the terminal through its driver and keeps the one it built private;
    an app's ``get_driver_class`` (public) returns this instead, so `terminal_write`
    reaches the same writer without Textual's internals. The driver also ends the app
    when its screen is gone: a terminal that hangs up (`watch_hangup`), a browser
    session's input that ends (`run_input_thread`). Headless runs (tests) build their
    own driver, not this one, and keep ``app.terminal`` unset."""

    class Remembered(driver_class):  # type: ignore[misc,valid-type]
        def __init__(self, app: Any, **kw: Any) -> None:
            super().__init__(app, **kw)
            app.terminal = self
            self.owner = app

        def start_application_mode(self) -> None:
            super().start_application_mode()
            fd = getattr(self, "fileno", None)
            if isinstance(fd, int) and os.isatty(fd) and not getattr(self, "watching", False):
                self.watching = True  # once: a resume (after Ctrl+Z) starts application mode again
                threading.Thread(target=watch_hangup, args=(self.owner, fd), daemon=True,
                                 name="eagle3-hangup").start()

        def run_input_thread(self) -> None:
            super().run_input_thread()
            # The input ended while the app was not stopping: a browser session's server is
            # gone (its pipe closed: `serve` killed or crashed). Left alone, the app would
            # live on unseen, its SSH link and the host's agent with it.
            exit_event = getattr(self, "exit_event", None)
            if exit_event is not None and not exit_event.is_set():
                end_app(self.owner)

    return Remembered


EXIT_HANGUP = 129  # what a shell reports for a process ended by SIGHUP (128 + 1)


def watch_hangup(app: Any, fd: int) -> None:
    """End the app when its terminal hangs up (the window closed, the SSH session
    dropped), at no cost until then: poll asks for no event, so it wakes only for
    POLLHUP/POLLERR/POLLNVAL. SIGHUP usually ends the app first, but not when it never
    arrives (started through `su`/`sudo`, `nohup`, a wrapper that does not pass it on):
    Textual's input thread then reads the dead terminal's empty reads in a loop, a core
    busy for good."""
    poller = select.poll()
    poller.register(fd, 0)
    while not any(mask & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, mask in poller.poll()):
        pass
    end_app(app)


def end_app(app: Any) -> None:
    """From a driver's thread: end the app as a hangup would (exit code 129)."""
    try:
        app.call_from_thread(app.exit, None, EXIT_HANGUP)
    except RuntimeError:  # the app had already stopped
        pass


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
