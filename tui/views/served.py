"""Who else is watching: the browser sessions of `eagle3-tui serve`, in each session's app.

The server writes its open sessions (number, address, browser, since, read-only, away)
to a private file whose path it puts in `EAGLE3_TUI_SESSIONS` before any session starts;
each session's app reads it every few seconds and says when the list changes, so a
viewer the user did not expect shows up on their screen, not only in the server's log.
`S` (and "Browser sessions" in the palette) lists them on demand.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

SESSIONS_ENV = "EAGLE3_TUI_SESSIONS"
EVERY_S = 2.0


@dataclass(frozen=True)
class Viewer:
    number: int
    peer: str
    agent: str
    since: float
    read_only: bool
    away: bool

    def line(self) -> str:
        since = time.strftime("%H:%M:%S", time.localtime(self.since)) if self.since else "?"
        mode = "read-only" if self.read_only else "full control"
        return (f"#{self.number}  {self.peer}  since {since}  {mode}"
                f"{'  (reconnecting)' if self.away else ''}  {self.agent}")


def served() -> bool:
    return bool(os.environ.get(SESSIONS_ENV))


def read_sessions() -> list[Viewer] | None:
    """The server's list now; None when it cannot be read (between two writes, or gone)."""
    path = os.environ.get(SESSIONS_ENV)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            rows = json.load(f)
        return [Viewer(int(s["number"]), str(s["peer"])[:60], str(s.get("agent", "?"))[:60],
                       float(s.get("since") or 0), bool(s.get("read_only")), bool(s.get("away")))
                for s in rows]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def follow_sessions(app: App[Any]) -> None:
    """In a served session, notify each change of the session list; else nothing."""
    if not served():
        return
    shown: list[str] = []

    def check() -> None:
        sessions = read_sessions()
        if sessions is None:
            return  # the next look
        now = [f"#{s.number} {s.peer}" for s in sessions]
        if now != shown:
            if shown or len(now) > 1:  # not for the first session alone: that is the user
                app.notify("browser sessions now: " + (", ".join(now) or "none"), markup=False,
                           title="eagle3-tui serve", timeout=8)
            shown[:] = now

    check()
    app.set_interval(EVERY_S, check)


class SessionsScreen(ModalScreen[None]):
    """The connected browser sessions: id, address, since, read-only or not; kept current."""

    BINDINGS = [Binding("escape,q,S", "dismiss", "Close")]
    DEFAULT_CSS = """
    SessionsScreen { align: center middle; }
    SessionsScreen > Vertical {
        width: auto; max-width: 100%; height: auto; max-height: 80%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    SessionsScreen #sessions { width: auto; }
    """

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Browser sessions"
            box.border_subtitle = "esc closes"
            yield Static(id="sessions", markup=False)

    def on_mount(self) -> None:
        self._draw()
        self.set_interval(EVERY_S, self._draw)

    def _draw(self) -> None:
        sessions = read_sessions()
        if sessions is None:
            return
        lines = [s.line() for s in sessions] or ["none"]
        self.query_one("#sessions", Static).update(Text("\n".join(lines)))
