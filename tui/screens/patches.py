"""`p`: the patch screen -- the set's versions, which one the host has, a diff preview,
and push / rollback through a confirmation.

It runs `tui.patch_service`, the same code as `eagle3-tui patch …`. Dismissed with
"relaunch" when the user asks to relaunch after a push (the app acts on it), else None.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from rich.console import Group
from rich.syntax import Syntax
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from tui import patch_service as S
from tui.cli_patch import describe_state, plan_lines
from tui.screens.confirm import ConfirmScreen
from tui.state import patches as P
from tui.transport import AgentRequestError, TransportError

APPLIED = "●"
RELAUNCH = "relaunch"
# What the screen catches from the patch service and the link: shown, never fatal.
EXPECTED = (S.PatchServiceError, P.PatchError, AgentRequestError, TransportError)


class PatchScreen(Screen[str | None]):
    DEFAULT_CSS = """
    PatchScreen #patch-status { height: auto; padding: 0 1; background: $boost; }
    PatchScreen Horizontal { height: 1fr; }
    PatchScreen #versions { width: 2fr; height: 1fr; border: round $primary; }
    PatchScreen #preview-box { width: 3fr; height: 1fr; border: round $secondary; }
    PatchScreen #preview { width: auto; }
    """
    BINDINGS: ClassVar[list[Binding | tuple[str, str] | tuple[str, str, str]]] = [
        # priority: the version table would otherwise take enter for itself
        Binding("enter,p", "push", "Push version", priority=True),
        Binding("b", "rollback", "Rollback to pristine"),
        Binding("r", "refresh", "Re-read host"),
        Binding("escape", "back", "Back"),
    ]

    def __init__(self, client: Any, set_name: str, python: str, host: str,
                 user_dir: Path | None = None) -> None:
        super().__init__()
        self.client = client
        self.set_name = set_name
        self.python = python
        self.host = host
        self.user_dir = user_dir
        self.pset: P.PatchSet | None = None
        self.status: dict[str, Any] | None = None  # the last status report from the host
        self.busy = False
        self.writing: str | None = None  # "pushing v3" while a push/rollback is in flight

    def compose(self) -> ComposeResult:
        yield Static(f"{self.host}: reading patch state of {self.set_name} …", id="patch-status")
        with Horizontal():
            yield DataTable(id="versions", cursor_type="row", zebra_stripes=True)
            with VerticalScroll(id="preview-box"):
                yield Static(id="preview")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#versions").border_title = f"Versions of {self.set_name}"
        self.query_one("#preview-box").border_title = "Diff against pristine"
        table = self.query_one(DataTable)
        table.add_columns(" ", "version", "title", "fixes")
        try:
            self.pset = P.load_set(self.set_name, self.user_dir)
        except P.PatchError as exc:
            self._header(Text(str(exc), style="bold red"))
            self.notify(str(exc), severity="error", timeout=10)
            return
        self._fill_table()
        self.action_refresh()

    # ---- rendering ----------------------------------------------------------------
    def _header(self, text: Text | str) -> None:
        self.query_one("#patch-status", Static).update(text)

    def _fill_table(self) -> None:
        """(Re)build the rows, keeping the cursor; the host's version is marked."""
        assert self.pset is not None
        table = self.query_one(DataTable)
        row = table.cursor_row
        table.clear()
        state = self.status["state"] if self.status else None
        table.add_row(APPLIED if state == P.PRISTINE else "", P.PRISTINE,
                      f"as released: {self.pset.distribution} {self.pset.version}", "", key=P.PRISTINE)
        for v in self.pset.versions:
            table.add_row(APPLIED if state == v.name else "", v.name, v.title, ", ".join(v.fixes),
                          key=v.name)
        table.move_cursor(row=min(row, table.row_count - 1))

    def _show_status(self) -> None:
        st = self.status
        assert st is not None
        state = describe_state(st)
        style = "bold red" if st["state"] in (P.UNKNOWN, P.MISSING) else "bold green"
        self._header(Text.assemble(
            f"{self.host}  {st['target']} in {st['package_dir']}  ",
            ("state: ", "bold"), (state, style)))

    def _highlighted(self) -> str | None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._preview(str(event.row_key.value))

    def _preview(self, name: str) -> None:
        if self.pset is None:
            return
        box = self.query_one("#preview-box")
        preview = self.query_one("#preview", Static)
        if name == P.PRISTINE:
            box.border_title = "pristine"
            preview.update(Text(f"The files as released in {self.pset.distribution} "
                                f"{self.pset.version}:\n" + "\n".join(self.pset.files)))
            return
        v = P.get_version(self.pset, name)
        box.border_title = f"{v.name}: diff against pristine"
        head = Text.assemble((v.title, "bold"), "\n",
                             ("fixes: " + (", ".join(v.fixes) or "-"), "dim"), "\n")
        if v.notes:
            head.append(v.notes + "\n", style="italic")
        preview.update(Group(head, _diff(v.diff)))

    def _show_hand_edits(self, message: str, detail: str) -> None:
        """Put the hand-edit diff where the version preview was, and say why."""
        self.query_one("#preview-box").border_title = "host files: hand edits against pristine"
        body = _diff(detail) if detail else Text("(no pristine copy on the host to diff against)")
        self.query_one("#preview", Static).update(Group(Text(message, style="bold red"), body))
        self.notify(message, severity="error", timeout=10)

    # ---- actions ------------------------------------------------------------------
    @property
    def is_modal(self) -> bool:
        """Modal while writing: the app's own keys (q quit, k kill, ...) must not run
        then -- quitting mid-push would cancel it."""
        return self.writing is not None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("push", "rollback", "refresh"):
            return self.pset is not None and not self.busy
        if action == "back":  # leaving would cancel a push between two file writes
            return None if self.writing else True
        return True

    def key_escape(self) -> None:
        # Runs before the (then disabled) `back` binding is looked up: say why nothing happens.
        if self.writing:
            self.notify(f"{self.writing}… wait", severity="warning")

    def action_back(self) -> None:
        self.dismiss(None)

    def action_refresh(self) -> None:
        self._load()

    def action_push(self) -> None:
        name = self._highlighted()
        if name is not None:
            self._ask(name)

    def action_rollback(self) -> None:
        self._ask(P.PRISTINE)

    def _ask(self, goal: str) -> None:
        """Confirm a move to `goal`, or say why not (an unknown state shows its diff)."""
        st, pset = self.status, self.pset
        if st is None or pset is None:
            self.notify("the host's patch state is not known yet", severity="warning")
            return
        if st["state"] == goal:
            self.notify(f"the host already has {goal}")
            return
        if st["state"] in (P.UNKNOWN, P.MISSING):
            self._refuse(goal)
            return
        title = "" if goal == P.PRISTINE else P.get_version(pset, goal).title
        verb = "Roll back" if goal == P.PRISTINE else "Push"

        def decided(yes: bool | None) -> None:
            if yes:
                # Marked before the worker starts: from here on, Escape must not cancel it.
                self.writing = "rolling back" if goal == P.PRISTINE else f"pushing {goal}"
                self._header(Text(f"{self.host}: {self.writing} … wait", style="bold yellow"))
                self._set_busy(True)
                self._transition(goal)

        self.app.push_screen(ConfirmScreen(f"{verb} {goal} to {self.host}?",
                                       plan_lines(st, goal, title, self.host), verb), decided)

    # ---- workers ------------------------------------------------------------------
    def _set_busy(self, busy: bool) -> None:
        self.busy = busy
        self.refresh_bindings()

    @work(exclusive=True, group="patch")
    async def _load(self) -> None:
        self._set_busy(True)
        try:
            self.status = await S.status(self.client, self.set_name, self.python, self.user_dir)
        except EXPECTED as exc:
            self._header(Text(f"{self.host}: {exc}", style="bold red"))
            self.notify(str(exc), title="patch status", severity="error", timeout=10)
            return
        finally:
            self._set_busy(False)
        self._show_status()
        self._fill_table()

    @work(exclusive=True, group="patch")
    async def _refuse(self, goal: str) -> None:
        """Show why a move is refused (hand edits: their diff) without writing anything."""
        try:
            exc = await S.would_refuse(self.client, self.set_name, goal, self.python,
                                       user_dir=self.user_dir)
        except EXPECTED as err:  # a dropped link while checking: say so, keep the screen
            self.notify(str(err), title="patch check failed", severity="error", timeout=10)
            return
        if exc is None:  # the host changed since we read it
            self.notify("the host's files changed; re-read", severity="warning")
            self._load()
            return
        self._show_hand_edits(f"{exc} (capture them with `eagle3-tui patch capture`, or "
                              f"`eagle3-tui patch push --force`)", exc.detail)

    @work(exclusive=True, group="patch")
    async def _transition(self, goal: str) -> None:
        """Push `goal` (or roll back to pristine); `_ask` has set `writing` and busy."""
        try:
            if goal == P.PRISTINE:
                report = await S.rollback(self.client, self.set_name, self.python, user_dir=self.user_dir)
            else:
                report = await S.push(self.client, self.set_name, goal, self.python, user_dir=self.user_dir)
        except S.PatchServiceError as exc:
            self._show_status()
            if exc.detail:
                self._show_hand_edits(str(exc), exc.detail)
            else:
                self.notify(str(exc), title="patch refused", severity="error", timeout=10)
            return
        except (P.PatchError, AgentRequestError, TransportError) as exc:
            self._show_status()
            self.notify(str(exc), title="patch failed", severity="error", timeout=10)
            return
        finally:
            self.writing = None
            self._set_busy(False)
        self.status = report
        self._show_status()
        self._fill_table()
        self.notify(f"{self.host} now has {describe_state(report)} "
                    f"({len(report.get('written', []))} file(s) written, hashes verified)")
        if goal != P.PRISTINE:
            self._offer_relaunch(goal)

    def _offer_relaunch(self, version: str) -> None:
        def decided(yes: bool | None) -> None:
            if yes:
                self.dismiss(RELAUNCH)

        self.app.push_screen(ConfirmScreen(
            f"Relaunch now with {version}?",
            [f"{self.host} has {self.set_name} {version}.",
             "A running process keeps the code it imported: relaunch to use it."],
            "Relaunch"), decided)


def _diff(text: str) -> Syntax:
    """A unified diff, coloured."""
    return Syntax(text, "diff", theme="ansi_dark", word_wrap=False, background_color="default")


__all__ = ["RELAUNCH", "PatchScreen"]
