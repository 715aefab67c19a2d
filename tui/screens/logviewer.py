"""`L`: the full-screen log viewer, for logs of any size that live on the host.

Nothing here holds the file: a ``LogDocument`` (tui/state/logindex.py) fetches 1 MiB
blocks with the agent's ``read_range`` into a bounded LRU, and a background worker
counts lines into a sparse index so line numbers appear as it goes. The screen keeps
only the window of lines on display.

Follow mode re-reads the tail on a timer that re-arms itself after each poll: a
``read_range`` at the old end of file returns the new bytes and the new size in one
request. (A ``subscribe`` of its own would put its log events into the client's one
event queue, which the dashboard's reducer consumes as *its* log.)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Input, Static

from tui.state.logindex import Chunk, FileChanged, Line, LogDocument, RootCause
from tui.transport import AgentRequestError, TransportError
from tui.widgets.logtail import _ERROR as ERROR_PATTERN
from tui.widgets.logtail import style_line

CONTEXT = 3  # lines shown above a search hit
POLL_S = 0.5  # follow-mode tail poll


def agent_fetch(client: Any, path: str) -> Callable[[int, int], Awaitable[Chunk]]:
    """A ``LogDocument`` fetch that asks the agent for ``[offset, offset+length)``."""

    async def fetch(offset: int, length: int) -> Chunk:
        r = await client.request("read_range", path=path, offset=offset, length=length)
        return Chunk(int(r["offset"]), base64.b64decode(r["b64"]), int(r["size"]), r.get("inode"))

    return fetch


class LogViewerScreen(Screen[None]):
    DEFAULT_CSS = """
    LogViewerScreen #lv-status { height: 1; background: $panel; color: $text; }
    LogViewerScreen #lv-body { height: 1fr; overflow: hidden; background: $surface; }
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
        Binding("up", "scroll(-1)", "Up", show=False),
        Binding("down", "scroll(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown,space", "page(1)", "Page down", show=False),
        *[Binding(str(d), f"jump({d / 10})", f"Jump to {d}0%", show=False) for d in range(1, 10)],
    ]

    def __init__(self, client: Any, path: str, root_cause: RootCause | None = None,
                 follow: bool = True, index_lines: bool = True, poll_s: float = POLL_S,
                 doc: LogDocument | None = None) -> None:
        super().__init__()
        self.client = client
        self.path = path
        self.root_cause = root_cause
        self.follow = follow
        self.wrap = False
        self.index_lines = index_lines
        self.poll_s = poll_s
        self.doc = doc or LogDocument(agent_fetch(client, path))
        self.pattern: re.Pattern[str] | None = None
        self.matches_only = False
        self.errors_only = False
        self.window: list[Line] = []
        self.top = 0  # line start of the first line shown (or searched from, when filtering)
        self.match: Line | None = None  # the current search hit / root cause, highlighted
        self.searching: float | None = None  # progress of a running search
        self.error: str | None = None
        self._indexing = False

    # ---- layout and lifecycle --------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static("", id="lv-status")
        yield Static("", id="lv-body")
        box = Input(placeholder="regex (lower case = any case) · enter searches · escape cancels", id="lv-search")
        box.display = False
        yield box
        yield Footer()

    def on_mount(self) -> None:
        self._view(self._show_end)
        self.set_timer(self.poll_s, self._poll)

    def on_resize(self) -> None:
        self._view(self._refill)

    @property
    def rows(self) -> int:
        return max(1, self.query_one("#lv-body").size.height or 20)

    # ---- what is shown ---------------------------------------------------------------
    def patterns(self) -> list[re.Pattern[str]]:
        """The active filters (AND-ed); empty when every line is shown."""
        pats = []
        if self.matches_only and self.pattern is not None:
            pats.append(self.pattern)
        if self.errors_only:
            pats.append(ERROR_PATTERN)
        return pats

    async def _lines_from(self, start: int) -> list[Line]:
        pats = self.patterns()
        if pats:
            return await self.doc.collect(start, self.rows, pats)
        return await self.doc.numbered(await self.doc.lines(start, self.rows))

    async def _show_from(self, start: int) -> None:
        """Show the page that starts at ``start``, or the last page if it would be short."""
        lines = await self._lines_from(start)
        if len(lines) < self.rows and start > 0:
            await self._show_end()
            return
        self.top = start
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
        self._set_window(lines)

    async def _refill(self) -> None:
        if self.follow:
            await self._show_end()
        else:
            await self._show_from(self.top)

    async def _scroll(self, k: int) -> None:
        """Move ``k`` lines (shown lines, when filtering) down or up."""
        if k > 0:
            if not self.window:
                return
            if k < len(self.window):
                await self._show_from(self.window[k].start)
            else:
                await self._show_from(self.window[-1].end)
        elif self.top > 0:
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
        self._paint()

    # ---- rendering -------------------------------------------------------------------
    def _paint(self) -> None:
        try:
            body = self.query_one("#lv-body", Static)
        except NoMatches:  # a worker finishing while the screen is torn down
            return
        lines = self.window
        known = [ln.line_no for ln in lines if ln.line_no is not None]
        gutter = len(str(max(known))) if known else 0
        width = max(1, body.size.width - (gutter + 1 if gutter else 0))
        if self.wrap and lines:
            # Wrapped lines take several rows: keep the end in view when following.
            rows, kept = 0, list[Line]()
            seq = reversed(lines) if self.follow else iter(lines)
            for ln in seq:
                need = max(1, math.ceil(len(ln.text) / width))
                if kept and rows + need > self.rows:
                    break
                kept.append(ln)
                rows += need
            lines = list(reversed(kept)) if self.follow else kept
        out = Text(no_wrap=not self.wrap, overflow="crop" if not self.wrap else "fold", end="")
        for i, ln in enumerate(lines):
            if i:
                out.append("\n")
            if gutter:
                no = str(ln.line_no) if ln.line_no is not None else ""
                out.append(no.rjust(gutter) + " ", style="dim")
            t = style_line(ln.text)
            if self.pattern is not None:
                t.highlight_regex(self.pattern, style="bold black on yellow")
            if self.match is not None and ln.start == self.match.start:
                t.stylize("reverse")
            out.append_text(t)
        if not lines:
            out.append("(no lines match)" if self.patterns() else "(empty)", style="dim")
        body.update(out)
        self._render_status()

    def _render_status(self) -> None:
        size = self.doc.size
        parts = [self.path, f"{size / 1048576:.1f} MiB" if size >= 1048576 else f"{size} B"]
        if self.window:
            a, b = self.window[0].line_no, self.window[-1].line_no
            if a is not None and b is not None:
                parts.append(f"lines {a}-{b}" + (f" of {self.doc.index.newlines}" if self._index_done() else ""))
            parts.append(f"{100 * self.window[-1].end // max(1, size)}%")
        flags = [
            "FOLLOW" if self.follow else "",
            f"MATCHES /{self.pattern.pattern}/" if self.matches_only and self.pattern else "",
            "ERRORS" if self.errors_only else "",
            "WRAP" if self.wrap else "",
        ]
        parts += [f for f in flags if f]
        if self.searching is not None:
            parts.append(f"searching… {int(self.searching * 100)}% (escape cancels)")
        elif self.index_lines and not self._index_done():
            parts.append(f"indexing lines {100 * self.doc.index.frontier // max(1, size)}%")
        if self.error:
            parts.append(self.error)
        with contextlib.suppress(NoMatches):
            self.query_one("#lv-status", Static).update(Text("  ·  ".join(parts)))

    def _index_done(self) -> bool:
        return self.doc.size > 0 and self.doc.index.frontier >= self.doc.size

    # ---- workers ---------------------------------------------------------------------
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
            self._render_status()

    def _start_indexer(self) -> None:
        if self.index_lines and not self._indexing and not self._index_done():
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
                if any(ln.line_no is None for ln in self.window) and self.doc.index.knows(self.window[0].start):
                    self.window = await self.doc.numbered(self.window)
                    self._paint()
                else:
                    self._render_status()
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
                self._render_status()
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
        self._render_status()

        def progress(f: float) -> None:
            self.searching = f
            self._render_status()

        try:
            hit = await self.doc.find(start, pats, forward, progress)
        except FileChanged:
            self.searching = None
            await self._guard(self._raise_changed())
            return
        except (AgentRequestError, TransportError) as exc:
            self.searching = None
            self.error = str(exc)
            self._render_status()
            return
        finally:
            self.searching = None
        if hit is None:
            where = "below" if forward else "above"
            self.notify(f"/{self.pattern.pattern}/: no {'' if new else 'more '}matches {where}", severity="warning")
            self._render_status()
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
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("next_match", "prev_match", "toggle_filter"):
            return self.pattern is not None or None
        if action == "root_cause":
            return self.root_cause is not None or None
        return True

    def action_back(self) -> None:
        box = self.query_one("#lv-search", Input)
        if box.display:
            box.display = False
            self.set_focus(None)
        elif self.searching is not None:
            self.workers.cancel_group(self, "search")
            self.searching = None
            self.notify("search cancelled")
            self._render_status()
        else:
            self.dismiss(None)

    def action_toggle_follow(self) -> None:
        self.follow = not self.follow
        if self.follow:
            self.match = None
            self._view(self._show_end)
        self._render_status()

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
            self.notify(f"not a regex: {exc}", severity="error")
            return
        event.input.display = False
        self.set_focus(None)
        self.refresh_bindings()
        if self.matches_only:
            self._view(self._refill)
        else:
            self._search(True, self.top, True)

    def action_next_match(self) -> None:
        if self.pattern is not None:
            start = self.match.end if self.match is not None else self.top
            self._search(True, start, False)

    def action_prev_match(self) -> None:
        if self.pattern is not None:
            start = self.match.start if self.match is not None else self.top
            self._search(False, start, False)

    def action_toggle_filter(self) -> None:
        if self.pattern is None:
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
        self._paint()

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
        self.action_scroll(direction * self.rows)

    def action_jump(self, fraction: float) -> None:
        """Show the line at ``fraction`` of the file's bytes (like less's ``50%``)."""
        self.follow = False

        async def show() -> None:
            await self.doc.refresh()
            await self._show_from(await self.doc.line_start(int(self.doc.size * fraction)))

        self._view(show)

    def action_root_cause(self) -> None:
        rc = self.root_cause
        if rc is not None:
            self._root_cause_worker(rc)

    @work(exclusive=True, group="search")
    async def _root_cause_worker(self, rc: RootCause) -> None:
        try:
            hit = await self.doc.locate(rc)
        except (FileChanged, AgentRequestError, TransportError) as exc:
            self.notify(f"root cause: {exc}", severity="error")
            return
        if hit is None:
            self.notify(f"root cause line {rc.line_no} is no longer in the log", severity="warning")
            return
        self._jump_to(hit)
