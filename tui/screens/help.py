"""`?`: what each key does, generated from the app's declared bindings."""

from __future__ import annotations

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


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical { width: 80; max-width: 95%; height: auto; border: thick $accent;
                            background: $panel; padding: 1 2; }
    """
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, bindings: list[tuple[str, str]]) -> None:
        super().__init__()
        self._keys = bindings

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold cyan")
        table.add_column()
        for key, desc in self._keys:
            table.add_row(key, desc)
        with Vertical():
            yield Static(ABOUT)
            yield Static(table)

    def action_close(self) -> None:
        self.dismiss(None)
