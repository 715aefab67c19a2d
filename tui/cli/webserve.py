"""The web server of `eagle3-tui serve`: textual-serve's app processes behind a token.

textual-serve (Textualize) runs one app process per browser session, its screen and
keys over a WebSocket, and has no authentication of its own. This module builds the
aiohttp application around its `AppService` and adds, the way Jupyter does:

- a token: the `?token=` of the printed URL. Loading the page with it gives the page
  the token (kept in the page's `localStorage`, which, unlike a cookie, belongs to this
  port alone) and a cookie for the page's files; the address bar loses it at once. The
  cookie is not the token and opens no session: every other port of this host receives
  it (cookies are scoped by host, not by port). Every request without the cookie gets
  401 (none given) or 403 (a wrong one), compared in constant time;
- a WebSocket only with the token itself, carried as a WebSocket subprotocol
  (`eagle3-tui.k.TOKEN`: never in a URL, so never in a log), and only from the page's
  own origin (the browser-side defence);
- headers that keep the page out of frames and other origins (CSP, no referrer);
- an access log without query strings (the token never reaches a log) and a line for
  each browser session that opens or closes (who, from where, how many now).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import html
import itertools
import json
import logging
import os
import re
import secrets
import shlex
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.abc import AbstractAccessLogger
from textual_serve.app_service import AppService
from textual_serve.download_manager import DownloadManager
from textual_serve.server import Server
from yarl import URL

from tui.cli.webpage import ENDED, FAVICON, KEY_PREFIX, PAGE, PAGE_JS, PROTOCOL

log = logging.getLogger("eagle3-tui.serve")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
UNPRINTABLE = re.compile(r"[^\x20-\x7e]")  # paths, user agents: the client's text, one line
GOODBYE_S = 5.0  # how long "session ended" may take to reach a page and be answered before its connection is cut


class Page:
    """One page's WebSocket, the task reading it, and its end.

    `goodbye` is a whole closing handshake: the reader stops first, so that aiohttp's
    `close()` sends the close frame and then reads until the page answers it; the TCP
    connection closes after the answer. A close called while another task reads hangs
    up right after the frame instead, with no answer awaited: a page behind on its
    reading (a loaded machine, a slow link) could lose the frame and take "Session
    ended" for a blip, "reconnecting…" for a minute against a server that was gone.
    A page that does not answer in GOODBYE_S (asleep, frozen) is `cut`.

    The app's output goes out through `send`, one frame at a time, and the close frame
    after the last of them: aiohttp compresses a large frame in a thread and writes it
    when that is done, so a close written meanwhile went out first, and the page, given a
    frame after the close, dropped the connection as broken (1006: "reconnecting…")."""

    def __init__(self, ws: web.WebSocketResponse, transport: asyncio.Transport | None) -> None:
        self.ws, self.transport = ws, transport
        self.reading: asyncio.Future[None] | None = None
        self.closing: asyncio.Future[bool] | None = None
        self.sending = asyncio.Lock()

    async def send(self, data: bytes | str) -> None:
        async with self.sending:
            if self.ws.closed:
                return  # told to go (or gone): its return, if any, redraws the screen
            try:
                if isinstance(data, bytes):
                    await self.ws.send_bytes(data)
                else:
                    await self.ws.send_str(data)
            except ConnectionError:
                pass

    def goodbye(self, message: bytes) -> asyncio.Future[bool]:
        """Tell the page its session ended (close code 4001); the future says whether it answered."""
        if self.closing is None:
            self.closing = asyncio.ensure_future(self._goodbye(message))
        return self.closing

    async def _goodbye(self, message: bytes) -> bool:
        if self.reading is not None:
            self.reading.cancel()
            await asyncio.wait({self.reading})
        # Never cancelled: a close() waiting to send shares aiohttp's drain with the app's
        # output (`send`), which a cancel would end with it. Cut, it returns at once.
        close = asyncio.ensure_future(self._close(message))
        if not (await asyncio.wait({close}, timeout=GOODBYE_S))[0]:
            self.cut()
            await asyncio.wait({close})
            return False
        return self.ws.exception() is None and self.ws.close_code != WSCloseCode.ABNORMAL_CLOSURE

    async def _close(self, message: bytes) -> None:
        async with self.sending:  # the frame being sent goes out whole first, and none after
            await self.ws.close(code=ENDED, message=message)

    def cut(self) -> None:
        """Drop the connection and what waits to be sent on it: every send waiting on the
        page fails now (aiohttp's own close, and the heartbeat's, wait for it to be sent)."""
        if self.transport is not None:
            self.transport.abort()


@dataclass
class Session:
    """One browser session: its app process, and the page drawing it (None while the
    page is away: the app is kept `grace_s` for the page to come back)."""

    number: int
    id: str
    peer: str
    agent: str
    started: float  # time.time()
    service: AppService | None = None
    page: Page | None = None
    reaper: asyncio.TimerHandle | None = None
    ended: bool = False


class PathOnlyAccessLogger(AbstractAccessLogger):
    """aiohttp's access log prints the request line, query string (the token) and all:
    this one prints the path alone."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info("%s %s %s %s", request.remote, request.method, clean(request.path, 200), response.status)


