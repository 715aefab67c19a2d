"""`eagle3-tui serve`'s sessions over a real WebSocket to a real server: what a page that
drops and comes back, or sends what it should not, relies on. Written for the survivors of
webserve.py's mutation sample (docs/testing.md), each asserting what the user sees, over
aiohttp's client (the page's own way in) and a TCP proxy that can freeze and cut."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp
from aiohttp import web

from tests.test_serve import ESCAPES, KEY, Served, descendants, pid_alive, run, serve  # noqa: F401  (run)
from tests.tunnel import Tunnel
from tui.cli.webpage import ENDED
from tui.cli.webserve import GOODBYE_S
from tui.cli.webserve import Page as ServedPage

ROW = re.compile(rb"\x1b\[(\d+);\d+H")  # a cursor move: the row the app draws on
CANCEL = re.compile(rb"\x1b\[([0-9;]*)m( Cancel \(n\) )")  # the kill confirmation's button, as drawn


@asynccontextmanager
async def with_cookie(served: Served) -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client holding the session cookie, as the page's browser has it after
    loading the token URL (the cookie goes to every port of the host)."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(served.url) as r:
            assert r.status == 200
        yield http


def port_of(served: Served) -> int:
    return int(served.base.rsplit(":", 1)[1].rstrip("/"))


@asynccontextmanager
async def tunnelled(served: Served) -> AsyncIterator[tuple[aiohttp.ClientSession, Tunnel]]:
    """`with_cookie`'s client, and a tunnel to the server that a test can freeze or cut
    (pages opened through `tunnel.port`); the tunnel is closed after."""
    tunnel = Tunnel(port_of(served))
    try:
        async with with_cookie(served) as http:
            yield http, tunnel
    finally:
        tunnel.close()


class Page:
    """One WebSocket on a served session, as the page opens it, and what it was sent."""

    def __init__(self, http: aiohttp.ClientSession, served: Served, port: int) -> None:
        self.http, self.served, self.port = http, served, port
        self.ws: Any = None
        self.session = ""
        self.data = b""

    async def open(self, width: int, height: int, session: str = "", **options: Any) -> str:
        url = f"ws://127.0.0.1:{self.port}/ws?width={width}&height={height}" + (f"&session={session}" if session
                                                                                 else "")
        self.ws = await self.http.ws_connect(url, headers={"Origin": f"http://127.0.0.1:{self.port}"},
                                             protocols=("eagle3-tui", KEY + self.served.token), autoping=True,
                                             **options)
        first = await self.ws.receive(timeout=20)
        assert first.type == aiohttp.WSMsgType.TEXT, first
        kind, self.session = json.loads(first.data)
        assert kind == "eagle3-session"
        self.data = b""
        return self.session

    def text(self) -> str:
        return ESCAPES.sub("", self.data.decode("utf-8", "replace"))

    async def until(self, done: Any, timeout: float = 20) -> None:
        """Read until `done(self)` holds; fail, with what came, after `timeout` s."""
        deadline = time.monotonic() + timeout
        while not done(self):
            left = deadline - time.monotonic()
            assert left > 0, f"not shown in {timeout} s: {self.text()[-1500:]!r}"
            try:
                msg = await self.ws.receive(timeout=min(left, 0.5))
            except asyncio.TimeoutError:
                continue
            assert msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT), (msg, self.text()[-800:])
            if msg.type == aiohttp.WSMsgType.BINARY:
                self.data += msg.data

    async def alive(self) -> None:
        """The session answers: a ping gets its pong (not a close)."""
        await self.ws.send_str(json.dumps(["ping", "are-you-there"]))
        deadline = time.monotonic() + 20
        while True:
            msg = await self.ws.receive(timeout=max(0.1, deadline - time.monotonic()))
            assert msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT), (msg, self.text()[-800:])
            if msg.type == aiohttp.WSMsgType.TEXT and json.loads(msg.data) == ["pong", "are-you-there"]:
                return


def whole_screen(height: int) -> Any:
    """The dashboard drawn whole: its panels' titles (drawn only when the screen is painted
    whole, never by the updates of its numbers) and its bottom row."""
    def done(page: Page) -> bool:
        rows = {int(r) for r in ROW.findall(page.data)}
        return "Runs (" in page.text() and " GPUs " in page.text() and height in rows
    return done


def log_until(served: Served, line: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while line not in served.log():
        assert time.monotonic() < deadline, served.log()
        time.sleep(0.1)
    return served.log()


def test_a_returning_page_gets_the_whole_screen_again_at_its_own_size(tmp_path: Path) -> None:
    """The tunnel drops; the page comes back to its session at the same size. What the app
    drew meanwhile never arrived, so the server has it paint the whole screen again (a
    blank or half-stale page otherwise), and never taller than the page: a row below the
    page's last would land on its bottom row (xterm clamps the cursor there)."""
    width, height = 100, 30

    async def check(served: Served) -> None:
        async with tunnelled(served) as (http, tunnel):
            page = Page(http, served, tunnel.port)
            session = await page.open(width, height)
            await page.until(whole_screen(height))
            await asyncio.sleep(1.5)  # settled: what follows are updates of numbers only
            tunnel.cut()
            await page.ws.close()
            log_until(served, "session 1 from 127.0.0.1 lost its page")
            back = Page(http, served, tunnel.port)
            assert await back.open(width, height, session) == session
            await back.until(whole_screen(height), timeout=10)
            await asyncio.sleep(1)  # the repaint is done (the server waits 0.15 s in it)
            await back.until(lambda p: True)
            drawn = {int(r) for r in ROW.findall(back.data)}
            assert max(drawn) == height, sorted(drawn)  # no row the page does not have
            await back.alive()
            await back.ws.close()

    with serve(tmp_path) as served:
        asyncio.run(check(served))
        log = served.log()
        assert "session 1 back from 127.0.0.1" in log and "session 2 opened" not in log, log


