"""The page `eagle3-tui serve` serves: its HTML, its script and its icon.

textual-serve's textual.js draws the terminal (xterm.js) and talks to the WebSocket; the
script here runs before it and wraps the WebSocket it opens: the token as a subprotocol,
and a reconnect to the same session when the connection drops (tui/cli/webserve.py
keeps the session's app for the page to come back).
"""

from __future__ import annotations

PROTOCOL = "eagle3-tui"  # the WebSocket subprotocol the server answers with
KEY_PREFIX = "eagle3-tui.k."  # the subprotocol that carries the token
ENDED = 4001  # the WebSocket close code for "this session is over" (the page stops there)

PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="icon" href="/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="/static/css/xterm.css">
<link rel="preload" href="/static/fonts/RobotoMono-VariableFont_wght.ttf" as="font" type="font/ttf" crossorigin>
<script src="/page.js"></script>
<script src="/static/js/textual.js"></script>
<style>
@font-face {{ font-family: "Roboto Mono"; src: url("/static/fonts/RobotoMono-VariableFont_wght.ttf"); }}
html, body {{ margin: 0; height: 100%; background: #0c181f; color: #ddd; font-family: "Roboto Mono", monospace; }}
.textual-terminal {{ width: 100vw; height: 100vh; opacity: 0; }}
body.-first-byte .textual-terminal {{ opacity: 1; }}
.note {{ position: absolute; inset: 0; display: flex; align-items: center; justify-content: center; }}
body.-first-byte .starting, .ended, .nokey, .reconnecting {{ display: none; }}
body.-closed .ended, body.-nokey .nokey {{ display: flex; z-index: 10; background: #0c181fe0; }}
body.-reconnecting .reconnecting {{ display: flex; z-index: 10; background: #0c181fa0; }}
body.-nokey .starting, body.-nokey .ended {{ display: none; }}
a {{ color: #8cf; }}
</style>
</head>
<body>
<div class="note starting">eagle3-tui: starting the dashboard…</div>
<div class="note reconnecting"><p>reconnecting…</p></div>
<div class="note ended"><p>Session ended. <a href="/">Start a new one</a></p></div>
<div class="note nokey"><p>Open the URL the server printed (it ends in ?token=…); \
<code>eagle3-tui serve --url</code> prints it again.</p></div>
<div id="terminal" class="textual-terminal" data-session-websocket-url="{ws_url}" data-font-size="{font_size}"
 data-key="{key}"></div>
</body>
</html>
"""

# Before textual.js runs (on load). A file, not inline: the CSP allows scripts from 'self' only.
# - The token: taken from the page (loaded with ?token=) into localStorage, which only this
#   origin (scheme, host and port) can read, and out of the address bar.
# - The WebSocket textual.js opens carries it as a subprotocol and, when it drops without the
#   session having ended (a laptop's sleep, a tunnel's blip), opens again on the same session
#   (the server keeps its app for a grace period); the page says "reconnecting…" meanwhile.
# - A font size that gives a phone ~60 columns, unless the URL says `?fontsize=N`.
PAGE_JS = """(() => {
  const STORE = "eagle3-tui-key", GRACE_MS = %(grace_ms)d, Native = window.WebSocket;
  let key = null;
  const body = () => document.body;
  class Session extends EventTarget {
    constructor(url) {
      super();
      this.url = url; this.id = null; this.size = null; this.ended = false; this.lostAt = 0; this.tries = 0;
      this.binaryType = "arraybuffer";
      this.dial(url);
    }
    dial(url) {
      const ws = new Native(url, ["%(protocol)s", "%(prefix)s" + key]);
      ws.binaryType = "arraybuffer";
      this.ws = ws;
      ws.onopen = () => {
        if (this.id === null) { this.dispatchEvent(new Event("open")); return; }
        body().classList.remove("-reconnecting");
        this.tries = 0;
      };
      ws.onmessage = (e) => {
        if (typeof e.data === "string" && e.data.startsWith('["eagle3-session"')) {
          this.id = JSON.parse(e.data)[1];
          return;
        }
        this.dispatchEvent(new MessageEvent("message", { data: e.data }));
      };
      ws.onclose = (e) => {
        if (this.ws !== ws) return;
        const now = Date.now();
        if (this.id === null || e.code === %(ended)d || e.code >= 4000) return this.end();
        if (!this.lostAt) this.lostAt = now;
        if (now - this.lostAt > GRACE_MS) return this.end();
        body().classList.add("-reconnecting");
        const wait = Math.min(2000, 250 * 2 ** this.tries++);
        const query = new URL(this.url).searchParams;
        if (this.size) {  // the page's size now, not when it first connected
          const size = JSON.parse(this.size)[1];
          query.set("width", size.width); query.set("height", size.height);
        }
        query.set("session", this.id);
        setTimeout(() => this.dial(this.url.split("?")[0] + "?" + query), wait);
      };
    }
    end() {
      this.ended = true;
      body().classList.remove("-reconnecting");
      this.dispatchEvent(new Event("close"));
    }
    send(data) {
      if (typeof data === "string" && data.startsWith('["resize"')) this.size = data;
      if (this.ws.readyState === 1) { this.lostAt = 0; this.ws.send(data); }
    }
    close() { this.ended = true; this.ws.close(); }
  }
  window.WebSocket = Session;
  document.addEventListener("DOMContentLoaded", () => {
    const terminal = document.getElementById("terminal");
    if (terminal.dataset.key) {
      localStorage.setItem(STORE, terminal.dataset.key);
      delete terminal.dataset.key;
      const query = new URLSearchParams(location.search);
      query.delete("token");
      history.replaceState(null, "", location.pathname + (query.size ? "?" + query : ""));
    }
    key = localStorage.getItem(STORE);
    if (!key) { body().classList.add("-nokey"); window.WebSocket = null; }
    if (new URLSearchParams(location.search).has("fontsize")) return;
    const size = Math.max(9, Math.min(16, Math.floor(window.innerWidth / 36)));
    terminal.dataset.fontSize = String(size);
  });
})();
"""

FAVICON = """<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">
<rect width="16" height="16" rx="3" fill="#0c181f"/>
<path d="M3 4h10M3 8h7M3 12h10" stroke="#4ec9b0" stroke-width="2"/>
</svg>
"""