def cookie_value(token: bytes) -> str:
    """What the cookie holds: derived from the token, never the token (it opens no session)."""
    return hmac.new(token, b"eagle3-tui serve cookie", hashlib.sha256).hexdigest()


class WebServer:
    """The aiohttp application serving `command` (one process per browser session)."""

    def __init__(self, command: list[str], token: str, *, port: int, tls: bool, sessions_file: Path,
                 title: str = "eagle3-tui", read_only: bool = False, grace_s: float = 60.0) -> None:
        """`sessions_file`: where the open sessions are listed for their apps
        (tui/views/served.py reads it), in a directory only this user can read."""
        self.command = shlex.join(command)
        self.token = token.encode()
        self.cookie_value = cookie_value(self.token)
        self.sessions_file = sessions_file
        self.tls = tls
        self.title = title
        self.read_only = read_only
        self.grace_s = grace_s
        self.cookie = f"eagle3-tui-{port}"  # cookies do not tell ports apart: nor does its value open anything
        self.downloads = DownloadManager()
        self.statics = Server(self.command).statics_path  # its page's files: xterm.css, textual.js, fonts
        self.sessions: dict[str, Session] = {}
        self._numbers = itertools.count(1)
        self._closing = False
        self._background: set[asyncio.Future[None]] = set()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        app.on_response_prepare.append(self._headers)
        app.on_startup.append(self._take_signals)
        app.on_shutdown.append(self._end_sessions)
        app.add_routes([
            web.get("/", self._index),
            web.get("/page.js", self._page_js),
            web.get("/favicon.svg", self._favicon),
            web.get("/favicon.ico", self._favicon),
            web.get("/ws", self._websocket),
            web.get("/download/{key}", self._download),
            web.static("/static", self.statics),
        ])
        return app

    # ---- the token ------------------------------------------------------------------
    def _good(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.token)

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.query.get("token")
        if given is not None:
            if not self._good(given):
                log.warning("%s: wrong token for %s", request.remote, clean(request.path))
                raise web.HTTPForbidden(text="eagle3-tui serve: wrong token\n")
            if request.path == "/":  # the page, given the token for its WebSocket
                response = await self._index(request, key=given)
            else:  # take it out of the address bar (and so out of the history)
                query = request.rel_url.query.copy()
                query.popall("token")
                here = URL.build(path="/" + request.path.lstrip("/"), query=query)  # never `//host`
                response = web.Response(status=303, headers={"Location": str(here)})
            response.set_cookie(self.cookie, self.cookie_value, httponly=True, samesite="Strict",
                                secure=self.tls, path="/")
            return response
        cookie = request.cookies.get(self.cookie)
        if cookie is None:
            raise web.HTTPUnauthorized(
                text="eagle3-tui serve: open the URL the server printed (it ends in ?token=…)\n")
        if not hmac.compare_digest(cookie.encode(), self.cookie_value.encode()):
            log.warning("%s: wrong token cookie for %s", request.remote, clean(request.path))
            raise web.HTTPForbidden(text="eagle3-tui serve: wrong token (a restarted server has a new one: "
                                         "eagle3-tui serve --url)\n")
        return await handler(request)

    async def _headers(self, request: web.Request, response: web.StreamResponse) -> None:
        ws = f"{'wss' if self.tls else 'ws'}://{request.host}"
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
            f"img-src 'self' data:; font-src 'self'; connect-src 'self' {ws}; "
            "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Cache-Control"] = "no-store"

    # ---- the page -------------------------------------------------------------------
    async def _index(self, request: web.Request, key: str = "") -> web.Response:
        try:
            font_size = max(6, min(40, int(request.query.get("fontsize", "16"))))
        except ValueError:
            font_size = 16
        ws_url = f"{'wss' if self.tls else 'ws'}://{request.host}/ws"
        page = PAGE.format(ws_url=html.escape(ws_url), font_size=font_size, key=html.escape(key),
                           title=html.escape(self.title))
        return web.Response(text=page, content_type="text/html")

    async def _page_js(self, request: web.Request) -> web.Response:
        text = PAGE_JS % {"grace_ms": int(self.grace_s * 1000), "protocol": PROTOCOL, "prefix": KEY_PREFIX,
                          "ended": ENDED}
        return web.Response(text=text, content_type="text/javascript")

    async def _favicon(self, request: web.Request) -> web.Response:
        return web.Response(text=FAVICON, content_type="image/svg+xml")

    async def _download(self, request: web.Request) -> web.StreamResponse:
        """A file an app delivers (textual-serve's download route, on our manager)."""
        key = request.match_info["key"]
        try:
            meta = await self.downloads.get_download_metadata(key)
        except KeyError:
            raise web.HTTPNotFound(text="eagle3-tui serve: no such download\n") from None
        response = web.StreamResponse()
        response.headers["Content-Type"] = meta.mime_type + (f"; charset={meta.encoding}" if meta.encoding else "")
        disposition = "inline" if meta.open_method == "browser" else "attachment"
        response.headers["Content-Disposition"] = f"{disposition}; filename={clean(meta.file_name)}"
        await response.prepare(request)
        async for chunk in self.downloads.download(key):
            await response.write(chunk)
        await response.write_eof()
        return response

    # ---- the WebSocket --------------------------------------------------------------
    def _key_given(self, request: web.Request) -> bool:
        offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        keys = [p[len(KEY_PREFIX):] for p in offered if p.startswith(KEY_PREFIX)]
        return len(keys) == 1 and self._good(keys[0])

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        own = f"{'https' if self.tls else 'http'}://{request.host}"
        if origin != own:
            log.warning("%s: WebSocket refused, origin %s is not %s", request.remote,
                        clean(origin or "(none)"), clean(own))
            raise web.HTTPForbidden(text="eagle3-tui serve: WebSocket from another origin\n")
        if not self._key_given(request):
            log.warning("%s: WebSocket refused, no token or a wrong one (the cookie alone opens nothing)",
                        request.remote)
            raise web.HTTPForbidden(text="eagle3-tui serve: WebSocket without the token\n")
        if self._closing:
            raise web.HTTPServiceUnavailable(text="eagle3-tui serve: stopping\n")
        ws = web.WebSocketResponse(heartbeat=15, protocols=(PROTOCOL,), timeout=GOODBYE_S)
        await ws.prepare(request)
        page = Page(ws, request.transport)
        session = await self._open(request, page)
        page.reading = asyncio.ensure_future(self._read(ws, session))
        try:
            await ws.send_str(json.dumps(["eagle3-session", session.id]))
            await asyncio.wait({page.reading})
            error = None if page.reading.cancelled() else page.reading.exception()  # retrieved either way
            if page.closing is not None:  # the page is told its session ended: its answer comes
                await asyncio.wait({page.closing})  # before aiohttp closes the connection (on return)
            elif error is not None:
                raise error  # the reader's error is this request's
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            page.reading.cancel()
            if session.page is page:
                session.page = None
                if ws.close_code in (WSCloseCode.OK, WSCloseCode.GOING_AWAY):  # the page said goodbye:
                    self._spawn(self._end(session, "its page closed"))  # a closed tab, a reload
                else:
                    self._lost(session)  # dropped without a word: a blip, a sleeping laptop
                    page.cut()  # a page the heartbeat gave up on: the app's output no longer waits on it
        return ws

    async def _open(self, request: web.Request, page: Page) -> Session:
        width = number(request.query.get("width"), 80)
        height = number(request.query.get("height"), 24)
        session = self.sessions.get(request.query.get("session", ""))
        if session is not None and not session.ended:
            if session.reaper is not None:
                session.reaper.cancel()
                session.reaper = None
            old, session.page = session.page, page
            if old is not None:  # another tab took it over: that one's page ends
                old.goodbye(b"taken over by another page")  # its own handler waits for its answer
            session.peer = request.remote or "?"
            log.info("session %d back from %s; connected now: %s", session.number, session.peer, self.describe())
            self._write_sessions()
            self._spawn(self._redraw(session, number(request.query.get("width"), 80),
                                     number(request.query.get("height"), 24)))
            return session
        n = next(self._numbers)
        session = Session(n, secrets.token_urlsafe(18), request.remote or "?",
                          clean(request.headers.get("User-Agent", "?")),
                          time.time(), page=page)
        self.sessions[session.id] = session

        async def to_page(data: bytes | str) -> None:
            if session.page is not None:  # None: the page is away, its return redraws the screen
                await session.page.send(data)

        async def app_exited() -> None:  # the app said so (q): the page shows "Session ended"
            self._spawn(self._end(session, "its app quit"))  # not awaited: the app's own reader calls this

        session.service = Service(self.command, write_bytes=to_page, write_str=to_page, close=app_exited,
                                  download_manager=self.downloads, on_end=lambda: self._ended_alone(session))
        log.info("session %d opened from %s (%s), %s; connected now: %s", n, session.peer, session.agent,
                 "read-only" if self.read_only else "full control", self.describe())
        self._write_sessions()
        await session.service.start(width, height)
        return session

    async def _read(self, ws: web.WebSocketResponse, session: Session) -> None:
        """The page's messages, as textual-serve's own loop reads them."""
        service = session.service
        assert service is not None
        async for message in ws:
            if message.type != WSMsgType.TEXT or session.ended:
                continue
            try:
                kind, *rest = json.loads(message.data)
            except (ValueError, TypeError):
                continue
            if kind == "stdin" and rest and isinstance(rest[0], str):
                await service.send_bytes(rest[0].encode("utf-8", "replace"))
            elif kind == "resize" and rest and isinstance(rest[0], dict):
                await service.set_terminal_size(number(rest[0].get("width"), 80), number(rest[0].get("height"), 24))
            elif kind == "ping" and rest:
                await ws.send_json(["pong", str(rest[0])[:40]])
            elif kind == "blur":
                await service.blur()
            elif kind == "focus":
                await service.focus()

    async def _redraw(self, session: Session, width: int, height: int) -> None:
        """A returning page: the app paints its whole screen again (what it drew while the
        page was away never arrived). Textual repaints all on a change of size only, so
        one row less for a moment, then the page's size."""
        assert session.service is not None
        await session.service.set_terminal_size(width, max(1, height - 1))
        await asyncio.sleep(0.15)
        await session.service.set_terminal_size(width, height)

    def _lost(self, session: Session) -> None:
        """The page went away without the session ending: keep the app `grace_s`."""
        if session.ended or self._closing:
            return
        log.info("session %d from %s lost its page; kept %.0f s for it to come back", session.number,
                 session.peer, self.grace_s)
        loop = asyncio.get_running_loop()
        session.reaper = loop.call_later(self.grace_s, lambda: self._spawn(self._end(session, "not back in time")))
        self._write_sessions()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _ended_alone(self, session: Session) -> None:
        """The app process ended (a crash, or after `q`): end the session with it."""
        if not session.ended:
            self._spawn(self._end(session, "its app ended"))

    async def _end(self, session: Session, why: str) -> None:
        if session.ended:
            return
        session.ended = True
        if session.reaper is not None:
            session.reaper.cancel()
        self.sessions.pop(session.id, None)
        unanswered = ""
        if session.page is not None:
            told = session.page.goodbye(b"session ended")
            await asyncio.wait({told})
            answered = not told.cancelled() and told.exception() is None and told.result()
            unanswered = "" if answered else "; its page did not answer, its connection was cut"
        if session.service is not None:
            await session.service.stop()
        log.info("session %d from %s ended after %.0f s (%s%s); connected now: %s", session.number, session.peer,
                 time.time() - session.started, why, unanswered, self.describe())
        self._write_sessions()

    async def _take_signals(self, app: web.Application) -> None:
        """Ctrl+C and SIGTERM end the sessions before aiohttp's own stop (whose handlers
        these replace): once it stops, aiohttp reads nothing more from any connection, so
        no page's answer to "Session ended" would be seen. A second signal stops at once."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop)

    def _stop(self) -> None:
        if self._closing:
            raise web.GracefulExit()  # as aiohttp's handler does: run_app stops
        self._closing = True
        self._spawn(self._stop_after_sessions())

    async def _stop_after_sessions(self) -> None:
        await self._end_sessions()
        asyncio.get_running_loop().call_soon(self._stop)

    async def _end_sessions(self, app: web.Application | None = None) -> None:
        """The server's stop: end each session now (its page is told "Session ended" and
        answers, its app is told to quit), all at once; aiohttp's stop calls it too."""
        self._closing = True
        await asyncio.gather(*(self._end(s, "the server stops") for s in list(self.sessions.values())),
                             return_exceptions=True)

    def _write_sessions(self) -> None:
        rows = [{"number": s.number, "peer": s.peer, "agent": s.agent, "since": s.started,
                 "read_only": self.read_only, "away": s.page is None} for s in self.sessions.values()]
        tmp = self.sessions_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, self.sessions_file)  # a reader never sees half a list

    def describe(self) -> str:
        return ", ".join(f"#{s.number} {s.peer}{' (away)' if s.page is None else ''}"
                         for s in self.sessions.values()) or "none"


class Service(AppService):
    """textual-serve's app process, telling us when it ends (its `run` returns)."""

    def __init__(self, command: str, *, on_end: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(command, **kwargs)
        self.on_end = on_end

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            self.on_end()


def number(value: Any, default: int) -> int:
    try:
        return max(1, min(1000, int(value)))
    except (TypeError, ValueError):
        return default


def clean(text: str, limit: int = 80) -> str:
    return UNPRINTABLE.sub("?", text)[:limit]


def run(server: WebServer, sock: Any, ssl_context: Any) -> None:
    """Serve until SIGINT/SIGTERM; each open session's app is told to quit then."""
    web.run_app(server.app(), sock=sock, ssl_context=ssl_context, print=None,
                access_log=log, access_log_class=PathOnlyAccessLogger)
