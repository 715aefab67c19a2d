"""The web server of `eagle3-tui serve`: textual-serve's handlers behind a token.

textual-serve (Textualize) runs one app process per browser session, its screen and
keys over a WebSocket, and has no authentication of its own. This module builds the
aiohttp application around its public handlers and adds, the way Jupyter does:

- a token: the `?token=` of the printed URL, traded at once for an HttpOnly,
  SameSite=Strict cookie (and dropped from the address bar); every request without it
  gets 401 (none given) or 403 (a wrong one), compared in constant time;
- the WebSocket only from the page's own origin (a page on another port of this host
  is the same *site*, so the cookie alone would not stop it);
- headers that keep the page out of frames and other origins (CSP, no referrer);
- an access log without query strings (the token never reaches a log) and a line for
  each browser session that opens or closes (who, from where, how many now).
"""

from __future__ import annotations

import asyncio
import hmac
import html
import itertools
import json
import logging
import os
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from textual_serve.server import Server
from yarl import URL

log = logging.getLogger("eagle3-tui.serve")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
UNPRINTABLE = re.compile(r"[^\x20-\x7e]")  # paths, user agents: the client's text, one line

PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>eagle3-tui</title>
<link rel="stylesheet" href="/static/css/xterm.css">
<link rel="preload" href="/static/fonts/RobotoMono-VariableFont_wght.ttf" as="font" type="font/ttf" crossorigin>
<script src="/fit.js"></script>
<script src="/static/js/textual.js"></script>
<style>
@font-face {{ font-family: "Roboto Mono"; src: url("/static/fonts/RobotoMono-VariableFont_wght.ttf"); }}
html, body {{ margin: 0; height: 100%; background: #0c181f; color: #ddd; font-family: "Roboto Mono", monospace; }}
.textual-terminal {{ width: 100vw; height: 100vh; opacity: 0; }}
body.-first-byte .textual-terminal {{ opacity: 1; }}
.note {{ position: absolute; inset: 0; display: flex; align-items: center; justify-content: center; }}
body.-first-byte .starting, .ended {{ display: none; }}
body.-closed .ended {{ display: flex; z-index: 10; background: #0c181fe0; }}
a {{ color: #8cf; }}
</style>
</head>
<body>
<div class="note starting">eagle3-tui: starting the dashboard…</div>
<div class="note ended"><p>Session ended. <a href="/">Start a new one</a></p></div>
<div id="terminal" class="textual-terminal" data-session-websocket-url="{ws_url}" data-font-size="{font_size}"></div>
</body>
</html>
"""


# Before textual.js reads it (on load): a font size that gives a phone ~60 columns, unless
# the URL says `?fontsize=N`. A file, not inline: the CSP allows scripts from 'self' only.
FIT_JS = """document.addEventListener("DOMContentLoaded", () => {
  if (new URLSearchParams(location.search).has("fontsize")) return;
  const size = Math.max(9, Math.min(16, Math.floor(window.innerWidth / 36)));
  document.getElementById("terminal").dataset.fontSize = String(size);
});
"""


@dataclass
class Session:
    number: int
    peer: str
    agent: str
    started: float


class PathOnlyAccessLogger(AbstractAccessLogger):
    """aiohttp's access log prints the request line, query string (the token) and all:
    this one prints the path alone."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info("%s %s %s %s", request.remote, request.method, clean(request.path, 200), response.status)


class WebServer:
    """The aiohttp application serving `command` (one process per browser session)."""

    def __init__(self, command: list[str], token: str, *, port: int, tls: bool, sessions_file: Path) -> None:
        """`sessions_file`: where the open sessions are listed for their apps
        (tui/views/served.py reads it), in a directory only this user can read."""
        self.token = token.encode()
        self.sessions_file = sessions_file
        self.tls = tls
        self.cookie = f"eagle3-tui-token-{port}"  # cookies do not tell ports apart
        self.textual = Server(shlex.join(command), title="eagle3-tui")  # its handlers, not its server
        self.sessions: dict[int, Session] = {}
        self._tasks: set[asyncio.Task[Any]] = set()  # the sessions' handlers, ended on shutdown
        self._numbers = itertools.count(1)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        app.on_response_prepare.append(self._headers)
        app.on_shutdown.append(self._end_sessions)
        app.add_routes([
            web.get("/", self._index),
            web.get("/fit.js", self._fit),
            web.get("/ws", self._websocket),
            web.get("/download/{key}", self.textual.handle_download),
            web.static("/static", self.textual.statics_path),
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
            # Trade the token for a cookie and take it out of the address bar (and so
            # out of the history, and of what a screenshot of the page shows).
            query = request.rel_url.query.copy()
            query.popall("token")
            here = URL.build(path="/" + request.path.lstrip("/"), query=query)  # never `//host`
            response = web.Response(status=303, headers={"Location": str(here)})
            response.set_cookie(self.cookie, self.token.decode(), httponly=True, samesite="Strict",
                                secure=self.tls, path="/")
            return response
        cookie = request.cookies.get(self.cookie)
        if cookie is None:
            raise web.HTTPUnauthorized(
                text="eagle3-tui serve: open the URL the server printed (it ends in ?token=…)\n")
        if not self._good(cookie):
            log.warning("%s: wrong token cookie for %s", request.remote, clean(request.path))
            raise web.HTTPForbidden(text="eagle3-tui serve: wrong token\n")
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

    # ---- the page and its WebSocket -------------------------------------------------
    async def _index(self, request: web.Request) -> web.Response:
        try:
            font_size = max(6, min(40, int(request.query.get("fontsize", "16"))))
        except ValueError:
            font_size = 16
        ws_url = f"{'wss' if self.tls else 'ws'}://{request.host}/ws"
        return web.Response(text=PAGE.format(ws_url=html.escape(ws_url), font_size=font_size),
                            content_type="text/html")

    async def _fit(self, request: web.Request) -> web.Response:
        return web.Response(text=FIT_JS, content_type="text/javascript")

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        own = f"{'https' if self.tls else 'http'}://{request.host}"
        if origin != own:
            log.warning("%s: WebSocket refused, origin %s is not %s", request.remote,
                        clean(origin or "(none)"), clean(own))
            raise web.HTTPForbidden(text="eagle3-tui serve: WebSocket from another origin\n")
        n = next(self._numbers)
        self.sessions[n] = Session(n, request.remote or "?", clean(request.headers.get("User-Agent", "?")),
                                   time.monotonic())
        log.info("session %d opened from %s (%s); connected now: %s", n, self.sessions[n].peer,
                 self.sessions[n].agent, self.describe())
        self._write_sessions()
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            return await self.textual.handle_websocket(request)
        finally:
            self._tasks.discard(task)
            gone = self.sessions.pop(n)
            log.info("session %d from %s ended after %.0f s; connected now: %s", n, gone.peer,
                     time.monotonic() - gone.started, self.describe())
            self._write_sessions()

    async def _end_sessions(self, app: web.Application) -> None:
        """Ctrl+C: end each session now (its app is told to quit, its page says "Session
        ended") instead of aiohttp waiting for the open WebSockets to close on their own."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _write_sessions(self) -> None:
        rows = [{"number": s.number, "peer": s.peer, "agent": s.agent} for s in self.sessions.values()]
        tmp = self.sessions_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, self.sessions_file)  # a reader never sees half a list

    def describe(self) -> str:
        return ", ".join(f"#{s.number} {s.peer}" for s in self.sessions.values()) or "none"


def clean(text: str, limit: int = 80) -> str:
    return UNPRINTABLE.sub("?", text)[:limit]


def run(server: WebServer, sock: Any, ssl_context: Any) -> None:
    """Serve until SIGINT/SIGTERM; each open session's app is told to quit then."""
    web.run_app(server.app(), sock=sock, ssl_context=ssl_context, print=None,
                access_log=log, access_log_class=PathOnlyAccessLogger)
