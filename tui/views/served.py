"""Who else is watching: the browser sessions of `eagle3-tui serve`, in each session's app.

The server writes its open sessions (number, address, browser) to a private file whose
path it puts in `EAGLE3_TUI_SESSIONS` before any session starts; each session's app reads
it every few seconds and says when the list changes, so a viewer the user did not expect
shows up on their screen, not only in the server's log.
"""

from __future__ import annotations

import json
import os
from typing import Any

from textual.app import App

SESSIONS_ENV = "EAGLE3_TUI_SESSIONS"
EVERY_S = 2.0


def follow_sessions(app: App[Any]) -> None:
    """In a served session, notify each change of the session list; else nothing."""
    path = os.environ.get(SESSIONS_ENV)
    if not path:
        return
    shown: list[str] = []

    def check() -> None:
        try:
            with open(path, encoding="utf-8") as f:
                sessions = json.load(f)
            now = [f"#{int(s['number'])} {str(s['peer'])[:60]}" for s in sessions]
        except (OSError, ValueError, TypeError, KeyError):
            return  # between two writes, or the server is gone: the next look
        if now != shown:
            if shown or len(now) > 1:  # not for the first session alone: that is the user
                app.notify("browser sessions now: " + (", ".join(now) or "none"), markup=False,
                           title="eagle3-tui serve", timeout=8)
            shown[:] = now

    check()
    app.set_interval(EVERY_S, check)
