"""Read-only sessions (`connect --read-only`, `serve --read-only`): watch, never write.

Kill, relaunch, launch, patch push and rollback each ask `refused` first; their keys stay
enabled so that a press says why nothing happens (the dashboard's rule for keys that
do not apply), and `ModeFooter` shows READ-ONLY beside the keys, those keys dimmed.
"""

from __future__ import annotations

from typing import Any

from textual.app import App, ComposeResult
from textual.dom import DOMNode
from textual.widgets import Footer, Label

OFF = frozenset({"kill", "relaunch", "launch", "push", "rollback"})  # the actions `refused` stops


def is_read_only(app: App[Any]) -> bool:
    return bool(getattr(app, "read_only", False))


def refused(node: DOMNode, what: str) -> bool:
    """True (and a notification that says why) when this session may not `what`."""
    if not is_read_only(node.app):
        return False
    node.app.notify(f"read-only session: {what} is off (started with --read-only)", severity="warning")
    return True


class ModeFooter(Footer):
    """The keys, and READ-ONLY first in a read-only session."""

    DEFAULT_CSS = """
    ModeFooter FooterKey.-off {
        text-style: dim;  /* as Textual draws a disabled key; a press still says why */
    }
    ModeFooter .read-only {
        dock: left;  /* first: a narrow footer cuts from the right */
        padding: 0 1;
        background: $warning;
        color: $background;
        text-style: bold;
    }
    """

    def on_resize(self) -> None:
        """80 columns and below: keys without padding, and no palette hint (ctrl+p still
        opens it), so that every key fits a phone's width."""
        narrow = self.size.width <= 80
        if self.compact != narrow:
            self.compact = narrow
            self.show_command_palette = not narrow

    def compose(self) -> ComposeResult:
        read_only = is_read_only(self.app)
        for widget in super().compose():
            # Footer's keys (FooterKey, not exported: its public `action` attribute, duck-typed)
            if read_only and getattr(widget, "action", None) in OFF:
                widget.add_class("-off")
            yield widget
        if read_only:
            yield Label("READ-ONLY", classes="read-only")
