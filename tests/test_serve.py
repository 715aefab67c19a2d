"""`eagle3-tui serve` (issue 29): the dashboard in a real browser, behind a token.

Everything is real: the `eagle3-tui serve` command as a subprocess, a real run launched
on `local` through the CLI, Debian's chromium driven by Playwright (its own browser
download is never used), and aiohttp's client for the raw HTTP / WebSocket checks. The
browser draws the terminal on a canvas; what the tests read is the text of the frames
the page received over its WebSocket (escape sequences stripped), what the canvas drew.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import aiohttp
import pytest
from yarl import URL

from tests.patch_fixtures import client, site  # noqa: F401  (the real agent and a site-packages)
from tests.tunnel import Tunnel

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[^\[]")
# Before the page's own script: each WebSocket's close, as the page saw it, in its console
# (the close code tells "Session ended" from a drop the page takes for a blip).
CLOSES = """(() => { const Native = window.WebSocket;
  window.WebSocket = function (url, protocols) {
    const ws = new Native(url, protocols);
    ws.addEventListener("close", (e) => console.log(`closed ${e.code} ${e.reason} clean=${e.wasClean}`));
    return ws;
  };
  window.WebSocket.prototype = Native.prototype;
})();"""
JOB = "import time\ni = 0\nwhile True:\n    print('step', i, flush=True)\n    i += 1\n    time.sleep(0.05)\n"


def e3(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT), XDG_STATE_HOME=str(cwd / "state"),
                                               **(env or {})))


@pytest.fixture
def run(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A real run on `local` (a job printing 20 lines/s), killed at the end if still alive."""
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "eagle3.toml").write_text(
        f'[host]\nruns_dir = "{tmp_path / "runs"}"\npython = "{sys.executable}"\ninterval = 0.5\n'
        f'[run]\nname = "served"\ncommand = ["{sys.executable}", "{tmp_path / "job.py"}"]\n'
        f'cwd = "{tmp_path}"\ngraces = [0.5, 0.5]\ngpu_wait = 0\nenv = {{ HOLDS_GPU = "1" }}\n')
    res = e3("launch", "local", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    record = json.loads(res.stdout)
    try:
        yield record
    finally:
        e3("kill", "local", record["run_id"], "--yes", cwd=tmp_path)


def state_of(tmp_path: Path, run_id: str) -> str:
    runs = json.loads(e3("runs", "local", "--json", cwd=tmp_path).stdout)["runs"]
    return next(r["state"] for r in runs if r["run_id"] == run_id)


class Served:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc, self.url, self.log_path = proc, url, log
        self.base = url.split("?")[0]
        self.token = url.split("token=")[1]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def serve(tmp_path: Path, *args: str, url_shape: str = r"http://127\.0\.0\.1:\d+/\?token=[\w-]{40,}",
          path: str | None = None, port: int = 0, env: dict[str, str] | None = None) -> Iterator[Served]:
    """`eagle3-tui serve local --port PORT ARGS` in tmp_path; the URL it prints; SIGTERM at the
    end. ``path``: the server's PATH (its sessions' agents inherit it). Its state directory
    (for `serve --url`) is tmp_path/state."""
    out, err = tmp_path / "serve.out", tmp_path / "serve.err"
    env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_STATE_HOME=str(tmp_path / "state"),
               **({"PATH": path} if path else {}), **(env or {}))
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen([sys.executable, "-m", "tui.cli", "serve", "local", "--port", str(port), *args],
                                cwd=tmp_path, stdout=o, stderr=e, env=env)
    try:
        deadline = time.monotonic() + 20
        while not out.read_text().strip():
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, "no URL printed"
            time.sleep(0.05)
        url = out.read_text().splitlines()[0]
        assert re.fullmatch(url_shape, url), url
        yield Served(proc, url, err)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Screen:
    """One browser page on the served dashboard and the text its WebSocket delivered."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.text = ""
        self.raw = ""  # the same, escapes and all (colours)
        self.sockets: list[str] = []
        self.console: list[str] = []
        page.on("websocket", self._socket)
        page.on("console", lambda m: self.console.append(m.text[:200]))
        page.add_init_script(CLOSES)

    def _socket(self, ws: Any) -> None:
        self.sockets.append(ws.url.split("?")[0])
        ws.on("close", lambda _: self.sockets.append("closed"))
        ws.on("framereceived", self._frame)

    def _frame(self, frame: Any) -> None:
        data = frame.decode("utf-8", "replace") if isinstance(frame, bytes) else frame
        self.raw += data
        self.text += ESCAPES.sub("", data)

    def wait(self, what: str | Callable[[str], Any], timeout: float = 20) -> None:
        check = (lambda t: what in t) if isinstance(what, str) else what
        deadline = time.monotonic() + timeout
        while not check(self.text):
            assert time.monotonic() < deadline, f"not on the page: {what}; last text: {self.text[-600:]!r}"
            self.page.wait_for_timeout(100)  # Playwright delivers the frames while it waits

    def ended(self, served: Served, timeout: float) -> None:
        """The page shows "Session ended" within ``timeout`` s; if not, the failure says what the
        page, its sockets and the server saw instead."""
        try:
            self.page.wait_for_selector("body.-closed", state="attached", timeout=timeout * 1000)
        except Exception as exc:  # Playwright's TimeoutError
            shown = self.page.evaluate("document.body.className")
            raise AssertionError(f"no 'Session ended' in {timeout} s: body class {shown!r}, sockets {self.sockets}, "
                                 f"closes {[c for c in self.console if c.startswith('closed ')]}, "
                                 f"console {self.console[-10:]}, server rc {served.proc.poll()}, "
                                 f"its log:\n{served.log()}") from exc

    def open(self, url: str) -> None:
        response = self.page.goto(url)
        assert response is not None and response.status == 200, response
        assert "token=" not in self.page.url  # traded for the cookie, out of the address bar
        self.page.wait_for_selector("body.-first-byte", state="attached", timeout=20_000)
        self.page.click("#terminal")  # the keyboard's focus, and the app's (its footer draws then)


@contextmanager
def browser(width: int = 1440, height: int = 900) -> Iterator[Any]:
    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: apt-get install chromium (tests/run does)"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, timeout=30_000)
        try:
            context = b.new_context(viewport={"width": width, "height": height})
            yield context
        finally:
            b.close()


def descendants(root: int) -> list[int]:
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                parent[int(d)] = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, todo = [], [root]
    while todo:
        here = todo.pop()
        kids = [pid for pid, pp in parent.items() if pp == here]
        found += kids
        todo += kids
    return found


def pid_alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ---- the browser -----------------------------------------------------------------------

def test_browser_sees_the_run_and_kills_it(tmp_path: Path, run: dict[str, Any]) -> None:
    """The kill's GPU-free proof read from a GPU: a stand-in `nvidia-smi` on the server's
    PATH (tests/slurm.py's NODE_SMI: one 80 GiB card, every process started with
    HOLDS_GPU=1, as the run is, holding 1 GiB of it), since this machine has none."""
    from tests.slurm import NODE_SMI

    rid = run["run_id"]
    smi = tmp_path / "smi"
    smi.mkdir()
    (smi / "nvidia-smi").write_text(NODE_SMI.format(python=sys.executable))
    (smi / "nvidia-smi").chmod(0o755)
    with serve(tmp_path, path=f"{smi}:{os.environ['PATH']}") as served, browser() as context:
        screen = Screen(context.new_page())
        screen.open(served.url)
        screen.wait(lambda t: re.search(rf"{rid}\s+served\s+running", t))  # the runs table's row
        screen.wait("Kill run")  # the footer
        screen.text = ""
        screen.page.keyboard.press("k")
        screen.wait(f"Kill run {rid}?")  # the confirmation names the run
        screen.page.keyboard.press("y")
        screen.wait(f"run {rid} killed")  # the kill report in the banner
        screen.wait("processes left: none")
        screen.wait("GPUs free after")  # the card no longer lists the run's processes
        assert state_of(tmp_path, rid) == "killed"
        assert not pid_alive(run["pid"])
        log = served.log()
        assert re.search(r"session 1 opened from 127\.0\.0\.1 \(Mozilla", log), log
    assert served.token not in log + served.log()  # never in the log, not even the access log's


def test_q_ends_only_its_own_session(tmp_path: Path, run: dict[str, Any]) -> None:
    with serve(tmp_path, "--read-only") as served, browser(1000, 600) as context:
        first, second = Screen(context.new_page()), Screen(context.new_page())
        first.open(served.url)
        second.open(served.url)  # the second tab: the cookie, the same server
        for s in (first, second):
            s.wait(run["run_id"])
        first.wait("browser sessions now: #1 127.0.0.1, #2 127.0.0.1")  # who else is watching
        first.page.bring_to_front()
        first.page.click("#terminal")
        first.page.keyboard.press("q")
        first.ended(served, 15)  # "Session ended"
        second.text = ""
        second.wait("browser sessions now: #2 127.0.0.1")
        second.wait("step")  # the other session still follows the log
        assert served.proc.poll() is None
        log = served.log()
        assert re.search(r"session 1 from 127\.0\.0\.1 ended after \d+ s \(its app quit\);"
                         r" connected now: #2 127\.0\.0\.1", log), log
        # Ctrl+C on the server ends the open session at once, its app process with it.
        apps = descendants(served.proc.pid)
        assert apps
        t0 = time.monotonic()
        served.proc.send_signal(signal.SIGINT)
        served.proc.wait(15)
        assert time.monotonic() - t0 < 8
        second.ended(served, 5)
        assert not [pid for pid in apps if pid_alive(pid)]


def test_read_only_refuses_k_and_says_so(tmp_path: Path, run: dict[str, Any]) -> None:
    with serve(tmp_path, "--read-only") as served, browser() as context:
        screen = Screen(context.new_page())
        screen.open(served.url)
        screen.wait(run["run_id"])
        screen.wait("READ-ONLY")  # in the footer
        screen.text = ""
        screen.page.keyboard.press("k")
        screen.wait("read-only session: kill is off")
        screen.page.keyboard.press("y")  # a confirmation, were one open, would take this
        screen.page.wait_for_timeout(1500)
        assert "Kill run " + run["run_id"] not in screen.text
        assert state_of(tmp_path, run["run_id"]) == "running"
        assert "connect --read-only local" in served.log()


def test_no_token_no_page_and_no_websocket(tmp_path: Path) -> None:
    with serve(tmp_path) as served:
        with browser() as context:
            screen = Screen(context.new_page())
            response = screen.page.goto(served.base)
            assert response is not None and response.status == 401
            assert "textual-terminal" not in screen.page.content() and "token" in screen.page.content()
            response = screen.page.goto(served.base + "?token=" + "x" * 43)
            assert response is not None and response.status == 403
            screen.page.wait_for_timeout(500)
            assert screen.sockets == []

        asyncio.run(_raw_checks(served))
        log = served.log()
    assert served.token not in log and "x" * 43 not in log, log
    assert "\x1b" not in log and "\nforged" not in log and "GET /?[2J?forged 404" in log, log
    assert "WebSocket refused, origin http://evil.example" in log
    assert "WebSocket refused, no token or a wrong one" in log


KEY = "eagle3-tui.k."  # the WebSocket subprotocol that carries the token (tui/cli/webserve.py)


async def _raw_checks(served: Served) -> None:
    ws_url = served.base.replace("http://", "ws://") + "ws?width=80&height=24"
    origin = {"Origin": served.base.rstrip("/")}
    key = ("eagle3-tui", KEY + served.token)
    routes = ("", "page.js", "favicon.ico", "static/js/textual.js", "download/x")
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:  # an IP host
        for path in routes:
            async with http.get(served.base + path) as r:
                assert r.status == 401, (path, r.status)
        with pytest.raises(aiohttp.WSServerHandshakeError) as no_cookie:  # the token, but no cookie
            await http.ws_connect(ws_url, headers=origin, protocols=key)
        assert no_cookie.value.status == 401
        # The token: the page (which keeps it for its WebSocket) and a cookie that is not the token.
        async with http.get(served.url, allow_redirects=False) as r:
            assert r.status == 200 and "textual-terminal" in await r.text()
            cookie = r.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie, cookie
        assert served.token not in cookie  # every port of this host receives the cookie
        async with http.get(served.base + "/evil.example/?token=" + served.token, allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"] == "/evil.example/"  # a path, never //host
        async with http.get(served.base + "%1b%5b2J%0aforged", allow_redirects=False) as r:
            assert r.status == 404  # logged as text: no escape, no second line
        async with http.get(served.base) as r:  # the cookie jar now holds it
            page = await r.text()
            assert r.status == 200 and "textual-terminal" in page and served.token not in page
            assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
        # What another port of this host receives, the cookie, with a same-origin Origin: no session.
        for protocols in ((), ("eagle3-tui",), ("eagle3-tui", KEY + "x" * 43), ("eagle3-tui", KEY)):
            with pytest.raises(aiohttp.WSServerHandshakeError) as cookie_only:
                await http.ws_connect(ws_url, headers=origin, protocols=protocols)
            assert cookie_only.value.status == 403, protocols
        # With the cookie and the token, from another origin (another tab, another port): 403.
        with pytest.raises(aiohttp.WSServerHandshakeError) as cross:
            await http.ws_connect(ws_url, headers={"Origin": "http://evil.example"}, protocols=key)
        assert cross.value.status == 403
        async with http.ws_connect(ws_url, headers=origin, protocols=key) as ws:
            first = await ws.receive(timeout=20)  # the page's own way in: a session
            assert first.type == aiohttp.WSMsgType.TEXT and json.loads(first.data)[0] == "eagle3-session"
            drawn = await ws.receive(timeout=20)
            assert drawn.type == aiohttp.WSMsgType.BINARY
    # A cookie with a wrong value: 403 on every route, the WebSocket too (even with the token).
    wrong = aiohttp.CookieJar(unsafe=True)
    wrong.update_cookies({cookie.split("=", 1)[0]: "0" * 64}, URL(served.base))
    async with aiohttp.ClientSession(cookie_jar=wrong) as http:
        for path in routes:
            async with http.get(served.base + path) as r:
                assert r.status == 403, (path, r.status)
        with pytest.raises(aiohttp.WSServerHandshakeError) as bad_cookie:
            await http.ws_connect(ws_url, headers=origin, protocols=key)
        assert bad_cookie.value.status == 403


def test_off_this_machine_only_with_tls(tmp_path: Path) -> None:
    res = e3("serve", "local", "--bind", "0.0.0.0", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "ssh -L 8765:127.0.0.1:8765" in res.stderr, res.stderr
    assert res.stdout == ""


def test_tls_serves_https_with_a_secure_cookie(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
                    "-days", "1", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    with serve(tmp_path, "--bind", "0.0.0.0", "--tls-cert", str(cert), "--tls-key", str(key),
               url_shape=r"https://[^/:]+:\d+/\?token=[\w-]{40,}") as served:
        port = served.base.rsplit(":", 1)[1].rstrip("/")

        async def check() -> None:
            async with aiohttp.ClientSession() as http:
                local = f"https://127.0.0.1:{port}/"
                async with http.get(local, ssl=False) as r:
                    assert r.status == 401
                async with http.get(f"{local}?token={served.token}", ssl=False, allow_redirects=False) as r:
                    assert r.status == 200 and "Secure" in r.headers["Set-Cookie"]
                with pytest.raises(aiohttp.ClientError):  # no plain HTTP on that port
                    await http.get(f"http://127.0.0.1:{port}/?token={served.token}")

        asyncio.run(check())


# ---- read-only in the app itself (the browser test above covers k end to end) -------------

async def test_read_only_dashboard_refuses_every_write_key_and_says_so() -> None:
    from tests.replay import ReplayClient, snapshot
    from tests.test_app import CFG, RUN
    from tests.test_one_truth import notices, until
    from tui.views.app import make_app
    from tui.views.readonly import ModeFooter
    from tui.views.screens.confirm import ConfirmScreen

    app = make_app(ReplayClient([snapshot(1, runs=[RUN])]), CFG, "gpu-box", read_only=True)  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0, 5, "a snapshot")
        for key, what in (("k", "kill"), ("r", "relaunch"), ("l", "launch")):
            await pilot.press(key)
            await until(pilot, lambda: any(f"read-only session: {what} is off" in n for n in notices(app)), 5, what)
            assert not isinstance(app.screen, ConfirmScreen)
        app.screen.action_kill()  # the command palette's way in: the same refusal
        assert not isinstance(app.screen, ConfirmScreen)
        assert app.screen.query_one(ModeFooter).query(".read-only")
        ops = [op for op, _ in app.dashboard.client.requests]  # type: ignore[attr-defined]
        assert not {"kill", "launch", "relaunch"} & set(ops), ops


async def test_read_only_patch_screen_refuses_push_and_rollback(client: Any, site: Path,  # noqa: F811
                                                                 tmp_path: Path) -> None:
    from textual.widgets import DataTable

    from tests.test_patch_screen import Host, marks, until
    from tui.views.screens.confirm import ConfirmScreen
    from tui.views.screens.patches import PatchScreen

    app = Host(client, tmp_path)
    app.read_only = True  # type: ignore[attr-defined]
    async with app.run_test(size=(180, 50)) as pilot:
        screen = app.screen
        assert isinstance(screen, PatchScreen)
        await until(pilot, lambda: screen.status is not None and bool(marks(screen.query_one(DataTable))))
        await pilot.press("down", "enter")
        await until(pilot, lambda: any("read-only session: patch push is off" in n for n in app.notes))
        await pilot.press("b")
        await until(pilot, lambda: any("read-only session: patch rollback is off" in n for n in app.notes))
        assert app.screen is screen and not isinstance(app.screen, ConfirmScreen)


# ---- host text that is not UTF-8 (issue 35.5) ------------------------------------------------

def test_a_path_that_is_not_utf8_keeps_the_session(tmp_path: Path) -> None:
    """A process matching `[run] match`, run from a directory named with byte 0xFF: its
    path reaches the client as a lone surrogate, which Textual's web driver cannot encode
    (it ended every browser session within 3 s); the session must stay, showing U+FFFD."""
    odd = Path(os.fsdecode(bytes(tmp_path) + b"/odd\xffdir"))
    odd.mkdir()
    (odd / "job.py").write_text(JOB)
    (tmp_path / "eagle3.toml").write_text(
        f'[host]\nruns_dir = "{tmp_path / "runs"}"\npython = "{sys.executable}"\ninterval = 0.5\n'
        '[run]\nname = "odd"\nmatch = "marker-0xff"\n')
    with open(odd / "train.log", "wb") as out:  # its log's path too: the log pane's title
        job = subprocess.Popen([sys.executable, str(odd / "job.py"), "marker-0xff"], cwd=odd, stdout=out)
    try:
        with serve(tmp_path) as served:

            text = asyncio.run(_watch(served, "train.log", stay_s=6))
            assert "job.py" in text and "odd\ufffddir" in text
            assert "UnicodeEncodeError" not in served.log()
    finally:
        job.kill()
        job.wait()


async def _watch(served: Served, until: str, stay_s: float) -> str:
    """One session over a raw WebSocket (the page's own way in): its text until `until`
    shows, then `stay_s` more seconds in which the session must not end."""
    ws_url = served.base.replace("http://", "ws://") + "ws?width=200&height=50"
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(served.url) as r:
            assert r.status == 200
        async with http.ws_connect(ws_url, headers={"Origin": served.base.rstrip("/")},
                                   protocols=("eagle3-tui", KEY + served.token)) as ws:
            text, seen_at, deadline = "", None, time.monotonic() + 30
            while seen_at is None or time.monotonic() - seen_at < stay_s:
                assert time.monotonic() < deadline, f"never showed {until!r}: {text[-800:]!r}"
                try:
                    msg = await ws.receive(timeout=0.5)
                except asyncio.TimeoutError:
                    continue
                assert msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT), (msg, text[-800:])
                if msg.type == aiohttp.WSMsgType.BINARY:
                    text += ESCAPES.sub("", msg.data.decode("utf-8", "replace"))
                if seen_at is None and until in text:
                    seen_at = time.monotonic()
            return text


@pytest.mark.parametrize("args", [("--", "-oProxyCommand=touch /tmp/e3-pwned"), ("--", "local", "-oProxyCommand=x"),
                                  ("--hosts-file", "{hosts}")])
def test_a_target_that_is_an_option_is_refused_up_front(tmp_path: Path, args: tuple[str, ...]) -> None:
    """`serve` with a target an ssh-style tool would take for an option: one line, exit 2,
    before any URL (it used to serve, and fail in each browser session)."""
    hosts = tmp_path / "hosts"
    hosts.write_text("-oProxyCommand=x\n")
    res = e3("serve", "--port", "0", *(a.format(hosts=hosts) for a in args), cwd=tmp_path)
    assert res.returncode == 2, res
    assert res.stdout == "" and res.stderr.count("\n") == 1, res.stderr
    assert "bad host in target '-oProxyCommand=" in res.stderr


# ---- issue 40: a URL you can get back, sessions that survive a blip, sessions on demand ----

def test_a_cut_websocket_comes_back_to_the_same_session(tmp_path: Path, run: dict[str, Any]) -> None:
    """The tunnel drops every connection: the page says "reconnecting…", dials again, and is
    back on the same session (its app kept by the server) within 5 s, on the same view (the
    log viewer opened before the cut), without a new session."""
    with serve(tmp_path) as served, browser(1280, 800) as context:
        tunnel = Tunnel(int(served.base.rsplit(":", 1)[1].rstrip("/")))
        try:
            screen = Screen(context.new_page())
            screen.open(served.url.replace(served.base, f"http://127.0.0.1:{tunnel.port}/"))
            screen.wait(run["run_id"])
            screen.page.keyboard.press("L")  # the log viewer: the view to come back to
            screen.wait("Root cause")
            screen.page.wait_for_timeout(500)
            screen.text = ""
            t0 = time.monotonic()
            tunnel.cut()
            screen.page.wait_for_selector("body.-reconnecting", state="attached", timeout=5_000)
            screen.page.wait_for_selector("body:not(.-reconnecting)", state="attached", timeout=5_000)
            screen.wait("Root cause", timeout=5 - (time.monotonic() - t0))  # the whole view, drawn again
            back_s = time.monotonic() - t0
            assert back_s < 5, back_s
            assert "Kill run" not in screen.text  # not the dashboard: the same view
            assert not screen.page.query_selector("body.-closed")
            screen.text = ""
            screen.page.keyboard.press("Escape")  # the same app: its screen stack, its keys
            screen.wait("Kill run")
            log = served.log()
            # The server hears of the cut page before the new one, or (under load) only when
            # the new page takes the session over: "lost its page" is then never said.
            assert "session 1 back from 127.0.0.1" in log and "session 2 opened" not in log, log
            print(f"back on the same session {back_s:.2f} s after the cut")
        finally:
            tunnel.close()


def test_serve_url_opens_the_dashboard_and_a_fixed_token_survives_a_restart(tmp_path: Path,
                                                                           run: dict[str, Any]) -> None:
    token = "fixed-" + "t" * 40
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "token").chmod(0o600)
    with serve(tmp_path, "--token-file", str(tmp_path / "token")) as served:
        port = int(served.base.rsplit(":", 1)[1].rstrip("/"))
        got = e3("serve", "--url", cwd=tmp_path)
        assert got.returncode == 0, got.stderr
        url = got.stdout.strip()
        assert url == served.url and url.endswith("?token=" + token), (url, served.url)
        assert "serving local since" in got.stderr and f"(pid {served.proc.pid})" in got.stderr, got.stderr
        state = tmp_path / "state" / "eagle3-tui" / "serve"
        assert oct(state.stat().st_mode & 0o777) == "0o700"
        assert oct((state / f"{port}.json").stat().st_mode & 0o777) == "0o600"
        with browser() as context:
            screen = Screen(context.new_page())
            screen.open(url)  # the URL `serve --url` printed
            screen.wait(lambda t: re.search(rf"{run['run_id']}\s+served\s+running", t))
            assert screen.page.title() == "local · served · eagle3-tui"
            # The server restarts (same port, same token): the page's session ends; its
            # "Start a new one" (the page without the token: the cookie and the page's key) works.
            served.proc.send_signal(signal.SIGTERM)
            served.proc.wait(15)
            screen.ended(served, 20)
            gone = e3("serve", "--url", cwd=tmp_path)
            assert gone.returncode == 1 and "no eagle3-tui serve is running" in gone.stderr, gone
            assert not (state / f"{port}.json").exists()
            (tmp_path / "serve.out").write_text("")
            with serve(tmp_path, "--token-file", str(tmp_path / "token"), port=port) as again:
                assert again.url == served.url
                screen.text = ""
                screen.page.click("text=Start a new one")
                screen.page.wait_for_selector("body.-first-byte", state="attached", timeout=20_000)
                screen.wait(run["run_id"])
                assert "session 1 opened" in again.log()


def test_sessions_on_demand_and_read_only_keys_dimmed(tmp_path: Path, run: dict[str, Any]) -> None:
    with serve(tmp_path, "--read-only") as served, browser() as context:
        first, second = Screen(context.new_page()), Screen(context.new_page())
        first.open(served.url)
        first.wait(run["run_id"])
        first.wait("READ-ONLY")
        second.open(served.base)  # a second tab: the cookie and the key the first page kept
        second.wait(run["run_id"])
        second.page.click("#terminal")
        second.text = ""
        second.page.keyboard.press("S")
        second.wait("Browser sessions")
        second.wait(lambda t: re.search(r"#1  127\.0\.0\.1  since \d\d:\d\d:\d\d  read-only", t)
                    and re.search(r"#2  127\.0\.0\.1  since \d\d:\d\d:\d\d  read-only", t))
        assert re.search(r"session 2 opened from 127\.0\.0\.1 \(Mozilla.*\), read-only", served.log())
        # The footer: kill/relaunch/launch drawn dim (another colour than the keys that work).
        drawn = re.findall(r"\x1b\[([0-9;]*)m([^\x1b]*)", first.raw)  # (SGR, the text it draws)
        colour = {word: [sgr for sgr, text in drawn if word in text][-1]
                  for word in ("Kill run", "Relaunch", "Launch", "Log viewer")}
        assert colour["Kill run"] == colour["Relaunch"] == colour["Launch"], colour
        assert colour["Kill run"] != colour["Log viewer"], colour


async def test_read_only_footer_dims_the_refused_keys_only() -> None:
    from tests.replay import ReplayClient, snapshot
    from tests.test_app import CFG, RUN
    from tests.test_one_truth import until
    from tui.views.app import make_app
    from tui.views.readonly import ModeFooter

    for read_only in (True, False):
        app = make_app(ReplayClient([snapshot(1, runs=[RUN])]), CFG, "gpu-box", read_only=read_only)  # type: ignore[arg-type]
        async with app.run_test(size=(160, 50)) as pilot:
            await until(pilot, lambda: app.dashboard.state.seq == 0, 5, "a snapshot")

            def footer() -> dict[str, Any]:  # the keys drawn now (the footer recomposes when they change)
                return {k.action: k for k in app.screen.query_one(ModeFooter).query("FooterKey")}  # type: ignore[attr-defined]

            await until(pilot, lambda: {"kill", "open_log"} <= set(footer()), 5, "the footer's keys")
            keys = footer()
            dim = {a for a, k in keys.items() if k.has_class("-off")}
            assert dim == ({"kill", "relaunch", "launch"} if read_only else set()), dim
            if read_only:
                assert keys["kill"].styles.text_style.dim and not keys["open_log"].styles.text_style.dim


def test_serve_url_tells_when_none_runs_and_the_token_file_is_checked(tmp_path: Path) -> None:
    none = e3("serve", "--url", cwd=tmp_path)
    assert none.returncode == 1 and none.stdout == "" and none.stderr.count("\n") == 1, none
    open_file = tmp_path / "token"
    open_file.write_text("t" * 32)
    open_file.chmod(0o644)
    res = e3("serve", "local", "--token-file", str(open_file), cwd=tmp_path)
    assert res.returncode == 2 and "readable by others (mode 0644): chmod 600" in res.stderr, res
    for bad in ("short", "has space " + "x" * 20, "x" * 300):
        res = e3("serve", "local", cwd=tmp_path, env={"EAGLE3_TUI_SERVE_TOKEN": bad})
        assert res.returncode == 2 and "EAGLE3_TUI_SERVE_TOKEN: a token is 16 to 256" in res.stderr, res
        assert res.stdout == "" and res.stderr.count("\n") == 1


def test_port_in_use_says_what_to_do(tmp_path: Path) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        res = e3("serve", "local", "--port", str(port), cwd=tmp_path)
    assert res.returncode == 3 and res.stderr.count("\n") == 1, res
    assert "eagle3-tui serve --url" in res.stderr and "--port 0 picks a free port" in res.stderr


def test_the_tls_url_names_this_machine_not_localhost() -> None:
    from tui.cli.serve import url_host

    assert url_host("0.0.0.0", "gpu-box.example.org") == "gpu-box.example.org"
    assert url_host("127.0.0.1", None) == "127.0.0.1"
    assert not url_host("0.0.0.0", None).startswith("localhost")  # getfqdn() says localhost here


def test_a_closed_tab_ends_its_session_at_once(tmp_path: Path, run: dict[str, Any]) -> None:
    """A page that says goodbye (a closed tab, a reload) is not a blip: its app ends now,
    not after the grace period."""
    with serve(tmp_path) as served, browser() as context:
        screen = Screen(context.new_page())
        screen.open(served.url)
        screen.wait(run["run_id"])
        apps = descendants(served.proc.pid)
        screen.page.close()
        deadline = time.monotonic() + 10
        while "session 1 from 127.0.0.1 ended after" not in served.log():
            assert time.monotonic() < deadline, served.log()
            time.sleep(0.1)
        assert "(its page closed)" in served.log() and "lost its page" not in served.log()
        deadline = time.monotonic() + 10
        while [pid for pid in apps if pid_alive(pid)]:
            assert time.monotonic() < deadline, "the session's app outlived its closed page"
            time.sleep(0.1)


@pytest.mark.parametrize("width", [64, 80, 81])
async def test_80_columns_and_below_keep_the_essentials(width: int) -> None:
    """A phone's ~64 columns or an 80-column terminal: the run, its state, the progress,
    each GPU's memory and the log, stacked full width, every footer key in sight; the
    Processes panel gives its rows. From 81 columns the desktop layout as before."""
    from tests.replay import ReplayClient, snapshot
    from tests.test_app import CFG, RUN
    from tests.test_one_truth import until
    from tui.views.app import make_app
    from tui.views.readonly import ModeFooter

    app = make_app(ReplayClient([snapshot(4, runs=[RUN])]), CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(width, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0, 5, "a snapshot")

        def footer() -> dict[str, Any]:  # the keys drawn now (the footer recomposes when they change)
            return {k.action: k.region for k in app.screen.query_one(ModeFooter).query("FooterKey")}  # type: ignore[attr-defined]

        await until(pilot, lambda: "open_log" in footer(), 5, "the footer's keys")
        await pilot.pause(0.2)
        screen = app.screen
        phone = width <= 80
        assert screen.query_one("#procs").display is not phone
        gpus, runs = screen.query_one("#gpu-box").region, screen.query_one("#runs-box").region
        assert (gpus.width == width and gpus.y > runs.y) is phone, (gpus, runs)
        keys = footer()
        if phone:
            assert keys["open_log"].x + 2 <= width, keys  # L, the last key, in sight (its words may be cut)


def test_open_gives_the_browser_a_private_file_never_the_url(tmp_path: Path) -> None:
    """`--open`: a browser's command line is readable by every user of the host, so the
    browser gets a 0600 file that redirects to the URL; the file goes with the server."""
    seen = tmp_path / "browser-argv"
    fake = tmp_path / "fake-browser"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {seen}\n")
    fake.chmod(0o755)
    with serve(tmp_path, "--open", env={"BROWSER": str(fake), "DISPLAY": ""}) as served:
        deadline = time.monotonic() + 10
        while not seen.exists() or not seen.read_text():
            assert time.monotonic() < deadline, served.log()
            time.sleep(0.1)
        argv = seen.read_text()
        assert served.token not in argv and argv.startswith("file://"), argv
        page = Path(argv.strip()[len("file://"):])
        assert oct(page.stat().st_mode & 0o777) == "0o600"
        assert f'content="0;url={served.url}"' in page.read_text()
    assert not page.exists()


def test_a_loopback_name_serves_without_tls_and_a_refusal_names_the_port_asked(tmp_path: Path) -> None:
    """`--bind localhost` is this machine only (as 127.0.0.1 is): served without TLS. A
    public address without TLS is refused in one line whose `ssh -L` hint uses the port
    the user asked for, not the default."""
    with serve(tmp_path, "--bind", "localhost", url_shape=r"http://localhost:\d+/\?token=[\w-]{40,}") as served:
        async def fetch() -> int:
            async with aiohttp.ClientSession() as http:
                async with http.get(served.url) as r:
                    return r.status
        assert asyncio.run(fetch()) == 200
    res = e3("serve", "local", "--bind", "0.0.0.0", "--port", "9123", cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "ssh -L 9123:127.0.0.1:9123" in res.stderr, res.stderr


def test_the_pages_font_size_is_bounded_and_a_bad_one_is_the_default(tmp_path: Path) -> None:
    """`?fontsize=N` (a phone's page) is kept within 6..40; a value that is no number
    gives the page at the default size, never an error page."""
    async def sizes(served: Served) -> list[tuple[int, str]]:
        got = []
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            for asked in ("abc", "1000", "2", "12", ""):
                async with http.get(f"{served.url}&fontsize={asked}") as r:
                    page = await r.text()
                    got.append((r.status, re.search(r'data-font-size="([^"]*)"', page).group(1)))  # type: ignore[union-attr]
        return got

    with serve(tmp_path) as served:
        assert asyncio.run(sizes(served)) == [(200, "16"), (200, "40"), (200, "6"), (200, "12"), (200, "16")]
