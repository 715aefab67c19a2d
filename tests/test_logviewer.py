"""The log viewer screen in Pilot, reading a real temp log through the real local agent.

The client is ``AgentClient(LocalLink())``: ``remote/agent/main.py`` runs as a subprocess and
serves ``read_range``, as it does on a GPU host. Tests poll the screen's state with a
deadline (``pilot.pause``), never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.app import App
from textual.binding import Binding
from textual.geometry import Region
from textual.widget import Widget
from textual.widgets import Input, Static

from tui.state.logpage.document import Line, LogDocument, RootCause
from tui.transport import AgentClient
from tui.views.screens.logviewer import LogViewerScreen

N = 5000  # lines in the test log
ERRORS = {1234: "ERROR worker.py:88] CUDA out of memory", 4321: "ValueError: bad shard index"}


def line_text(i: int) -> str:
    if i in ERRORS:
        return f"line {i} {ERRORS[i]}"
    if i == 2500:
        return "line 2500 needle-in-the-haystack"
    return f"INFO 01-01 12:00:00 [model_runner.py:42] line {i} step={i * 7 % 1000}"


def append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


@pytest.fixture
def log(tmp_path: Path) -> Path:
    p = tmp_path / "run.log"
    p.write_text("".join(line_text(i) + "\n" for i in range(1, N + 1)))
    return p


# Every key the viewer binds, also bound by the app below it (as the dashboard binds
# `r` to Relaunch): a viewer key must never reach the app.
VIEWER_KEYS = ["r", "f", "m", "e", "n", "N", "g", "G", "w", "slash", "left", "right",
               *[str(d) for d in range(1, 10)]]


class ViewerApp(App[None]):
    """The viewer pushed over an app that binds the viewer's keys itself and records them."""

    BINDINGS = [Binding(",".join(VIEWER_KEYS), "app_key", "App key")]

    def __init__(self, screen: LogViewerScreen) -> None:
        super().__init__()
        self.viewer = screen
        self.app_keys = 0  # app bindings that ran: must stay 0 while the viewer is on top
        self.notes: list[str] = []

    def on_mount(self) -> None:
        self.push_screen(self.viewer)

    def action_app_key(self) -> None:
        self.app_keys += 1

    def notify(self, message: str, **kw: object) -> None:  # type: ignore[override]
        self.notes.append(message)
        super().notify(message, **kw)  # type: ignore[arg-type]


def make(client: AgentClient, log: Path, **kw: object) -> tuple[ViewerApp, LogViewerScreen]:
    # Small blocks and index spacing, so a 5000-line file crosses many boundaries.
    from tui.views.screens.logviewer import agent_fetch

    doc = LogDocument(agent_fetch(client, str(log)), block=16384, max_blocks=4, every=256, scan_chunk=32768)
    screen = LogViewerScreen(client=client, path=str(log), doc=doc, poll_s=0.05, **kw)  # type: ignore[arg-type]
    return ViewerApp(screen), screen


async def wait_for(pilot: object, cond: Callable[[], object], what: str, timeout: float = 30) -> None:
    # 30 s: under a full suite on a loaded 2-core machine the line indexer (which numbers
    # the window) can take several times its usual ~1 s; a hang still fails.
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await pilot.pause(0.02)  # type: ignore[attr-defined]


def shown(screen: LogViewerScreen) -> list[tuple[int | None, str]]:
    return [(ln.line_no, ln.text) for ln in screen.window]


def body_text(screen: LogViewerScreen) -> str:
    return str(screen.query_one("#lv-body", Static).render())


def drawn(widget: Widget) -> list[str]:
    """The rows the widget draws on the terminal, as text (after Textual's own layout)."""
    w, h = widget.size
    return ["".join(seg.text for seg in strip) for strip in widget.render_lines(Region(0, 0, w, h))]


async def search(pilot: object, screen: LogViewerScreen, text: str) -> None:
    await pilot.press("slash")  # type: ignore[attr-defined]
    box = screen.query_one("#lv-search", Input)
    await wait_for(pilot, lambda: box.has_focus, "the search box")
    box.value = text
    await pilot.press("enter")  # type: ignore[attr-defined]


