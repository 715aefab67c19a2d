"""The terminal (and browser-session) driver the app runs with, and the compositor its
screens paint with. The driver is Textual's own, made to

- hand itself to its app as ``app.terminal`` (notification escapes go through its writer);
- end the app when its screen is gone: a terminal that hung up, a browser session whose
  server is gone (before: a core spinning on the dead terminal, or an app alive unseen);
- sleep while no key comes. Textual's input loops `select()` with a 0.1 s timeout, ten
  wake-ups a second for good, so that a lone Escape gets through after its delay
  (`ESCDELAY`): 0.10-0.17 % of a core, a third of an idle dashboard's cost. Here the
  reader blocks until input comes, and times out only while a lone Escape waits.
"""

from __future__ import annotations

import os
import selectors
import sys
import threading
import time
from codecs import getincrementaldecoder
from typing import Any, Callable, Iterable, Iterator

from rich.console import Console
from rich.control import Control
from textual import constants
from textual._compositor import ChopsUpdate, Compositor
from textual._xterm_parser import XTermParser
from textual.driver import Driver
from textual.drivers.linux_driver import LinuxDriver
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

EXIT_HANGUP = 129  # what a shell reports for a process ended by SIGHUP (128 + 1)
READ_SIZE = 4096


class Waker:
    """A pipe that wakes a thread blocked in `select()` on its read end. Kept for the
    driver's life: closing it while another thread may still write could send that
    byte into whatever file reuses the number."""

    def __init__(self) -> None:
        self.fd, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def wake(self) -> None:
        try:
            os.write(self._w, b"\0")
        except BlockingIOError:  # the pipe is full: it will wake the reader anyway
            pass

    def drain(self) -> None:
        try:
            while os.read(self.fd, 512):
                pass
        except BlockingIOError:
            pass


class WakingEvent(threading.Event):
    """The driver's `exit_event`: setting it also wakes the input thread."""

    def __init__(self, waker: Waker) -> None:
        super().__init__()
        self.waker = waker

    def set(self) -> None:
        super().set()
        self.waker.wake()


def quiet_reads(fd: int, waker: Waker, stopped: Callable[[], bool], delay: float) -> Iterator[bytes]:
    """The bytes `fd` gives as they come, and ``b""`` when the key parser should tick:
    once, `delay` after the last bytes (a lone Escape is sent after that long). Blocks
    while nothing comes. Ends at end of file or a read error (EIO: a terminal that hung
    up), and when `stopped()` is true after a wake."""
    due: float | None = None
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        selector.register(waker.fd, selectors.EVENT_READ)
        while not stopped():
            ready = selector.select(None if due is None else max(due - time.monotonic(), 0.0))
            for key, _ in ready:
                if key.fd == waker.fd:
                    waker.drain()
                    continue
                try:
                    data = os.read(fd, READ_SIZE)
                except BlockingIOError:  # another reader took the bytes (O_NONBLOCK left on the tty)
                    continue
                except OSError:  # EIO: the terminal hung up
                    return
                if not data:
                    return
                yield data
                # Counted from now, once the consumer has parsed `data`: the parser's deadline
                # counts from its feed, which a thread slow off the read (a loaded core, the
                # GIL) makes later than the read. Counted from the read, the one tick could
                # come before it, and a lone Escape would wait for the next key.
                due = time.monotonic() + delay + 0.01
            if due is not None and time.monotonic() >= due:
                due = None
                yield b""


class QuietReader:
    """A browser session's input (the server's pipe on stdin), read as Textual's
    `InputReader` reads it, without its ten wake-ups a second."""

    def __init__(self, fd: int, delay: float) -> None:
        self._fd, self._delay = fd, delay
        self._waker, self._closed = Waker(), threading.Event()

    def close(self) -> None:
        self._closed.set()
        self._waker.wake()

    def __iter__(self) -> Iterator[bytes]:
        return quiet_reads(self._fd, self._waker, self._closed.is_set, self._delay)


