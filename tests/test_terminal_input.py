"""The app's terminal input (tui/views/driver.py): keys reach the app, a lone Escape
too (after its delay), a click and a bracketed paste longer than one read too, `q` ends
the app at once, and while no key comes no thread of
the app wakes. Textual's own input loop woke ten times a second for good: a third of
an idle dashboard's cost. The real driver on a real pseudo-terminal."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from tests import checkout
from tests.test_mutants_webserve import Page, port_of, whole_screen, with_cookie
from tests.test_screen_gone import descendants
from tests.test_serve import Served, serve

ROOT = Path(__file__).resolve().parent.parent
APP = """
import sys
from textual.screen import Screen
from textual.widgets import Static
from tui.views.app import EagleApp

OUT = open(sys.argv[1], "a", buffering=1)

class Keys(Screen):
    BINDINGS = []

    def compose(self):
        yield Static("keys")

    def on_mount(self):
        OUT.write("ready\\n")

    def on_key(self, event):
        OUT.write(f"key {event.key} {event.character!r}\\n")
        if event.key == "x":
            self.app.exit()

    def on_mouse_down(self, event):
        OUT.write(f"click {event.screen_x},{event.screen_y} button {event.button}\\n")

    def on_paste(self, event):
        OUT.write(f"paste {len(event.text)} chars, ends {event.text[-3:]!r}\\n")

EagleApp(Keys()).run()
"""


def wakeups(pid: int) -> dict[str, int]:
    """Voluntary context switches of each of the process's threads."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue
        out[task.name] = int(next(line.split()[1] for line in status.splitlines()
                                  if line.startswith("voluntary_ctxt_switches")))
    return out


