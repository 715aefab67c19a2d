"""A notification's escapes reach the real terminal through Textual's own writer, found by
public API (`EagleApp.get_driver_class`, tui/views/driver.py `remembering`), not
through the driver Textual keeps private. Run in a pseudo-terminal: a headless app has
no terminal to write to."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time
from pathlib import Path

from tests import checkout

ROOT = Path(__file__).resolve().parent.parent
MARK = "\x1b]9;eagle3-tui terminal-write check\x07"
APP = f"""
from textual.screen import Screen
from textual.widgets import Static
from tui.views.app import EagleApp
from tui.views.widgets.render import terminal_write

class First(Screen):
    def compose(self):
        yield Static("x")

    def on_mount(self):
        self.set_timer(0.2, self.send)

    def send(self):
        terminal_write(self.app, {MARK!r})
        self.app.exit()

EagleApp(First()).run()
"""


def run_app_in_pty(code: str, timeout: float = 60) -> tuple[int | None, str]:
    master, slave = pty.openpty()
    os.set_blocking(master, False)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=slave, stdout=slave, stderr=slave,
                            env=checkout.env(TERM="xterm"))
    os.close(slave)
    out, t0 = b"", time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < timeout:
        try:
            out += os.read(master, 65536)
        except (BlockingIOError, OSError):
            time.sleep(0.02)
    if proc.poll() is None:
        proc.kill()
    try:
        out += os.read(master, 65536)
    except OSError:
        pass
    os.close(master)
    return proc.wait(), out.decode("utf-8", "replace")


def test_a_notification_escape_reaches_the_terminal() -> None:
    code, out = run_app_in_pty(APP)
    assert code == 0, out[-2000:]
    assert MARK in out, out[-2000:]