async def test_opens_at_the_end_with_line_numbers_and_scrolls(client: AgentClient, log: Path) -> None:
    app, screen = make(client, log)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: screen.window and screen.window[-1].line_no == N, "the numbered last page")
        assert screen.window[-1].text == line_text(N)
        rows = len(screen.window)
        assert rows >= 20
        assert f"{N} {line_text(N)}" in body_text(screen)
        await pilot.press("g")
        await wait_for(pilot, lambda: screen.window[0].line_no == 1, "the top")
        assert [t for _, t in shown(screen)] == [line_text(i) for i in range(1, rows + 1)]
        await pilot.press("pagedown")
        await wait_for(pilot, lambda: screen.window[0].line_no == rows + 1, "page down")
        await pilot.press("down", "down", "up")
        await wait_for(pilot, lambda: screen.window[0].line_no == rows + 2, "arrows")
        await pilot.press("G")
        await wait_for(pilot, lambda: screen.window[-1].line_no == N, "the bottom")
        assert screen.doc.cache.held_blocks <= 4


async def test_search_next_prev_and_filter(client: AgentClient, log: Path) -> None:
    app, screen = make(client, log, follow=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: screen.window, "the first page")
        await pilot.press("g")
        await wait_for(pilot, lambda: screen.window and screen.window[0].line_no == 1, "the top")
        await search(pilot, screen, "needle")
        await wait_for(pilot, lambda: screen.match is not None, "the search hit")
        assert screen.match is not None and screen.match.line_no == 2500
        await wait_for(pilot, lambda: any(no == 2500 for no, _ in shown(screen)), "the hit on screen")
        # n / N walk the matches of "line 12\d\d " (upper case: case-sensitive)
        await search(pilot, screen, r"line 12\d\d ")
        await wait_for(pilot, lambda: screen.match is not None and screen.match.line_no == 2500, "unchanged")
        await pilot.press("N")
        await wait_for(pilot, lambda: screen.match is not None and screen.match.line_no == 1299, "previous match")
        await pilot.press("N")
        await wait_for(pilot, lambda: screen.match is not None and screen.match.line_no == 1298, "previous again")
        await pilot.press("n")
        await wait_for(pilot, lambda: screen.match is not None and screen.match.line_no == 1299, "next match")
        # m: only lines matching the pattern
        await pilot.press("m")
        await wait_for(pilot, lambda: screen.matches_only and screen.window
                       and all(" line 12" in ln.text for ln in screen.window), "the filter")
        assert all(ln.line_no is not None and 1200 <= ln.line_no <= 1299 for ln in screen.window)
        assert "MATCHES" in str(screen.query_one("#lv-status", Static).render())
        await pilot.press("m")
        await wait_for(pilot, lambda: any("line 12" not in ln.text for ln in screen.window), "filter off")


async def test_a_jump_while_the_indexer_numbers_the_old_page_wins(client: AgentClient, log: Path) -> None:
    # The indexer numbers the page on screen with awaits in between; a `g` that lands
    # meanwhile must not be undone when the indexer puts its (old) numbered page back.
    app, screen = make(client, log, follow=False)
    numbering, release = asyncio.Event(), asyncio.Event()
    real = screen.doc.numbered

    async def held(lines: list[Line]) -> list[Line]:
        if lines is screen.window and lines and lines[0].line_no is None:  # the indexer's call
            numbering.set()
            await release.wait()
        return await real(lines)

    screen.doc.numbered = held  # type: ignore[method-assign]
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, numbering.is_set, "the indexer numbering the last page")
        await pilot.press("g")
        await wait_for(pilot, lambda: screen.window and screen.window[0].line_no == 1, "the top")
        release.set()
        await wait_for(pilot, lambda: not screen._indexing, "the indexer done")
        await pilot.pause(0.1)
        assert screen.window[0].line_no == 1, shown(screen)[:2]