def test_a_binary_frame_is_never_taken_for_keys(tmp_path: Path) -> None:
    """The page sends its keys as text frames. A binary frame (a proxy's garbage, a buggy
    extension) is dropped, not read as keys: one carrying `q` must not quit the session's
    app, and the session goes on answering."""

    async def check(served: Served) -> None:
        async with with_cookie(served) as http:
            page = Page(http, served, port_of(served))
            await page.open(100, 30)
            await page.until(whole_screen(30))
            for frame in (b"\xff\x00garbage", json.dumps(["stdin", "q"]).encode(), b'["stdin"'):
                await page.ws.send_bytes(frame)
            await page.alive()
            await asyncio.sleep(3)  # a quitting app takes a moment
            await page.alive()
            assert not page.ws.closed
            await page.ws.close()

    with serve(tmp_path) as served:
        asyncio.run(check(served))
        log_until(served, "session 1 from 127.0.0.1 ended after")
        assert "(its page closed)" in served.log() and "its app" not in served.log(), served.log()


def test_a_page_that_vanishes_mid_send_keeps_its_session_for_the_grace(tmp_path: Path) -> None:
    """A page asleep (it reads nothing, the server's sends wait on it) whose tunnel then
    dies: the send in progress fails. The session must stay for its grace period, as for
    any lost page, and the page that comes back finds it; the page's script is told the
    same grace, in its unit (ms)."""

    async def check(served: Served) -> None:
        async with tunnelled(served) as (http, tunnel):
            async with http.get(served.base + "page.js") as r:
                script = await r.text()
            page = Page(http, served, tunnel.port)
            session = await page.open(100, 30)
            await page.until(whole_screen(30))
            tunnel.freeze()
            for i in range(40):  # the page (still sending) makes the app paint whole screens
                size = {"width": 600 + i % 2, "height": 200}
                await page.ws.send_str(json.dumps(["resize", size]))
                await asyncio.sleep(0.1)
            tunnel.cut()
            await page.ws.close()
            log = log_until(served, "session 1 from 127.0.0.1 lost its page")
            await asyncio.sleep(2)
            back = Page(http, served, tunnel.port)
            assert await back.open(100, 30, session) == session, served.log()
            await back.until(whole_screen(30), timeout=10)
            await back.alive()
            await back.ws.close()
        kept = re.search(r"lost its page; kept (\d+) s", log)
        assert kept, log
        grace_ms = re.search(r"GRACE_MS = (\d+)", script)
        assert grace_ms and int(grace_ms[1]) == 1000 * int(kept[1]), (grace_ms, kept[1])

    with serve(tmp_path) as served:
        asyncio.run(check(served))
        assert "session 1 back from 127.0.0.1" in served.log(), served.log()
        assert "ended" not in served.log().split("lost its page")[1].split("back from")[0], served.log()


def reverse_video(data: bytes) -> list[bool]:
    """Each drawing of the confirmation's Cancel button in `data`, in order: True where it
    is drawn in reverse video (the highlight of the focused button), False where plain."""
    drawn = []
    for m in CANCEL.finditer(data):
        params, plain = m[1].split(b";"), set()
        i = 0
        while i < len(params):  # a colour's own numbers (38;2;R;G;B, 48;5;N) are not attributes
            if params[i] in (b"38", b"48"):
                i += 5 if params[i + 1 : i + 2] == [b"2"] else 3
                continue
            plain.add(params[i])
            i += 1
        drawn.append(b"7" in plain)
    return drawn


