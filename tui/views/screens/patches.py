"""`p`: the patch screen -- the set's versions, which one the host has, a diff preview,
and push / rollback through a confirmation.

It runs `tui.services.patches`, the same code as `eagle3-tui patch …`. After a push or
rollback the header says what the host has now and, when `can_relaunch()` allows, offers
`R`: the screen is then dismissed with "relaunch" (the app acts on it), else with None.
No dialog ever opens on its own, so a key typed right after a push cannot land in one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from rich.syntax import Syntax
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from tui.services import patches as S
from tui.state import patches as P
from tui.state.patchtext import describe_state, plan_lines
from tui.transport import AgentRequestError, TransportError
from tui.views.readonly import refused
from tui.views.screens.confirm import ConfirmScreen

APPLIED = "●"
RELAUNCH = "relaunch"
# What the screen catches from the patch service and the link: shown, never fatal.
EXPECTED = (S.PatchServiceError, P.PatchError, AgentRequestError, TransportError)
# ConfirmScreen's box: 90 columns (at most 95% of the terminal), less its thick border
# (1 + 1) and padding (2 + 2): the width the plan's lines must fit in, unwrapped.
DIALOG_BOX, DIALOG_FRAME = 90, 6


def cut(text: str, width: int) -> str:
    """`text` cut to `width` columns, ending in `…` when it was cut."""
    return text if len(text) <= width else text[:max(width - 1, 0)] + "…"


class PatchScreen(Screen[str | None]):
    DEFAULT_CSS = """
    PatchScreen #patch-status { height: auto; padding: 0 1; background: $boost; }
    PatchScreen Horizontal { height: 1fr; }
    PatchScreen #versions { width: 2fr; height: 1fr; border: round $primary; }
    PatchScreen #preview-box { width: 3fr; height: 1fr; border: round $secondary; }
    PatchScreen #preview-head { width: 100%; }
    PatchScreen #preview { width: auto; }
    """
    BINDINGS: ClassVar[list[Binding | tuple[str, str] | tuple[str, str, str]]] = [
        # priority: the version table would otherwise take enter for itself
        Binding("enter,p", "push", "Push version", priority=True),
        Binding("b", "rollback", "Rollback to pristine"),
        Binding("r", "refresh", "Re-read host"),
        # shift: a deliberate key, unlike the `r` next to it; shown only after a write
        Binding("R", "relaunch", "Relaunch with it"),
        Binding("escape", "back", "Back"),
    ]

    def __init__(self, client: Any, set_name: str, python: str | None, host: str,
                 user_dir: Path | None = None, *,
                 can_relaunch: Callable[[], bool] | None = None) -> None:
        """`can_relaunch()` says whether there is a run to relaunch (one alive, or the
        last one ended); None: always offer it after a write and let the app decide."""
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
        self.can_relaunch = can_relaunch
        self.written: str | None = None  # the state the last push/rollback left (for `R`)
        self.outcome: Text | None = None  # what that write did, under the status line

    def compose(self) -> ComposeResult:
        yield Static(Text(f"{self.host}: reading patch state of {self.set_name} …"), id="patch-status")
        with Horizontal():
            yield DataTable(id="versions", cursor_type="row", zebra_stripes=True)
            with VerticalScroll(id="preview-box"):
                yield Static(id="preview-head")  # wraps: a title is read in full here
                yield Static(id="preview")  # the diff: unwrapped, scrolls sideways
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#versions").border_title = f"Versions of {self.set_name}"
        self.query_one("#preview-box").border_title = "Diff against pristine"
        try:
            self.pset = P.load_set(self.set_name, self.user_dir)
        except P.PatchError as exc:
            self._header(Text(str(exc), style="bold red"))
            self.notify(str(exc), severity="error", timeout=10)
            return
        self._fill_table()
        self.action_refresh()

    def on_resize(self) -> None:
        if self.pset is not None:  # the title column takes what the table's width leaves
            self.call_after_refresh(self._fill_table)

    # ---- rendering ----------------------------------------------------------------
    def _header(self, text: Text | str) -> None:
        self.query_one("#patch-status", Static).update(Text(text) if isinstance(text, str) else text)

    def _fill_table(self) -> None:
        """(Re)build columns and rows, keeping the cursor; the host's version is marked.
        The title column gets the width the others leave; cut titles end in `…`."""
        assert self.pset is not None
        table = self.query_one(DataTable)
        row = table.cursor_row
        table.clear(columns=True)  # fixed widths: an auto-width column never shrinks
        state = self.status["state"] if self.status else None
        rows = [(P.PRISTINE, f"as released: {self.pset.distribution} {self.pset.version}", "")]
        rows += [(v.name, v.title, ", ".join(v.fixes)) for v in self.pset.versions]
        name_w = max(len(r[0]) for r in rows)
        pad = 2 * table.cell_padding
        # What the mark and version columns leave goes to title and fixes; fixes (ids, also
        # in the preview) get at most a third, so the titles get the most room.
        free = table.scrollable_content_region.width - (1 + pad) - (name_w + pad) - 2 * pad
        fixes_w = min(max(len(r[2]) for r in rows), max(len("fixes"), free // 3))
        title_w = max(free - fixes_w, 12)
        for label, width in ((" ", 1), ("version", name_w), ("title", title_w), ("fixes", fixes_w)):
            table.add_column(label, width=width, key=label.strip() or "mark")
        for name, title, fixes in rows:
            table.add_row(APPLIED if state == name else "", Text(name), Text(cut(title, title_w)),
                          Text(cut(fixes, fixes_w)), key=name)
        table.move_cursor(row=min(row, table.row_count - 1))

    def _show_status(self) -> None:
        st = self.status
        assert st is not None
        state = describe_state(st)
        style = "bold red" if st["state"] in (P.UNKNOWN, P.MISSING) else "bold green"
        header = Text.assemble(f"{self.host}  {st['target']} in {st['package_dir']}  ",
                               ("state: ", "bold"), (state, style))
        if self.outcome is not None:
            header.append("\n").append_text(self.outcome)
        self._header(header)

    def _highlighted(self) -> str | None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._preview(str(event.row_key.value))

    def _preview(self, name: str) -> None:
        """The highlighted version: its full title, fixes and notes, then its diff."""
        if self.pset is None:
            return
        box = self.query_one("#preview-box")
        head = self.query_one("#preview-head", Static)
        preview = self.query_one("#preview", Static)
        if name == P.PRISTINE:
            box.border_title = "pristine"
            head.update(Text(f"The files as released in {self.pset.distribution} {self.pset.version}:"))
            preview.update(Text("\n".join(self.pset.files)))
            return
        v = P.get_version(self.pset, name)
        box.border_title = f"{v.name}: diff against pristine"
        text = Text.assemble((v.title, "bold"), "\n", ("fixes: " + (", ".join(v.fixes) or "-"), "dim"))
        if v.notes:
            text.append("\n" + v.notes, style="italic")
        head.update(text)
        preview.update(_diff(v.diff))

    def _show_hand_edits(self, message: str, detail: str) -> None:
        """Put the hand-edit diff where the version preview was, and say why."""
        self.query_one("#preview-box").border_title = "host files: hand edits against pristine"
        body = _diff(detail) if detail else Text("(no pristine copy on the host to diff against)")
        self.query_one("#preview-head", Static).update(Text(message, style="bold red"))
        self.query_one("#preview", Static).update(body)
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
        if action == "relaunch":  # hidden until a write has left something to relaunch with
            return self._relaunch_offered()
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

    def action_relaunch(self) -> None:
        if self._relaunch_offered():
            self.dismiss(RELAUNCH)

    def _relaunch_offered(self) -> bool:
        return (self.written is not None and not self.busy
                and (self.can_relaunch is None or self.can_relaunch()))

    def action_push(self) -> None:
        name = self._highlighted()
        if name is not None:
            self._ask(name)

    def action_rollback(self) -> None:
        self._ask(P.PRISTINE)

    def _ask(self, goal: str) -> None:
        """Confirm a move to `goal`, or say why not (an unknown state shows its diff)."""
        if refused(self, "patch rollback" if goal == P.PRISTINE else "patch push"):
            return
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
        if goal == P.PRISTINE:
            verb, question = "Roll back", f"Roll {self.host} back to {P.PRISTINE}?"
        else:
            verb, question = "Push", f"Push {goal} to {self.host}?"
        width = min(DIALOG_BOX, self.app.size.width * 95 // 100) - DIALOG_FRAME

        def decided(yes: bool | None) -> None:
            if yes:
                # Marked before the worker starts: from here on, Escape must not cancel it.
                self.writing = "rolling back" if goal == P.PRISTINE else f"pushing {goal}"
                self.written = self.outcome = None  # the last write's news is old now
                self._header(Text(f"{self.host}: {self.writing} … wait", style="bold yellow"))
                self._set_busy(True)
                self._transition(goal)

        self.app.push_screen(ConfirmScreen(cut(question, width),
                                           plan_lines(st, goal, title, self.host, width), verb),
                             decided)

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
        if self.written is not None and self.status["state"] != self.written:
            self.written = self.outcome = None  # changed behind our back: no longer news
            self.refresh_bindings()
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
        """Push `goal` (or roll back to pristine); `_ask` has set `writing` and busy.
        The push is an action of the app's state (`track_push`), like a kill."""
        track = getattr(self.app, "track_push", None)
        end = track(goal) if track is not None else (lambda ok, error=None, unknown=False: None)
        try:
            if goal == P.PRISTINE:
                report = await S.rollback(self.client, self.set_name, self.python, user_dir=self.user_dir)
            else:
                report = await S.push(self.client, self.set_name, goal, self.python, user_dir=self.user_dir)
        except S.PatchServiceError as exc:
            end(False, str(exc))
            self._show_status()
            if exc.detail:
                self._show_hand_edits(str(exc), exc.detail)
            else:
                self.notify(str(exc), title="patch refused", severity="error", timeout=10)
            return
        except (P.PatchError, AgentRequestError, TransportError) as exc:
            end(False, str(exc), unknown=isinstance(exc, TransportError))
            self._show_status()
            self.notify(str(exc), title="patch failed", severity="error", timeout=10)
            return
        finally:
            self.writing = None
            self._set_busy(False)
        self.status = report
        self.written = goal
        done = (f"{self.host} now has {describe_state(report)}: "
                f"{len(report.get('written', []))} file(s) written, hashes verified.")
        end(True)
        self.outcome = Text(done, style="green")
        if self._relaunch_offered():
            # Offered, not asked: a dialog popping up now would take the next key typed.
            self.outcome.append(f"  Press R to relaunch with {describe_state(report)}.", style="bold")
        self._show_status()
        self._fill_table()
        self.refresh_bindings()
        if track is None:
            self.notify(done)


def _diff(text: str) -> Syntax:
    """A unified diff, coloured."""
    return Syntax(text, "diff", theme="ansi_dark", word_wrap=False, background_color="default")


__all__ = ["RELAUNCH", "PatchScreen"]
