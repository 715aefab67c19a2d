"""Pilot tests of the patch screen against the REAL local agent and a temp site-packages
holding the real speculators 0.3.0 files."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
from rich.console import Console
from textual.app import App
from textual.widgets import DataTable, Static

from tests import spec_wheel
from tests.patch_fixtures import GEN, HAND_EDIT, PY, SET, WORKER, client, hand_edit, pkg, site  # noqa: F401
from tui.services import patches as S
from tui.state import patches as P
from tui.transport import AgentApi, AgentClient, LinkLost
from tui.views.screens.confirm import ConfirmScreen
from tui.views.screens.patches import APPLIED, RELAUNCH, PatchScreen


class Host(App[None]):
    """A bare app that opens the patch screen and records how it was dismissed and what
    it notified; `q` quits, as in the real app."""

    BINDINGS: ClassVar[list[tuple[str, str, str]]] = [("q", "quit", "Quit")]

    def __init__(self, client: Any, user_dir: Path,  # noqa: F811
                 can_relaunch: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self.client, self.user_dir, self.can_relaunch = client, user_dir, can_relaunch
        self.results: list[str | None] = []
        self.notes: list[str] = []

    def notify(self, message: str, *args: Any, **kwargs: Any) -> None:
        self.notes.append(message)
        super().notify(message, *args, **kwargs)

    def on_mount(self) -> None:
        self.push_screen(PatchScreen(self.client, SET, PY, "gpu-box", self.user_dir,
                                     can_relaunch=self.can_relaunch), self.results.append)


async def until(pilot: Any, cond: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await pilot.pause(0.02)


def text_of(static: Static) -> str:
    console = Console(width=300, file=io.StringIO(), record=True, color_system=None)
    console.print(static.content)
    return console.export_text()


def marks(table: DataTable) -> dict[str, str]:
    return {str(k.value): str(table.get_row(k)[0]) for k in table.rows}


def pane(screen: PatchScreen) -> str:
    """The preview pane's text: the head (title, fixes, notes, or why) and the body."""
    return text_of(screen.query_one("#preview-head", Static)) + text_of(screen.query_one("#preview", Static))


def header(screen: PatchScreen) -> str:
    return text_of(screen.query_one("#patch-status", Static))


def dialog_lines(app: App[None], title: str) -> list[str]:
    """The open ConfirmScreen's body lines, after checking its title and that no line is
    wider than the dialog's text area or wraps there."""
    dialog = app.screen
    assert isinstance(dialog, ConfirmScreen)
    assert text_of(dialog.query_one("#title", Static)).strip() == title
    body = dialog.query_one("#body", Static)
    lines = text_of(body).rstrip("\n").split("\n")
    assert max(len(ln.rstrip()) for ln in lines) <= body.content_region.width, lines
    assert body.content_region.height == len(lines)  # nothing wrapped onto a second line
    return [ln.rstrip() for ln in lines]


def file_lines(lines: list[str]) -> list[str]:
    """The paths under `files:` (each on its own line, shortened from the left)."""
    return [ln.strip() for ln in lines[next(i for i, ln in enumerate(lines) if ln.startswith("files:")) + 1:]
            if ln.startswith("  ") and not ln.startswith("   ")]


def shows(full: Path, shown: list[str]) -> bool:
    """Whether `full` is one of the shown paths, whole or shortened to `…tail`."""
    return any(s == str(full) or (s.startswith("…/") and str(full).endswith(s[1:])) for s in shown)


@pytest.fixture
def pset() -> P.PatchSet:
    return P.load_set_dir(P.bundled_sets_dir() / SET)