def remembering(driver_class: type[Driver]) -> type[Driver]:
    """``driver_class`` (Textual's terminal or web driver) with the three changes the
    module docstring lists. Headless runs (tests) build their own driver, not this one,
    and keep ``app.terminal`` unset."""
    terminal = issubclass(driver_class, LinuxDriver)

    class Remembered(driver_class):  # type: ignore[misc,valid-type]
        def __init__(self, app: Any, **kw: Any) -> None:
            super().__init__(app, **kw)
            app.terminal = self
            self.owner = app
            if terminal:
                self.exit_event = WakingEvent(Waker())
            elif hasattr(self, "_input_reader"):  # the web driver: stdin is the server's pipe
                self._input_reader = QuietReader(sys.__stdin__.fileno() if sys.__stdin__ else 0,
                                                 constants.ESCAPE_DELAY)

        def run_input_thread(self) -> None:
            if terminal:
                self._read_terminal()
            else:
                super().run_input_thread()
            # The input ended while the app was not stopping: its terminal hung up (SIGHUP
            # does not reach an app started through `su`/`sudo`/`nohup`), or a browser
            # session's server is gone (`serve` killed or crashed). Left alone, the app
            # would live on unseen, its SSH link and the host's agent with it.
            if not self.exit_event.is_set():
                end_app(self.owner)

        def _read_terminal(self) -> None:
            """Textual's terminal input loop, reading through `quiet_reads`."""
            parser = XTermParser(self._debug)
            decode = getincrementaldecoder("utf-8")(errors="replace").decode
            for data in quiet_reads(self.fileno, self.exit_event.waker, self.exit_event.is_set,
                                    constants.ESCAPE_DELAY):
                text = decode(data)
                if text:  # (empty: a character's first bytes; feeding "" would end the parser)
                    for event in parser.feed(text):
                        self.process_message(event)
                for event in parser.tick():
                    self.process_message(event)

    return Remembered


def end_app(app: Any) -> None:
    """From a driver's thread: end the app as a hangup would (exit code 129). Posted, not
    waited for (`call_later` is thread-safe; `call_from_thread` would wait): the app's
    loop may be in `disable_input` right now, joining this very thread."""
    app.call_later(app.exit, None, EXIT_HANGUP)


class NarrowCompositor(Compositor):
    """Textual's compositor, rendering for a partial update only the widgets that show
    in one of the regions updated: whose visible part meets the region, and that are not
    behind a widget whose visible part holds all of it. Textual's renders every widget
    whose clip meets the box around them all, and a top-level panel's clip is the whole
    screen: a clock cell and a CPU% cell that moved rendered every panel's lines again,
    and the containers behind a table or the log (the panel, its column, the screen) were
    rendered for a line that the table covers. Chops are filled front to back, the first
    widget to cover a cell wins, so the widgets left out draw nothing that is sent: the
    terminal gets the same bytes (tests/test_dashboard_repaint.py compares the two). A
    screen takes it as its `_compositor`, in its `__init__`."""

    _updating: list[Region] | None = None  # the regions of the partial update being rendered
    _only: list[Region] | None = None  # while its widgets are rendered: those regions

    def render_partial_update(self) -> Any:
        self._updating = list(self._dirty_regions)
        try:
            update = super().render_partial_update()
        finally:
            self._updating = None
        if type(update) is ChopsUpdate:
            return ChopsWithKeptMoves(update.chops, update.spans, update.chop_ends)
        return update

    def _get_renders(self, crop: Region | None = None) -> Iterable[tuple[Region, Region, list[Strip]]]:
        self._only = self._updating  # read by visible_widgets as Textual's generator starts
        try:
            yield from super()._get_renders(crop)
        finally:
            self._only = None

    @property
    def visible_widgets(self) -> dict[Widget, tuple[Region, Region]]:
        shown = super().visible_widgets  # front to back
        only = self._only
        if not only:
            return shown
        kept = {}
        for r in only:
            for w, (region, clip) in shown.items():
                seen = region.intersection(clip)
                if r.overlaps(seen):
                    kept[w] = (region, clip)
                    if seen.contains_region(r):
                        break  # all of `r` is this widget's: those behind it show nothing there
        return {w: place for w, place in shown.items() if w in kept}  # Textual's order


MOVES_KEPT = 8192  # cursor-move sequences kept: a few screens' worth of (x, y)


class ChopsWithKeptMoves(ChopsUpdate):
    """Textual's partial update, written with each cursor move made once: Textual builds
    a Rich `Control` for every chop of every line it sends (a log pane of 16 rows beside
    its scrollbar and borders is ~50 of them), and that was a twentieth of a busy
    dashboard's CPU. The bytes are the same (tests/test_dashboard_repaint.py)."""

    _moves: dict[tuple[int, int], str] = {}

    def render_segments(self, console: Console) -> str:
        moves, out = self._moves, list[str]()
        if len(moves) > MOVES_KEPT:
            moves.clear()
        last_y = self.spans[-1][0]
        for y, x1, x2 in self.spans:
            for end, (x, strip) in zip(self.chop_ends[y], self.chops[y].items()):
                if strip is None or x > x2 or end <= x1:
                    continue
                if not (x2 > x >= x1 and end <= x2):
                    strip = strip.crop(0, min(end, x2) - x)
                move = moves.get((x, y))
                if move is None:
                    move = moves[(x, y)] = Control.move_to(x, y).segment.text
                out.append(move)
                out.append(strip.render(console))
            if y != last_y:
                out.append("\n")
        return "".join(out)
