"""What the dashboard costs in a browser (`eagle3-tui serve`) beside the terminal one.

    python bench/bench_serve.py [--seconds 30] [--screenshots DIR]

A real run on `local` prints 20 lines/s; then, one after the other, for --seconds each:

1. terminal: `eagle3-tui connect local` in tmux at 160x50 (as bench/bench_client.py);
2. browser: `eagle3-tui serve local` and one Debian chromium page (headless, 1440x900)
   on the printed URL.

CPU is each process's own utime+stime from /proc in % of one core over the phase: the
terminal client; the server, the browser session's app process (the same `connect`
under Textual's web driver) and the two added; the local agent of each apart (the same
work in both); chromium's processes, all together, for the record. With --screenshots,
the browser phase also saves the dashboard at a desktop size (1440x900) and a phone size
(390x844, a second session) as serve-desktop.png and serve-phone.png in DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench_client import Tmux, cpu_s, descendant  # noqa: E402

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
JOB = """import time
i = 0
while True:
    print(f"INFO 12-01 21:00:00 [worker.py:{i % 400}] step {i}: extracted 256 tokens, \
loss {1 / (i + 1):.5f}", flush=True)
    i += 1
    time.sleep(0.05)
"""


def e3(*args: str, cwd: Path) -> str:
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=cwd, capture_output=True, text=True,
                          check=True, env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout


def percent(pids: dict[str, int | None], seconds: float, pump: object = None) -> dict[str, float | None]:
    """% of one core each pid used over `seconds` (None: not found)."""
    t0 = time.monotonic()
    before = {k: cpu_s(p) if p else None for k, p in pids.items()}
    while time.monotonic() - t0 < seconds:
        if pump is not None:
            pump.wait_for_timeout(250)  # type: ignore[attr-defined]  # the page keeps receiving frames
        else:
            time.sleep(0.25)
    wall = time.monotonic() - t0
    return {k: (None if before[k] is None else 100 * (cpu_s(p) - before[k]) / wall)  # type: ignore[operator,arg-type]
            for k, p in pids.items()}


def chromium_pids() -> list[int]:
    mine = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if b"chromium" in Path(f"/proc/{d}/cmdline").read_bytes():
                    mine.append(int(d))
            except OSError:
                pass
    return mine


def chromium_cpu(pids: list[int]) -> float:
    total = 0.0
    for p in pids:
        try:
            total += cpu_s(p)
        except OSError:
            pass
    return total


def fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:5.1f} %"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--screenshots", metavar="DIR")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    (work / "job.py").write_text(JOB)
    cfg = work / "eagle3.toml"
    cfg.write_text(f'[host]\nruns_dir = "{work / "runs"}"\npython = "{sys.executable}"\n'
                   f'[run]\nname = "bench"\ncommand = ["{sys.executable}", "{work / "job.py"}"]\n'
                   f'cwd = "{work}"\ngraces = [0.5, 0.5]\ngpu_wait = 0\n')
    run = json.loads(e3("launch", "local", "--json", cwd=work))
    rid = run["run_id"]
    print(f"run {rid} on local at 20 lines/s; {args.seconds:.0f} s per phase; "
          f"load before: {os.getloadavg()[0]:.2f}")
    try:
        # 1. the terminal dashboard
        dash = Tmux("serve", f"env PYTHONPATH={ROOT} {sys.executable} -m tui.cli --config {cfg} connect local")
        try:
            assert dash.wait([rid, "step"], 30) is not None, dash.screen()
            time.sleep(3)  # past the start-up
            term = percent({"client": dash.pid, "agent": descendant(dash.pid, b"agent/main.py")}, args.seconds)
        finally:
            dash.kill()
        print(f"terminal  client {fmt(term['client'])}   agent {fmt(term['agent'])}   "
              f"(load {os.getloadavg()[0]:.2f})")

        # 2. the same in a browser
        from playwright.sync_api import sync_playwright

        out = work / "serve.out"
        with open(out, "wb") as o, open(work / "serve.err", "wb") as e:
            server = subprocess.Popen([sys.executable, "-m", "tui.cli", "--config", str(cfg), "serve", "local",
                                       "--port", "0"], cwd=work, stdout=o, stderr=e,
                                      env=dict(os.environ, PYTHONPATH=str(ROOT)))
        try:
            while not out.read_text().strip():
                assert server.poll() is None, (work / "serve.err").read_text()
                time.sleep(0.05)
            url = out.read_text().split()[0]
            with sync_playwright() as p:
                before = set(chromium_pids())
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_FLAGS)
                page = browser.new_page(viewport={"width": 1440, "height": 900})
                text: list[str] = []
                page.on("websocket", lambda ws: ws.on("framereceived", lambda f: text.append(
                    f.decode("utf-8", "replace") if isinstance(f, bytes) else f)))
                page.goto(url)
                page.wait_for_selector("body.-first-byte", state="attached", timeout=30_000)
                page.click("#terminal")
                t0 = time.monotonic()
                while rid not in "".join(text)[-200_000:] and time.monotonic() - t0 < 30:
                    page.wait_for_timeout(200)
                page.wait_for_timeout(3000)
                session = descendant(server.pid, b"connect")
                agent = descendant(session, b"agent/main.py") if session else None
                chrome = [q for q in chromium_pids() if q not in before]
                c0 = chromium_cpu(chrome)
                n0, b0 = len(text), sum(map(len, text))
                t1 = time.monotonic()
                web = percent({"server": server.pid, "session": session, "agent": agent}, args.seconds, page)
                span = time.monotonic() - t1
                browser_cpu = 100 * (chromium_cpu(chrome) - c0) / span
                frames = ((len(text) - n0) / span, (sum(map(len, text)) - b0) / span / 1000)
                if args.screenshots:
                    shots = Path(args.screenshots)
                    shots.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(shots / "serve-desktop.png"))
                    # CSS pixels at a device scale of 1: at 2, headless chromium's canvas
                    # (software, no GPU) draws xterm.js at the wrong scale.
                    phone = browser.new_page(viewport={"width": 390, "height": 844})
                    phone.goto(url)
                    phone.wait_for_selector("body.-first-byte", state="attached", timeout=30_000)
                    phone.click("#terminal")  # focused: the footer draws
                    phone.wait_for_timeout(4000)
                    phone.screenshot(path=str(shots / "serve-phone.png"))
                browser.close()
        finally:
            server.terminate()
            server.wait(15)
        both = None if web["session"] is None else (web["server"] or 0) + web["session"]
        print(f"browser   server {fmt(web['server'])}   session app {fmt(web['session'])}   "
              f"server+session {fmt(both)}   agent {fmt(web['agent'])}   (load {os.getloadavg()[0]:.2f})")
        print(f"          to the browser: {frames[0]:.1f} WebSocket frames/s, {frames[1]:.1f} kB/s")
        print(f"          chromium (all its processes, headless, no GPU) {browser_cpu:5.1f} %")
        if both is not None and term["client"]:
            print(f"ratio     server+session / terminal client = {both / term['client']:.2f}")
        if args.screenshots:
            print(f"screenshots: {args.screenshots}/serve-desktop.png, {args.screenshots}/serve-phone.png")
    finally:
        e3("kill", "local", rid, "--yes", cwd=work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