async def test_versions_preview_push_and_relaunch(client: AgentClient, site: Path, tmp_path: Path,  # noqa: F811
                                                  pset: P.PatchSet) -> None:
    await S.push(client, SET, "v2", PY, user_dir=tmp_path)
    app = Host(client, tmp_path)
    async with app.run_test(size=(180, 50)) as pilot:
        screen = app.screen
        assert isinstance(screen, PatchScreen)
        table = screen.query_one(DataTable)
        await until(pilot, lambda: screen.status is not None and marks(table).get("v2") == APPLIED)
        assert list(marks(table)) == ["pristine", *P.version_order(pset)]  # pristine first
        assert [n for n, m in marks(table).items() if m] == ["v2"]  # only the applied one
        assert "v2" in text_of(screen.query_one("#patch-status", Static))

        titles = {k: str(table.get_row(k)[2]) for k in table.rows}
        cut = [k.value for k, t in titles.items() if t.endswith("…")]
        assert cut  # at this width the long titles do not fit ...
        for k, shown in titles.items():  # ... and each cut one ends in "…", never mid-air
            full = P.get_version(pset, str(k.value)).title if k.value != "pristine" else shown
            assert shown == full or (shown.endswith("…") and full.startswith(shown[:-1])), (shown, full)
            assert len(shown) <= table.columns[table.ordered_columns[2].key].width

        await pilot.press("down", "down", "down")  # pristine -> v1 -> v2 -> v3
        def added(name: str) -> set[str]:
            return {ln.rstrip() for ln in P.get_version(pset, name).diff.splitlines()
                    if ln.startswith("+") and not ln.startswith("+++") and len(ln.strip()) > 8}

        v3_added = added("v3") - added("v2")  # lines only the highlighted version has
        assert v3_added
        preview = screen.query_one("#preview", Static)
        await until(pilot, lambda: any(ln.rstrip() in v3_added for ln in text_of(preview).splitlines()))
        # The pane starts with the full title, wrapped to the pane's width, not cut.
        head = screen.query_one("#preview-head", Static)
        assert " ".join(text_of(head).split()).startswith(P.get_version(pset, "v3").title)
        assert head.size.width <= screen.query_one("#preview-box").content_region.width

        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        lines = dialog_lines(app, "Push v3 to gpu-box?")
        body = "\n".join(lines)
        assert "gpu-box" in body and "v2 → v3" in body
        shown = file_lines(lines)
        assert len(shown) == 1 and shows(pkg(site, WORKER), shown)  # v3 adds to the worker only
        await pilot.press("y", "down")  # a fast typist's next key: it lands in the table
        await until(pilot, lambda: "hashes verified" in header(screen))
        assert app.screen is screen  # no dialog popped up to swallow it
        await until(pilot, lambda: table.cursor_row == 4)
        assert "Press R to relaunch with v3" in header(screen)
        pristine = spec_wheel.pristine_files()
        v3 = P.build_version(pset, "v3", pristine)
        assert pkg(site, GEN).read_bytes() == v3[GEN] and pkg(site, WORKER).read_bytes() == v3[WORKER]
        assert (await S.status(client, SET, PY, user_dir=tmp_path))["state"] == "v3"
        await pilot.press("R")
        await until(pilot, lambda: app.results == [RELAUNCH])


async def test_rollback_and_hand_edits_show_their_diff(client: AgentClient, site: Path,  # noqa: F811
                                                       tmp_path: Path) -> None:
    pristine = spec_wheel.pristine_files()
    await S.push(client, SET, "latest", PY, user_dir=tmp_path)
    app = Host(client, tmp_path)
    async with app.run_test(size=(80, 40)) as pilot:  # narrow: the dialog is narrower too
        screen = app.screen
        assert isinstance(screen, PatchScreen)
        table = screen.query_one(DataTable)
        await until(pilot, lambda: screen.status is not None and marks(table).get("v5") == APPLIED)
        await pilot.press("b")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        shown = file_lines(dialog_lines(app, "Roll gpu-box back to pristine?"))
        assert len(shown) == 2 and shows(pkg(site, GEN), shown) and shows(pkg(site, WORKER), shown)
        await pilot.press("n")  # cancelled: nothing changes
        await until(pilot, lambda: app.screen is screen)
        assert pkg(site, GEN).read_bytes() != pristine[GEN]
        await pilot.press("b")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: marks(table).get("pristine") == APPLIED)
        assert {rel: pkg(site, rel).read_bytes() for rel in pristine} == pristine
        assert app.screen is screen  # no dialog after the rollback: R is offered instead
        await until(pilot, lambda: "Press R to relaunch with pristine" in header(screen))

        edited = hand_edit(site)
        await pilot.press("r")
        await until(pilot, lambda: screen.status is not None and screen.status["state"] == "unknown")
        assert not any(marks(table).values())
        await pilot.press("down", "p")  # push v1 over hand edits: refused, their diff shown
        await until(pilot, lambda: "+" + HAND_EDIT[1].decode() in pane(screen))
        assert "edited by hand" in pane(screen)
        assert app.screen is screen  # no confirmation was offered
        assert pkg(site, GEN).read_bytes() == edited
        await pilot.press("escape")
        await until(pilot, lambda: app.results == [None])


