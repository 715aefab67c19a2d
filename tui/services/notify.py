"""Telling the user wherever they are: a terminal alert and an optional hook command.

- The terminal alert is a bell plus two desktop-notification escapes that terminals
  understand: OSC 9 (iTerm2, Windows Terminal, kitty, WezTerm, foot, ghostty) and
  OSC 777 (rxvt-unicode, VTE terminals such as GNOME Terminal, WezTerm). Both travel
  through SSH untouched; inside tmux they are wrapped for its passthrough (which needs
  ``set -g allow-passthrough on``).
- The hook is ``[notify] command = ["argv", …]`` from eagle3.toml: run without a
  shell, with the event as one JSON object on stdin (point it at ntfy, a webhook via
  curl, or mail). It runs in the background; a hook that fails or hangs (killed
  after ``HOOK_TIMEOUT`` s) never stops the watch.

``Notifier.send_new(watch_state)`` acts on each event of a ``WatchState`` once.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["HOOK_TIMEOUT", "Notifier", "event_json", "run_hook", "terminal_alert"]

HOOK_TIMEOUT = 30.0
ESC, BEL = "\x1b", "\x07"
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f]+")  # control characters end or corrupt an OSC string
NOTIFY_KINDS = frozenset({"failed", "finished", "killed", "lost", "stalled", "hung", "restarting", "gave up"})


def _clean(text: str, limit: int = 200) -> str:
    return _UNSAFE.sub(" ", text).strip()[:limit]


def terminal_alert(title: str, body: str, tmux: bool = False) -> str:
    """Bell + OSC 9 + OSC 777 for one notification; wrapped for tmux when ``tmux``."""
    title, body = _clean(title, 80).replace(";", ","), _clean(body)
    osc = f"{ESC}]9;{title}: {body}{BEL}{ESC}]777;notify;{title};{body}{BEL}"
    if tmux:  # DCS passthrough: every ESC inside is doubled
        osc = f"{ESC}Ptmux;{osc.replace(ESC, ESC + ESC)}{ESC}\\"
    return BEL + osc


def event_json(event: Any, host: str) -> dict[str, Any]:
    """The hook's stdin: the event with the host it is about."""
    return {"host": host, **event.to_json()}


def run_hook(argv: Sequence[str], payload: dict[str, Any], timeout: float = HOOK_TIMEOUT) -> threading.Thread:
    """Start ``argv`` (no shell) with ``payload`` as JSON on stdin; wait for it in a thread."""

    def go() -> None:
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            return  # a missing program: nothing to tell anyone with
        try:
            proc.communicate(json.dumps(payload).encode() + b"\n", timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        except OSError:
            proc.kill()
            proc.wait()

    th = threading.Thread(target=go, name="eagle3-notify-hook", daemon=True)
    th.start()
    return th


class Notifier:
    """Sends each new event of a watch once: to the terminal and to the hook."""

    def __init__(self, command: Sequence[str] = (), host: str = "local",
                 write: Callable[[str], None] | None = None, tmux: bool | None = None,
                 kinds: frozenset[str] = NOTIFY_KINDS) -> None:
        self.command = tuple(command)
        self.host = host
        self.write = write
        self.tmux = bool(os.environ.get("TMUX")) if tmux is None else tmux
        self.kinds = kinds
        self.last_seq = 0
        self.hooks: list[threading.Thread] = []

    def send_new(self, watch_state: Any) -> list[Any]:
        """Notify the events of ``watch_state`` not seen yet; return them."""
        events = [e for e in getattr(watch_state, "events", ()) if e.seq > self.last_seq]
        if not events:
            return []
        self.last_seq = events[-1].seq
        for ev in events:
            if ev.kind not in self.kinds:
                continue
            if self.write is not None:
                self.write(terminal_alert(f"eagle3-tui {self.host}", f"{ev.run_id} {ev.kind}: {ev.message}", self.tmux))
            if self.command:
                self.hooks.append(run_hook(self.command, event_json(ev, self.host)))
        self.hooks = [h for h in self.hooks if h.is_alive()]
        return events
