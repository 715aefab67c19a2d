"""`L`: the full-screen log viewer, for logs of any size that live on the host.

Nothing here holds the file: a ``LogDocument`` (tui/state/logpage/document.py) fetches 1 MiB
blocks with the agent's ``read_range`` into a bounded LRU, and a background worker
counts lines into a sparse index so line numbers appear as it goes. The screen keeps
only the window of lines on display.

Lines are laid out by the screen (its drawing half, `LogPainter` in logpaint.py), not
by the widget: without wrap each line is cut to the width (``→``/``←`` scroll
sideways), with wrap it is folded into rows, so the rows drawn are exactly the rows
there are and the last line of the log is always the last row.

Follow mode re-reads the tail on a timer that re-arms itself after each poll: a
``read_range`` at the old end of file returns the new bytes and the new size in one
request. (A ``subscribe`` of its own would put its log events into the client's one
event queue, which the dashboard's reducer consumes as *its* log.)
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Footer, Input, Static

from tui.state.logpage.document import Chunk, FileChanged, Line, LogDocument, RootCause
from tui.transport import AgentApi, AgentRequestError, TransportError
from tui.views.screens.logpaint import LogPainter
from tui.views.widgets.logtail import ERROR_PATTERN

CONTEXT = 3  # lines shown above a search hit
POLL_S = 0.5  # follow-mode tail poll
HSTEP = 20  # columns per sideways scroll


def agent_fetch(client: AgentApi, path: str) -> Callable[[int, int], Awaitable[Chunk]]:
    """A ``LogDocument`` fetch that asks the agent for ``[offset, offset+length)``."""

    async def fetch(offset: int, length: int) -> Chunk:
        return await client.read_range(path, offset, length)

    return fetch


class _Body(Static):
    """The lines on display. Its height is the page size, so a change re-reads the page."""

    def on_resize(self) -> None:
        if isinstance(self.screen, LogViewerScreen):
            self.screen.body_resized()


class LogViewerScreen(LogPainter):
    """The log viewer: the whole log, fetched in blocks; follow, search, filter, errors, root cause.

    Escape or q goes back to the dashboard."""

    DEFAULT_CSS = """
    LogViewerScreen #lv-status { height: 1; background: $panel; color: $text; }
    LogViewerScreen #lv-body { height: 1fr; overflow: hidden; background: $surface; text-wrap: nowrap; }
    LogViewerScreen #lv-search { dock: bottom; }
    """
    AUTO_FOCUS = ""  # nothing focused: keys go to the screen's bindings until `/` opens the search box
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "back", "Back"),
        Binding("f", "toggle_follow", "Follow"),
        Binding("slash", "search", "Search"),
        Binding("n", "next_match", "Next"),
        Binding("N", "prev_match", "Prev"),
        Binding("m", "toggle_filter", "Matches only"),
        Binding("e", "toggle_errors", "Errors only"),
        Binding("g,home", "top", "Top"),
        Binding("G,end", "bottom", "Bottom"),
        Binding("r", "root_cause", "Root cause"),
        Binding("w", "toggle_wrap", "Wrap"),
        Binding("left", "hscroll(-1)", "Left", show=False),
        Binding("right", "hscroll(1)", "Right", show=False),
        Binding("up", "scroll(-1)", "Up", show=False),
        Binding("down", "scroll(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown,space", "page(1)", "Page down", show=False),
        *[Binding(str(d), f"jump({d / 10})", f"Jump to {d}0%", show=False) for d in range(1, 10)],
    ]

    def __init__(self, client: AgentApi, path: str, root_cause: RootCause | None = None,
                 follow: bool = True, index_lines: bool = True, poll_s: float = POLL_S,
                 doc: LogDocument | None = None) -> None:
        super().__init__()
        self.client = client
        self.path = path
        self.root_cause = root_cause
        self.follow = follow
        self.wrap = False
        self.hscroll = 0  # columns cut from the left of every line when not wrapping
        self.index_lines = index_lines
        self.poll_s = poll_s
        self.doc = doc or LogDocument(agent_fetch(client, path))
        self.pattern: re.Pattern[str] | None = None
        self.matches_only = False
        self.errors_only = False
        self.window: list[Line] = []
        self.top = 0  # line start of the first line shown (or searched from, when filtering)
        self.at_end = True  # the window was read from the end (it opens there): keep the end in view
        self.on_screen: list[Line] = []  # the lines of `window` on screen (maybe cut at one edge)
        self.whole = 0  # how many of those are shown whole
        self.match: Line | None = None  # the current search hit / root cause, highlighted
        self.searching: float | None = None  # progress of a running search
        self.error: str | None = None
        self._indexing = False

    # ---- layout and lifecycle --------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static("", id="lv-status")
        yield _Body("", id="lv-body")
        box = Input(placeholder="regex (lower case = any case) · enter searches · escape cancels", id="lv-search")
        box.display = False
        yield box
        yield Footer()

    def on_mount(self) -> None:
        self._view(self._show_end)
        self.set_timer(self.poll_s, self._poll)

    def on_resize(self) -> None:
        self._view(self._refill)

    def body_resized(self) -> None:
        """The body changed height (the terminal, or the search box opening): re-read a page."""
        self._view(self._refill)

    # ---- what is shown ---------------------------------------------------------------
    async def _lines_from(self, start: int) -> list[Line]:
        pats = self.patterns()
        if pats:
            return await self.doc.collect(start, self.rows, pats)
        return await self.doc.numbered(await self.doc.lines(start, self.rows))

    async def _show_from(self, start: int) -> None:
        """Show the page that starts at ``start``, or the last page if it would be short."""
        lines = await self._lines_from(start)
        if start > 0 and self.rows_needed(lines) < self.rows:
            await self._show_end()
            return
        self.top = start
        self.at_end = False
        self._set_window(lines)

    async def _show_end(self) -> None:
        await self.doc.refresh()
        pats = self.patterns()
        if pats:
            lines = await self.doc.collect(self.doc.size, self.rows, pats, forward=False)
        else:
            start = await self.doc.skip_back(self.doc.size, self.rows)
            lines = await self.doc.numbered(await self.doc.lines(start, self.rows))
        self.top = lines[0].start if lines else self.doc.size
        self.at_end = True
        self._set_window(lines)

    async def _refill(self) -> None:
        if self.follow or self.at_end:
            await self._show_end()
        else:
            await self._show_from(self.top)

    async def _scroll(self, k: int) -> None:
        """Move ``k`` lines (shown lines, when filtering) down or up."""
        if k > 0:
            shown = self.on_screen or self.window
            if not shown:
                return
            if k < len(shown):
                await self._show_from(shown[k].start)
            else:
                await self._show_from(shown[-1].end)
        elif self.top > 0 or (self.at_end and len(self.on_screen) > self.whole):
            if self.at_end and len(self.on_screen) > self.whole:
                k += 1  # the top line is cut: the first step up shows it from its start
            if k == 0:
                await self._show_from(self.top)
                return
            pats = self.patterns()
            if pats:
                prev = await self.doc.collect(self.top, -k, pats, forward=False)
                start = prev[0].start if prev else self.top
            else:
                start = await self.doc.skip_back(self.top, -k)
            await self._show_from(start)

    def _set_window(self, lines: list[Line]) -> None:
        self.window = lines
        self.error = None
        self.paint()

    def _view(self, job: Callable[[], Awaitable[None]]) -> None:
        """Run one view change; a newer one cancels an older one still fetching."""
        self._view_worker(job)

    @work(exclusive=True, group="view")
    async def _view_worker(self, job: Callable[[], Awaitable[None]]) -> None:
        await self._guard(job())
        self._start_indexer()

    async def _guard(self, coro: Awaitable[None]) -> None:
        """Run ``coro``; a fetch failure or a replaced file becomes a status line, not a crash."""
        try:
            await coro
        except FileChanged:
            self.notify("the log was truncated or replaced: showing its end", severity="warning")
            self.match = None
            self.follow = True
            self._view(self._show_end)
        except (AgentRequestError, TransportError) as exc:
            self.error = str(exc)
            self.render_status()

    def _start_indexer(self) -> None:
        if self.index_lines and not self._indexing and not self.index_done():
            self._indexing = True
            self._indexer()

    @work(exclusive=True, group="index")
    async def _indexer(self) -> None:
        """Count lines from the top, a chunk at a time, so line numbers become known."""
        try:
            while True:
                if self.searching is not None:  # a search scans too: let it have the link
                    await self._pause(0.05)
                    continue
                more = await self.doc.index_step()
                shown = self.window
                if any(ln.line_no is None for ln in shown) and self.doc.index.knows(shown[0].start):
                    numbered = await self.doc.numbered(shown)
                    if self.window is shown:  # a view change while numbering wins (g, a jump)
                        self.window = numbered
                        self.paint()
                else:
                    self.render_status()
                if not more:
                    break
        except (FileChanged, AgentRequestError, TransportError):
            pass  # the view worker reports these; indexing restarts with the next view change
        finally:
            self._indexing = False

    async def _pause(self, s: float) -> None:
        await asyncio.sleep(s)

    def _poll(self) -> None:
        self._poll_worker()

    @work(exclusive=True, group="poll")
    async def _poll_worker(self) -> None:
        """Follow mode: re-read the tail, then re-arm (polls never overlap)."""
        try:
            before = self.doc.size
            if self.follow and self.searching is None:
                await self._guard(self._follow_tick(before))
            elif self.doc.size:
                await self._guard(self._refresh())
                self.render_status()
        finally:
            self.set_timer(self.poll_s, self._poll)

    async def _refresh(self) -> None:
        if await self.doc.refresh():
            raise FileChanged("reset")

    async def _follow_tick(self, before: int) -> None:
        if await self.doc.refresh():
            raise FileChanged("reset")
        if self.doc.size != before or not self.window:
            self._view(self._show_end)

    @work(exclusive=True, group="search")
    async def _search(self, forward: bool, start: int, new: bool) -> None:
        """Find the next/previous line matching the search pattern, without blocking the UI."""
        assert self.pattern is not None
        pats = [self.pattern] + ([ERROR_PATTERN] if self.errors_only else [])
        self.searching = 0.0
        self.render_status()

        def progress(f: float) -> None:
            self.searching = f
            self.render_status()

        try:
            hit = await self.doc.find(start, pats, forward, progress)
        except FileChanged:
            self.searching = None
            await self._guard(self._raise_changed())
            return
        except (AgentRequestError, TransportError) as exc:
            self.searching = None
            self.error = str(exc)
            self.render_status()
            return
        finally:
            self.searching = None
        if hit is None:
            where = "below" if forward else "above"
            self.notify(f"/{self.pattern.pattern}/: no {'' if new else 'more '}matches {where}",
                        severity="warning", markup=False)
            self.render_status()
            return
        self._jump_to(hit)
        self._start_indexer()

    async def _raise_changed(self) -> None:
        raise FileChanged("reset")

    def _jump_to(self, hit: Line) -> None:
        """Show ``hit`` a few lines below the top, highlighted; follow stops."""
        self.match = hit
        self.follow = False

        async def show() -> None:
            start = hit.start
            if not self.patterns():
                start = await self.doc.skip_back(hit.start, min(CONTEXT, self.rows // 3))
            await self._show_from(start)

        self._view(show)

    # ---- actions ---------------------------------------------------------------------
    # No check_action: every binding stays enabled. A disabled one lets its key fall
    # through to the dashboard's binding of the same key (`r` there relaunches the run);
    # an action that does not apply says so instead.

    def _no_search(self) -> bool:
        """True (after telling the user) when there is no search pattern yet."""
        if self.pattern is None:
            self.notify("no search yet: / searches", severity="warning")
            return True
        return False

    def action_back(self) -> None:
        box = self.query_one("#lv-search", Input)
        if box.display:
            box.display = False
            self.set_focus(None)
        elif self.searching is not None:
            self.workers.cancel_group(self, "search")
            self.searching = None
            self.notify("search cancelled")
            self.render_status()
        else:
            self.dismiss(None)

    def action_toggle_follow(self) -> None:
        self.follow = not self.follow
        if self.follow:
            self.match = None
            self._view(self._show_end)
        self.render_status()

    def action_search(self) -> None:
        box = self.query_one("#lv-search", Input)
        box.display = True
        box.value = self.pattern.pattern if self.pattern else ""
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value
        if not text:
            return
        flags = 0 if any(c.isupper() for c in text) else re.IGNORECASE
        try:
            self.pattern = re.compile(text, flags)
        except re.error as exc:
            self.notify(f"not a regex: {exc}", severity="error", markup=False)
            return
        event.input.display = False
        self.set_focus(None)
        if self.matches_only:
            self._view(self._refill)
        else:
            self._search(True, self.top, True)

    def action_next_match(self) -> None:
        if not self._no_search():
            start = self.match.end if self.match is not None else self.top
            self._search(True, start, False)

    def action_prev_match(self) -> None:
        if not self._no_search():
            start = self.match.start if self.match is not None else self.top
            self._search(False, start, False)

    def action_toggle_filter(self) -> None:
        if self._no_search():
            return
        self.matches_only = not self.matches_only
        self._refilter()

    def action_toggle_errors(self) -> None:
        self.errors_only = not self.errors_only
        self._refilter()

    def _refilter(self) -> None:
        """Re-show with the new filters, keeping the highlighted line in view if it is."""
        hit = self.match
        if hit is not None and not self.follow and any(ln.start == hit.start for ln in self.window):
            self._jump_to(hit)
        else:
            self._view(self._refill)

    def action_toggle_wrap(self) -> None:
        self.wrap = not self.wrap
        self.paint()

    def action_hscroll(self, direction: int) -> None:
        """Scroll sideways by ``HSTEP`` columns (no wrap only; wrap shows whole lines)."""
        if self.wrap:
            self.notify("wrap is on: every column is shown (w turns it off)")
            return
        self.hscroll = max(0, self.hscroll + direction * HSTEP)
        self.paint()

    def action_top(self) -> None:
        self.follow = False
        self._view(lambda: self._show_from(0))

    def action_bottom(self) -> None:
        self._view(self._show_end)

    def action_scroll(self, k: int) -> None:
        if k < 0:
            self.follow = False
        self._view(lambda: self._scroll(k))

    def action_page(self, direction: int) -> None:
        # A page is the lines shown whole: with wrap that can be fewer lines than rows, and
        # a line cut at the bottom edge starts the next page.
        self.action_scroll(direction * max(1, self.whole if self.on_screen else self.rows))

    def action_jump(self, fraction: float) -> None:
        """Show the line at ``fraction`` of the file's bytes (like less's ``50%``)."""
        self.follow = False

        async def show() -> None:
            await self.doc.refresh()
            await self._show_from(await self.doc.line_start(int(self.doc.size * fraction)))

        self._view(show)

    def action_root_cause(self) -> None:
        rc = self.root_cause
        if rc is None:
            self.notify("no root cause in this log")
            return
        self._root_cause_worker(rc)

    @work(exclusive=True, group="search")
    async def _root_cause_worker(self, rc: RootCause) -> None:
        try:
            hit = await self.doc.locate(rc)
        except (FileChanged, AgentRequestError, TransportError) as exc:
            self.notify(f"root cause: {exc}", severity="error", markup=False)
            return
        if hit is None:
            self.notify(f"root cause line {rc.line_no} is no longer in the log", severity="warning")
            return
        self._jump_to(hit)