async def test_errors_only_and_root_cause(client: AgentClient, log: Path) -> None:
    # The dashboard saw the last 4000 lines; its root cause was its line 4321 - 1000.
    rc = RootCause(end_offset=log.stat().st_size, lines_back=N - 4321 + 1, text=line_text(4321), line_no=3321)
    app, screen = make(client, log, root_cause=rc)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: screen.window, "the first page")
        await pilot.press("e")
        await wait_for(pilot, lambda: screen.errors_only and len(screen.window) == 2, "errors only")
        assert shown(screen) == [(1234, line_text(1234)), (4321, line_text(4321))]
        await pilot.press("e")
        await wait_for(pilot, lambda: len(screen.window) > 2, "all lines again")
        await pilot.press("g")
        await wait_for(pilot, lambda: screen.window[0].line_no == 1, "the top")
        await pilot.press("r")
        await wait_for(pilot, lambda: screen.match is not None, "the root cause")
        assert screen.match is not None and screen.match.line_no == 4321
        await wait_for(pilot, lambda: any(no == 4321 for no, _ in shown(screen)), "root cause on screen")
        assert not screen.follow


async def test_follow_shows_appended_lines_and_escape_cancels(client: AgentClient, log: Path) -> None:
    app, screen = make(client, log)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: screen.window and screen.window[-1].line_no == N, "the last page")
        append(log, "appended after open ERROR\n")
        await wait_for(pilot, lambda: screen.window[-1].text == "appended after open ERROR", "the appended line")
        await wait_for(pilot, lambda: screen.window[-1].line_no == N + 1, "its line number")
        # f off: new lines do not move the view
        await pilot.press("f")
        top = screen.window[0].start
        append(log, "not followed\n")
        await wait_for(pilot, lambda: screen.doc.size == log.stat().st_size, "the new size")
        assert screen.window[0].start == top and screen.window[-1].text != "not followed"
        # escape closes the search box first, then leaves the screen
        await pilot.press("slash")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not screen.query_one("#lv-search").display, "search box closed")
        assert app.screen is screen
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is not screen, "back to the dashboard")


async def test_inapplicable_keys_are_consumed_not_passed_to_the_app(client: AgentClient, log: Path) -> None:
    # No root cause and no search: r, n, N and m do not apply, and must say so, not fall through.
    app, screen = make(client, log, follow=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: screen.window, "the first page")
        await pilot.press("r")
        await wait_for(pilot, lambda: app.notes or app.app_keys, "r to be handled")
        assert app.app_keys == 0, "r fell through to the app (the dashboard's Relaunch)"
        assert app.notes == ["no root cause in this log"]
        for key in ("n", "N", "m"):
            await pilot.press(key)
        await wait_for(pilot, lambda: len(app.notes) + app.app_keys == 4, "n, N, m to be handled")
        assert app.app_keys == 0 and app.notes[1:] == ["no search yet: / searches"] * 3
        await pilot.press("f", "f", "e", "e", "w", "w", "right", "left", "g", "G", *[str(d) for d in range(1, 10)])
        await pilot.pause(0.1)
        assert app.screen is screen and app.app_keys == 0
        # Typed into the search box, the same keys are text, not commands.
        await pilot.press("slash")
        box = screen.query_one("#lv-search", Input)
        await wait_for(pilot, lambda: box.has_focus, "the search box")
        await pilot.press("r", "N", "5")
        await wait_for(pilot, lambda: box.value == "rN5", "typed text")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not box.display, "search box closed")
        assert app.app_keys == 0
        # After a search, n and m work.
        await pilot.press("g")
        await wait_for(pilot, lambda: screen.window[0].line_no == 1, "the top")
        await search(pilot, screen, "needle")
        await wait_for(pilot, lambda: screen.match is not None and screen.match.line_no == 2500, "the hit")
        await pilot.press("m")
        await wait_for(pilot, lambda: screen.matches_only and [no for no, _ in shown(screen)] == [2500], "the filter")
        assert app.app_keys == 0


@pytest.fixture
def wide_log(tmp_path: Path) -> Path:
    """83 lines, each longer than 100 columns, under a long directory (as QA's was)."""
    d = tmp_path / "runs" / "eagle3-extract-llama-3.1-8b-instruct-2026-01-01-123456" / "logs"
    d.mkdir(parents=True)
    p = d / "run.log"
    p.write_text("".join(f"{line_text(i)} " + "pad " * 20 + f"end-of-{i}\n" for i in range(1, 84)))
    return p