def test_a_tab_left_and_come_back_to_gets_its_focus_highlight_back(tmp_path: Path, run: dict[str, Any]) -> None:
    """The page tells the server when its tab loses the focus (`blur`) and gets it back
    (`focus`); the app then draws its focused widget without, then with, its highlight.
    Seen here on the kill confirmation, whose Cancel button has the focus (drawn in reverse
    video): after the tab is left and come back to, the highlight is back (the user sees
    where Enter goes). A message of a kind the server does not know changes nothing: the
    button stays plain until the real `focus`."""
    async def check(served: Served) -> None:
        async with with_cookie(served) as http:
            page = Page(http, served, port_of(served))
            await page.open(120, 30)
            await page.until(lambda p: run["run_id"].encode() in p.data, timeout=30)
            await page.ws.send_str(json.dumps(["stdin", "k"]))
            await page.until(lambda p: reverse_video(p.data)[-1:] == [True])  # Cancel has the focus
            for kinds, highlighted in (([["blur"]], False), ([["focus"]], True), ([["blur"]], False)):
                page.data = b""
                for kind in kinds:
                    await page.ws.send_str(json.dumps(kind))
                await page.until(lambda p, h=highlighted: reverse_video(p.data)[-1:] == [h])
            page.data = b""
            for unknown in (["focused"], ["Focus"], ["stdin"], ["resize", "big"], ["ping"], [7]):
                await page.ws.send_str(json.dumps(unknown))
            deadline = time.monotonic() + 2  # ignored: no highlight comes back meanwhile
            await page.until(lambda p: True in reverse_video(p.data) or time.monotonic() > deadline)
            assert True not in reverse_video(page.data), "an unknown message gave the focus back"
            await page.ws.send_str(json.dumps(["focus"]))
            await page.until(lambda p: reverse_video(p.data)[-1:] == [True])
            await page.alive()
            await page.ws.close()

    with serve(tmp_path) as served:
        asyncio.run(check(served))


def test_a_stopping_server_waits_for_the_pages_answer_before_it_hangs_up(tmp_path: Path) -> None:
    """The server stops (Ctrl+C, SIGTERM): each page is sent "session ended" (close code
    4001), its connection stays until the page answers, and the answer is read (the
    sessions end before aiohttp's own stop, which reads nothing more). A hang-up right
    after the frame, with no answer awaited, let a page behind on its reading lose it:
    under load the page showed "reconnecting…" for a minute against a server that was gone."""

    async def check(served: Served) -> None:
        async with with_cookie(served) as http:
            page = Page(http, served, port_of(served))
            await page.open(100, 30, autoclose=False)  # the answer is the test's to send
            await page.until(whole_screen(30))
            served.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 10
            while (msg := await page.ws.receive(timeout=max(0.1, deadline - time.monotonic()))).type in (
                    aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                pass
            assert (msg.type, msg.data, msg.extra) == (aiohttp.WSMsgType.CLOSE, ENDED, "session ended"), msg
            await asyncio.sleep(0.5)
            sock = page.ws.get_extra_info("socket")  # None: the connection is gone already
            state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] if sock is not None else None
            assert state == 1, f"the server hung up before the page answered (TCP state {state}, 1 is established)"
            assert served.proc.poll() is None
            await page.ws.close()  # the answer: now the server goes
            await asyncio.to_thread(served.proc.wait, 10)

    with serve(tmp_path) as served:
        asyncio.run(check(served))
        log = served.log()
        assert re.search(r"session 1 from 127\.0\.0\.1 ended after \d+ s \(the server stops\); connected now: none",
                         log), log  # and not "its page did not answer": its answer was read


async def asleep(http: aiohttp.ClientSession, served: Served, tunnel: Tunnel) -> tuple[Page, str]:
    """A page opened through `tunnel` at 250x80 and drawn, then asleep behind
    `tunnel.freeze()` while the app draws: whole repaints (~150 KB each) it never reads,
    past what the kernel holds for a connection nobody reads (4 MB by default): the
    server's sends to it wait. The page and its session."""
    page = Page(http, served, tunnel.port)
    session = await page.open(250, 80)
    await page.until(whole_screen(80))
    tunnel.freeze()
    for i in range(60):
        await page.ws.send_str(json.dumps(["resize", {"width": 250 - i % 2, "height": 80}]))
        await asyncio.sleep(0.1)
    return page, session


