"""The screenshots of `eagle3-tui serve` in docs/: a desktop page and a phone page.

    python bench/serve_screenshots.py [DIR]      (default: docs/)

A real run on `local` (20 log lines/s, as bench/bench_serve.py), `eagle3-tui serve local`,
Debian's headless chromium: serve-desktop.png at 1280x800, serve-phone.png at 390x844
(CSS pixels at a device scale of 1: at 2, headless chromium's canvas, software, draws
xterm.js at the wrong scale).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench_serve import CHROMIUM_FLAGS, JOB, e3  # noqa: E402


def main() -> int:
    shots = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "docs")
    work = Path(tempfile.mkdtemp(prefix="serve-shots-"))
    (work / "job.py").write_text(JOB)
    cfg = work / "eagle3.toml"
    cfg.write_text(f'[host]\nruns_dir = "{work / "runs"}"\npython = "{sys.executable}"\n'
                   f'[run]\nname = "eagle3-llama"\ncommand = ["{sys.executable}", "{work / "job.py"}"]\n'
                   f'cwd = "{work}"\ngraces = [0.5, 0.5]\ngpu_wait = 0\n')
    rid = json.loads(e3("launch", "local", "--json", cwd=work))["run_id"]
    out = work / "serve.out"
    env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_STATE_HOME=str(work / "state"))
    with open(out, "wb") as o, open(work / "serve.err", "wb") as e:
        server = subprocess.Popen([sys.executable, "-m", "tui.cli", "--config", str(cfg), "serve", "local",
                                   "--port", "0"], cwd=work, stdout=o, stderr=e, env=env)
    try:
        while not out.read_text().strip():
            assert server.poll() is None, (work / "serve.err").read_text()
            time.sleep(0.05)
        url = out.read_text().split()[0]
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_FLAGS)
            for name, width, height in (("serve-desktop.png", 1280, 800), ("serve-phone.png", 390, 844)):
                page = browser.new_page(viewport={"width": width, "height": height})
                page.goto(url)
                page.wait_for_selector("body.-first-byte", state="attached", timeout=30_000)
                page.click("#terminal")  # focused: the footer draws
                page.wait_for_timeout(9000)  # past the start-up toasts
                shots.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(shots / name))
                page.close()
                print(f"{shots / name}: {width}x{height}")
            browser.close()
    finally:
        server.terminate()
        server.wait(15)
        e3("kill", "local", rid, "--yes", cwd=work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
