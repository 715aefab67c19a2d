"""Read-only sessions (`connect --read-only`, `serve --read-only`): watch, never write.

Kill, relaunch, launch, patch push and rollback each ask `refused` first; their keys stay
enabled so that a press says why nothing happens (the dashboard's rule for keys that
do not apply), and `ModeFooter` shows READ-ONLY beside the keys.
"""

from __future__ import annotations

from typing import Any

from textual.app import App, ComposeResult
from textual.dom import DOMNode
from textual.widgets import Footer, Label


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
    ModeFooter .read-only {
        dock: left;  /* first: a narrow footer cuts from the right */
        padding: 0 1;
        background: $warning;
        color: $background;
        text-style: bold;
    }
    """

    def compose(self) -> ComposeResult:
        yield from super().compose()
        if is_read_only(self.app):
            yield Label("READ-ONLY", classes="read-only")