class HoldsFirstWrite(AgentApi):
    """The real client, but the push's `patch_apply` waits for `release` before it is sent."""

    def __init__(self, client: AgentClient) -> None:  # noqa: F811
        self.client = client
        self.holding, self.release = asyncio.Event(), asyncio.Event()

    async def request(self, op: str, **args: Any) -> dict[str, Any]:
        if op == "patch_apply" and not self.holding.is_set():
            self.holding.set()
            await self.release.wait()
        return await self.client.request(op, **args)


async def test_escape_and_quit_wait_for_a_push(client: AgentClient, site: Path,  # noqa: F811
                                                tmp_path: Path, pset: P.PatchSet) -> None:
    """Leaving mid-push would cancel it between its two file writes: Escape and the app's
    `q` do nothing but say "wait" until the push is done."""
    held = HoldsFirstWrite(client)
    app = Host(held, tmp_path, can_relaunch=lambda: False)  # no run to relaunch
    async with app.run_test(size=(180, 50)) as pilot:
        screen = app.screen
        assert isinstance(screen, PatchScreen)
        await until(pilot, lambda: screen.status is not None)
        await pilot.press(*["down"] * len(pset.versions))  # the newest: both files change
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, held.holding.is_set)
        await pilot.press("escape", "q")
        await until(pilot, lambda: any("wait" in n for n in app.notes))
        assert app.screen is screen and app.results == [] and app.is_running
        held.release.set()
        newest = P.latest(pset).name
        await until(pilot, lambda: "hashes verified" in header(screen))
        assert "Press R" not in header(screen)  # nothing to relaunch: not offered ...
        await pilot.press("R")  # ... and the key does nothing
        assert app.screen is screen and app.results == []
        assert screen.status is not None and screen.status["state"] == newest
        pristine = spec_wheel.pristine_files()
        assert {r: pkg(site, r).read_bytes() for r in pristine} == P.build_version(pset, newest, pristine)
        await pilot.press("escape")  # done: Escape works again
        await until(pilot, lambda: app.results == [None])


class DropsLink(AgentApi):
    """The real client until `drop` is set; then every request fails as a lost link."""

    def __init__(self, client: AgentClient) -> None:  # noqa: F811
        self.client, self.drop = client, False

    async def request(self, op: str, **args: Any) -> dict[str, Any]:
        if self.drop:
            raise LinkLost("connection to gpu-box lost")
        return await self.client.request(op, **args)


async def test_link_lost_while_checking_a_refusal_is_a_notice(
        client: AgentClient, site: Path, tmp_path: Path) -> None:  # noqa: F811
    edited = hand_edit(site)
    link = DropsLink(client)
    app = Host(link, tmp_path)
    async with app.run_test(size=(180, 50)) as pilot:
        screen = app.screen
        assert isinstance(screen, PatchScreen)
        await until(pilot, lambda: screen.status is not None and screen.status["state"] == "unknown")
        link.drop = True
        await pilot.press("down", "p")  # refused: the check for why runs into the dropped link
        await until(pilot, lambda: any("connection to gpu-box lost" in n for n in app.notes))
        assert app.is_running and app.screen is screen
        link.drop = False  # back: the same key now shows why
        await pilot.press("p")
        await until(pilot, lambda: "edited by hand" in pane(screen))
        assert pkg(site, GEN).read_bytes() == edited
