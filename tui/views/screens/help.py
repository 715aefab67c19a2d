"""`?`: what each key does on the screen it was pressed on, from that screen's bindings
(and, for a key whose `Binding` has an `id`, its CLI twin: `cli_twin`)."""

from __future__ import annotations

import inspect
from typing import Any

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

ABOUT = (
    "eagle3-tui watches one run on one host: its processes, shard loading, GPUs and log.\n"
    "Actions apply to the run selected in the Runs table (arrow keys move the selection).\n"
    "ctrl+p opens the command palette with the same actions."
)


def cli_twin(binding: Binding) -> str:
    """The command a key's twin is, from its binding's id (`runs-show`: `eagle3-tui runs
    show`); "" for a key with no id."""
    return "eagle3-tui " + binding.id.replace("-", " ") if binding.id else ""


class HelpScreen(ModalScreen[None]):
    # Opaque: a translucent modal re-renders and blends the whole screen beneath it on
    # every frame, which made `?` cost 2.8x the CPU (toggle bench in the README).
    DEFAULT_CSS = """
    HelpScreen { align: center middle; background: $background; }
    HelpScreen > Vertical { width: 80; max-width: 95%; height: auto; border: thick $accent;
                            background: $panel; padding: 1 2; }
    """
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, bindings: list[tuple[str, str, str]], about: str = ABOUT) -> None:
        super().__init__()
        self._keys = bindings
        self._about = about

    @property
    def contents(self) -> tuple[tuple[tuple[str, str, str], ...], str]:
        """What this help says (two helps that say the same are interchangeable)."""
        return tuple(self._keys), self._about

    @classmethod
    def for_screen(cls, screen: Any, app: Any) -> HelpScreen:
        """The help of `screen`: the dashboard's keys (and the command palette) on a
        host's dashboard, else the keys that screen declares and the first paragraph of
        its docstring."""
        dashboard = hasattr(screen, "DASHBOARD_ACTIONS")  # a host's DashboardScreen
        keys = [
            (b.key_display or b.key.split(",")[0], b.description, cli_twin(b))
            for b in screen.BINDINGS
            if isinstance(b, Binding) and b.description
            and not (dashboard and screen.check_action(b.action, ()) is False)  # esc: only from the fleet
        ]
        if dashboard:
            return cls(keys + [("ctrl+p", "Command palette", "")])
        about = (inspect.getdoc(type(screen)) or type(screen).__name__).split("\n\n")[0]
        return cls(keys + [("?", "This help", "")], about)

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold cyan")
        table.add_column()
        table.add_column(style="dim")
        for key, desc, twin in self._keys:
            table.add_row(key, desc, twin)
        with Vertical():
            yield Static(self._about)
            yield Static(table)
            yield Static("\nesc, q or ? closes this help", id="closes")

    def action_close(self) -> None:
        self.dismiss(None)
