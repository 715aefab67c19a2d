"""A modal yes/no for destructive actions. Cancel has the focus; escape and n cancel."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical {
        width: 90; max-width: 95%; height: auto; border: thick $error; background: $panel;
        padding: 1 2;
    }
    ConfirmScreen #title { text-style: bold; color: $error; margin-bottom: 1; }
    ConfirmScreen Horizontal { height: auto; align-horizontal: right; margin-top: 1; }
    ConfirmScreen Button { margin-left: 2; }
    """
    BINDINGS = [
        Binding("escape,n", "cancel", "Cancel"),
        Binding("y", "confirm", "Confirm", show=False),
    ]

    def __init__(self, title: str, lines: list[str], confirm_label: str = "Kill") -> None:
        super().__init__()
        self._title = title
        self._lines = lines
        self._label = confirm_label

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self._title), id="title")
            yield Static(Text("\n".join(self._lines)), id="body")
            with Horizontal():
                yield Button("Cancel (n)", id="cancel", variant="primary")
                yield Button(f"{self._label} (y)", id="confirm", variant="error")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm")

    def action_cancel(self) -> None:
        self.dismiss(False)

    def action_confirm(self) -> None:
        self.dismiss(True)