def wait_for(path: Path, text: str, seconds: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if text in path.read_text():
            return time.monotonic() - t0
        time.sleep(0.01)
    return None


def write_all(fd: int, data: bytes, drain: Callable[[], None]) -> None:
    """All of `data` into a non-blocking pty master, draining the app's output meanwhile."""
    deadline = time.monotonic() + 10
    while data and time.monotonic() < deadline:
        try:
            data = data[os.write(fd, data):]
        except BlockingIOError:
            drain()
            time.sleep(0.01)
    assert not data, "the app read no input for 10 s"


def test_keys_reach_the_app_and_an_idle_app_sleeps(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("")
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", APP, str(keys)], cwd=ROOT, stdin=slave, stdout=slave,
                            stderr=slave, env=checkout.env(TERM="xterm"), start_new_session=True)
    os.close(slave)
    os.set_blocking(master, False)

    def drain() -> None:
        try:
            while os.read(master, 65536):
                pass
        except OSError:
            pass

    try:
        t0 = time.monotonic()
        while "ready" not in keys.read_text() and time.monotonic() - t0 < 60 and proc.poll() is None:
            drain()
            time.sleep(0.05)
        assert "ready" in keys.read_text(), "the app never mounted"
        time.sleep(1.0)
        drain()
        before = wakeups(proc.pid)
        time.sleep(3.0)
        after = wakeups(proc.pid)
        woke = {tid: after[tid] - before.get(tid, 0) for tid in after}
        assert max(woke.values()) <= 6, f"threads woke while no key came, in 3 s: {woke}"

        os.write(master, b"a")
        assert wait_for(keys, "key a", 5) is not None, keys.read_text()
        os.write(master, b"\x1b")  # a lone Escape: sent once its delay (ESCDELAY, 0.1 s) passed
        assert wait_for(keys, "key escape", 2) is not None, keys.read_text()
        os.write(master, b"\x1b[A")  # a whole sequence is one key, not Escape then text
        assert wait_for(keys, "key up", 2) is not None, keys.read_text()
        assert keys.read_text().count("key escape") == 1, keys.read_text()
        os.write(master, "é".encode()[:1])  # a character split across two reads
        time.sleep(0.3)
        os.write(master, "é".encode()[1:])
        assert wait_for(keys, "'é'", 2) is not None, keys.read_text()
        os.write(master, b"\x1b[<0;12;5M\x1b[<0;12;5m")  # a click (SGR mouse: column 12, row 5)
        assert wait_for(keys, "click 11,4 button 1", 2) is not None, keys.read_text()
        pasted = "p" * 9000 + "end"  # a bracketed paste longer than one read, in two writes
        write_all(master, b"\x1b[200~" + pasted[:5000].encode(), drain)
        time.sleep(0.3)  # longer than a lone Escape's delay: the paste must not end there
        write_all(master, pasted[5000:].encode() + b"\x1b[201~", drain)
        assert wait_for(keys, "paste 9003 chars, ends 'end'", 2) is not None, keys.read_text()

        os.write(master, b"x")
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < 10:
            drain()
            time.sleep(0.02)
        assert proc.poll() == 0, "the app did not end after its exit: its input thread kept it"
        assert time.monotonic() - t0 < 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_a_browser_sessions_input_sleeps_too_and_a_lone_escape_gets_through(tmp_path: Path) -> None:
    """A browser session's app reads the server's pipe (Textual's web driver): no thread
    of it wakes ten times a second while no key comes, and a lone Escape (closing the help
    screen) still arrives once its delay passed."""

    async def check(served: Served) -> None:
        async with with_cookie(served) as http:
            page = Page(http, served, port_of(served))
            await page.open(100, 30)
            await page.until(whole_screen(30))
            app = next(pid for pid in descendants(served.proc.pid)
                       if b"\0connect\0" in Path(f"/proc/{pid}/cmdline").read_bytes())
            await asyncio.sleep(1.0)
            before = wakeups(app)
            await asyncio.sleep(3.0)
            after = wakeups(app)
            woke = {tid: after[tid] - before.get(tid, 0) for tid in after}
            others = {tid: n for tid, n in woke.items() if tid != str(app)}  # the main thread takes 1 Hz snapshots
            assert max(others.values()) <= 3, f"threads woke while no key came, in 3 s: {woke}"
            await page.ws.send_str(json.dumps(["stdin", "?"]))
            await page.until(lambda p: "watches one run" in p.text())
            page.data = b""
            await page.ws.send_str(json.dumps(["stdin", "\x1b"]))
            await page.until(lambda p: "Kill run" in p.text())  # the dashboard's footer: the help is gone

    with serve(tmp_path) as served:
        asyncio.run(check(served))


def test_a_lone_escape_gets_through_when_the_input_thread_was_slow_to_parse() -> None:
    """The Escape's delay counts from when the parser took the byte, not from the read:
    an input thread that lost the core (a loaded machine, the GIL held by a repaint)
    between its read and the parse still sends the Escape once its delay passed, not at
    the next key. The real loop (`_read_terminal`, `quiet_reads`) and Textual's parser on
    a pipe; the key before the Escape takes 30 ms to hand on, as a descheduled thread does."""
    import threading

    from textual.drivers.linux_driver import LinuxDriver

    from tui.views.driver import Waker, WakingEvent, remembering

    cls = remembering(LinuxDriver)
    driver = cls.__new__(cls)  # no app, no terminal, no signal handlers: only the loop
    r, w = os.pipe()
    driver.fileno, driver._debug = r, False
    driver.exit_event = WakingEvent(Waker())
    keys: list[str] = []
    escape = threading.Event()

    def process_message(event: object) -> None:
        keys.append(getattr(event, "key", ""))
        if keys[-1] == "x":
            time.sleep(0.03)
        if keys[-1] == "escape":
            escape.set()

    driver.process_message = process_message
    reader = threading.Thread(target=driver._read_terminal, daemon=True)
    reader.start()
    try:
        os.write(w, b"x\x1b")
        assert escape.wait(2.0), f"the lone Escape waited for the next key: {keys}"
        assert keys == ["x", "escape"]
    finally:
        driver.exit_event.set()
        reader.join(5.0)
        os.close(r)
        os.close(w)
    assert not reader.is_alive()
