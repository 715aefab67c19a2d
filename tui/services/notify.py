"""Telling the user wherever they are: a terminal alert and an optional hook command.

- The terminal alert is a bell plus two desktop-notification escapes that terminals
  understand: OSC 9 (iTerm2, Windows Terminal, kitty, WezTerm, foot, ghostty) and
  OSC 777 (rxvt-unicode, VTE terminals such as GNOME Terminal, WezTerm). Both travel
  through SSH untouched; inside tmux they are wrapped for its passthrough (which needs
  ``set -g allow-passthrough on``).
- The hook is ``[notify] command = ["argv", …]`` from eagle3.toml: run without a
  shell, with the event as one JSON object on stdin (point it at ntfy, a webhook via
  curl, or mail). It runs in the background, in a process group of its own; a hook
  that fails or hangs (its whole group killed after ``HOOK_TIMEOUT`` s, or when the
  command that started it exits: ``Notifier.close``) never stops the watch.

``Notifier.send_new(watch_state)`` acts on each event of a ``WatchState`` once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tui.protocol.hosttext import clean

__all__ = ["HOOK_TIMEOUT", "Notifier", "event_json", "kill_group", "run_hook", "terminal_alert"]

HOOK_TIMEOUT = 30.0
ESC, BEL = "\x1b", "\x07"
NOTIFY_KINDS = frozenset({"diverged", "failed", "finished", "killed", "lost", "stalled", "hung", "restarting",
                          "gave up"})


def _clean(text: str, limit: int = 200) -> str:
    """Host text inside our own escape: sanitized (`hosttext.clean`), on one line."""
    return clean(text, newline=False).strip()[:limit]


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


def run_hook(argv: Sequence[str], payload: dict[str, Any], timeout: float = HOOK_TIMEOUT,
             started: Callable[[subprocess.Popen[bytes]], None] | None = None) -> threading.Thread:
    """Start ``argv`` (no shell) with ``payload`` as JSON on stdin; wait for it in a thread.

    The hook runs in a session (and process group) of its own, so at its timeout the
    whole group is killed: a `sh -c 'curl …'` whose child hangs leaves nothing behind.
    ``started`` is told the process, so that its owner can kill it on exit."""

    def go() -> None:
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            return  # a missing program: nothing to tell anyone with
        if started is not None:
            started(proc)
        try:
            proc.communicate(json.dumps(payload).encode() + b"\n", timeout=timeout)
        except (subprocess.TimeoutExpired, OSError):
            kill_group(proc)

    th = threading.Thread(target=go, name="eagle3-notify-hook", daemon=True)
    th.start()
    return th


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the hook's process group (its session, started for it alone), then reap
    the hook. Called only while the hook is not reaped yet, so its pid (the group's id)
    cannot have been given to another process."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.wait()


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
        self.procs: list[subprocess.Popen[bytes]] = []  # hook processes started, for close()
        self._lock = threading.Lock()  # hook threads add to `procs`

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
                self.hooks.append(run_hook(self.command, event_json(ev, self.host), started=self._started))
        self.hooks = [h for h in self.hooks if h.is_alive()]
        with self._lock:
            self.procs = [pr for pr in self.procs if pr.poll() is None]
        return events

    def _started(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self.procs.append(proc)

    def close(self, grace: float = 5.0) -> None:
        """On exit: give running hooks ``grace`` seconds to deliver, then kill their
        process groups, so no hook outlives the command that started it."""
        deadline = time.monotonic() + grace
        for th in self.hooks:
            th.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            procs = list(self.procs)
        for proc in procs:
            if proc.poll() is None:  # still running (not reaped): its group is its own
                kill_group(proc)
