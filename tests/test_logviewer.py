"""The log viewer screen in Pilot, reading a real temp log through the real local agent.

The client is ``AgentClient(LocalLink())``: ``remote/agent.py`` runs as a subprocess and
serves ``read_range``, as it does on a GPU host. Tests poll the screen's state with a
deadline (``pilot.pause``), never a fixed sleep.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.app import App
from textual.widgets import Input, Static

from tui.screens.logviewer import LogViewerScreen
from tui.state.logindex import LogDocument, RootCause
from tui.transport import AgentClient

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


class ViewerApp(App[None]):
    def __init__(self, screen: LogViewerScreen) -> None:
        super().__init__()
        self.viewer = screen

    def on_mount(self) -> None:
        self.push_screen(self.viewer)


def make(client: AgentClient, log: Path, **kw: object) -> tuple[ViewerApp, LogViewerScreen]:
    # Small blocks and index spacing, so a 5000-line file crosses many boundaries.
    from tui.screens.logviewer import agent_fetch

    doc = LogDocument(agent_fetch(client, str(log)), block=16384, max_blocks=4, every=256, scan_chunk=32768)
    screen = LogViewerScreen(client=client, path=str(log), doc=doc, poll_s=0.05, **kw)  # type: ignore[arg-type]
    return ViewerApp(screen), screen


async def wait_for(pilot: object, cond: Callable[[], object], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await pilot.pause(0.02)  # type: ignore[attr-defined]


def shown(screen: LogViewerScreen) -> list[tuple[int | None, str]]:
    return [(ln.line_no, ln.text) for ln in screen.window]


def body_text(screen: LogViewerScreen) -> str:
    return str(screen.query_one("#lv-body", Static).render())


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
        await wait_for(pilot, lambda: screen.matches_only and screen.window and all(" line 12" in ln.text for ln in screen.window), "the filter")
        assert all(ln.line_no is not None and 1200 <= ln.line_no <= 1299 for ln in screen.window)
        assert "MATCHES" in str(screen.query_one("#lv-status", Static).render())
        await pilot.press("m")
        await wait_for(pilot, lambda: any("line 12" not in ln.text for ln in screen.window), "filter off")


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