async def test_no_wrap_crops_and_the_last_line_is_the_last_row(client: AgentClient, wide_log: Path) -> None:
    app, screen = make(client, wide_log)
    async with app.run_test(size=(100, 30)) as pilot:
        body = screen.query_one("#lv-body", Static)
        status = screen.query_one("#lv-status", Static)
        await wait_for(pilot, lambda: screen.window and screen.window[-1].line_no == 83, "the numbered last page")
        await wait_for(pilot, lambda: drawn(body)[-1].startswith("83 "), "line 83 in the last row")
        rows = drawn(body)
        assert len(rows) == body.size.height == screen.rows
        first = 83 - len(rows) + 1
        # One row per line, none wrapped: each row starts with its line number, cut with "…".
        assert [r.split(" ", 1)[0] for r in rows] == [str(i) for i in range(first, 84)]
        assert all(r.rstrip().endswith("…") for r in rows)
        head = drawn(status)[0]
        assert head.startswith("FOLLOW") and f"lines {first}-83 of 83" in head
        assert head.rstrip().endswith("run.log")  # the path is shortened from the left
        # Page down at the end stays at the end; g, then G, come back to it.
        await pilot.press("g")
        await wait_for(pilot, lambda: drawn(body)[0].split()[0] == "1", "the top")
        await pilot.press("G")
        await wait_for(pilot, lambda: drawn(body)[-1].startswith("83 "), "the bottom again")
        # Sideways scroll shows the cut-off ends of lines.
        for _ in range(4):
            await pilot.press("right")
        await wait_for(pilot, lambda: "end-of-83" in drawn(body)[-1], "the end of line 83")
        assert "col 81" in drawn(status)[0]
        await pilot.press("left", "left", "left", "left")
        await wait_for(pilot, lambda: drawn(body)[-1].startswith("83 INFO"), "back to column 1")


async def test_wrap_pages_by_what_is_on_screen(client: AgentClient, wide_log: Path) -> None:
    app, screen = make(client, wide_log, follow=False)
    async with app.run_test(size=(100, 30)) as pilot:
        body = screen.query_one("#lv-body", Static)
        await wait_for(pilot, lambda: screen.window and screen.window[-1].line_no == 83, "the last page")
        await pilot.press("w")
        # Each line takes two rows now; the last row is still the end of line 83.
        await wait_for(pilot, lambda: drawn(body)[-1].rstrip().endswith("end-of-83"), "the end of line 83")
        n = len(screen.on_screen)
        assert n == screen.rows // 2 and screen.on_screen[-1].line_no == 83
        assert "WRAP" in drawn(screen.query_one("#lv-status", Static))[0]
        await pilot.press("up")  # one line up, also when the page is short of lines
        await wait_for(pilot, lambda: screen.on_screen[-1].line_no == 82, "one line up")
        assert drawn(body)[-1].rstrip().endswith("end-of-82")
        await pilot.press("g")
        await wait_for(pilot, lambda: drawn(body)[0].split()[0] == "1", "the top")
        assert [ln.line_no for ln in screen.on_screen] == list(range(1, n + 1))
        await pilot.press("pagedown")  # no line is skipped
        await wait_for(pilot, lambda: screen.on_screen[0].line_no == n + 1, "the next page")
        await pilot.press("pageup")
        await wait_for(pilot, lambda: screen.on_screen[0].line_no == 1, "the top again")
        await pilot.press("G")
        await wait_for(pilot, lambda: drawn(body)[-1].rstrip().endswith("end-of-83"), "the end, wrapped")


async def test_a_page_fetch_that_ends_after_leaving_is_quiet(client: AgentClient, log: Path) -> None:
    """A page fetch still in flight when the viewer is left resumes after the screen's
    body is gone (seen in tmux: `L` then Escape during a 2,000 lines/s burst killed the
    dashboard with NoMatches #lv-body). Resuming one by hand must end quietly."""
    app, screen = make(client, log)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: screen.window and screen.window[-1].text == line_text(N), "the last page")
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is not screen, "back to the app")
        await screen._refill()  # what the in-flight worker does next
        await screen._show_from(0)
        assert app.is_running and app._exception is None