def test_a_stopping_server_does_not_wait_for_ever_on_a_page_that_reads_nothing(tmp_path: Path) -> None:
    """A page asleep behind its tunnel when the server stops: "session ended" cannot even
    be sent. The server gives the page GOODBYE_S, then cuts it; the session's app quits
    (its output no longer waits on the page) and the server is gone with no app left,
    not hung until the tunnel dies."""

    async def check(served: Served) -> list[int]:
        async with tunnelled(served) as (http, tunnel):
            await asleep(http, served, tunnel)
            apps = descendants(served.proc.pid)
            t0 = time.monotonic()
            served.proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(served.proc.wait, GOODBYE_S + 15)
            assert time.monotonic() - t0 < GOODBYE_S + 5
            return [pid for pid in apps if pid_alive(pid)]

    with serve(tmp_path) as served:
        assert asyncio.run(check(served)) == []  # the session's app ended with the server
        assert "(the server stops; its page did not answer, its connection was cut)" in served.log(), served.log()


def test_a_tab_taking_over_from_one_asleep_gets_the_session(tmp_path: Path) -> None:
    """Tab A is asleep (its tunnel frozen, the server's sends to it waiting); tab B opens
    the same session. A is told to go (and cut when it cannot even be told), and B gets the
    session, drawn, its app alive: A's stalled connection must not end the session."""

    async def check(served: Served) -> None:
        async with tunnelled(served) as (http, tunnel):
            _, session = await asleep(http, served, tunnel)  # tab A
            b = Page(http, served, port_of(served))
            assert await b.open(120, 40, session) == session
            await b.until(whole_screen(40), timeout=GOODBYE_S + 15)
            await asyncio.sleep(GOODBYE_S + 1)  # past A's cut
            await b.alive()
            await b.ws.close()

    with serve(tmp_path) as served:
        asyncio.run(check(served))
        log = served.log()
        assert "session 1 back from 127.0.0.1" in log and "its app ended" not in log, log


def test_a_page_the_heartbeat_gave_up_on_comes_back_to_a_live_session(tmp_path: Path) -> None:
    """A page asleep long enough for the heartbeat to call it lost (no pong in ~22 s): its
    connection is dropped with what waited to be sent, so the app's output flows again and
    the page that comes back (`?session=ID`) is drawn at once."""

    async def check(served: Served) -> None:
        async with tunnelled(served) as (http, tunnel):
            _, session = await asleep(http, served, tunnel)
            await asyncio.to_thread(log_until, served, "session 1 from 127.0.0.1 lost its page", 60)
            back = Page(http, served, port_of(served))
            assert await back.open(120, 40, session) == session
            await back.until(whole_screen(40), timeout=10)
            await back.alive()
            await back.ws.close()

    with serve(tmp_path) as served:
        asyncio.run(check(served))


def test_the_close_frame_goes_after_the_frame_being_sent() -> None:
    """The session ends while a big frame of the app's output is on its way (aiohttp
    compresses a frame past 16 KiB in a thread, and writes it when that is done): the page
    gets that frame whole, then "session ended". A close frame written first, with the
    frame after it, made the page drop the connection as broken (1006) and show
    "reconnecting…" against a server that was stopping. A real aiohttp server and client
    with permessage-deflate, as Chromium negotiates it, in this process."""
    big = "".join(f"\x1b[{i % 50};{i % 160}H row {i} " for i in range(200_000)).encode()  # ~3.6 MB

    async def check() -> None:
        ended: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        async def handler(request: web.Request) -> web.WebSocketResponse:
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            page = ServedPage(ws, request.transport)
            page.reading = asyncio.ensure_future(ws.receive())
            sending = asyncio.ensure_future(page.send(big))
            await asyncio.sleep(0)  # its compression under way, in aiohttp's thread
            ended.set_result(await page.goodbye(b"session ended"))
            await sending
            return ws

        app = web.Application()
        app.router.add_get("/ws", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as http:
                ws = await http.ws_connect(f"http://127.0.0.1:{port}/ws", compress=15, autoclose=False)
                assert ws.compress == 15  # deflate negotiated: the big frame is compressed
                first = await ws.receive(timeout=20)
                assert first.type == aiohttp.WSMsgType.BINARY, f"{first} came first: the close went first"
                assert len(first.data) == len(big)
                close = await ws.receive(timeout=20)
                assert (close.type, close.data, close.extra) == (aiohttp.WSMsgType.CLOSE, ENDED, "session ended")
                await ws.close()
            assert await asyncio.wait_for(ended, 10)  # and the page's answer was read
        finally:
            await runner.cleanup()

    asyncio.run(check())
