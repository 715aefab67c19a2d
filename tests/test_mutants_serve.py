"""`eagle3-tui serve` survivors of issue 41's mutation sample: what the server does when
a part around it fails (the browser `--open` asks for is not there)."""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.test_serve import serve


def test_open_without_any_browser_says_so_and_keeps_serving(tmp_path: Path) -> None:
    """A headless host (no $DISPLAY, no console browser on PATH, no $BROWSER): `--open`
    cannot find a browser at all. One line says so and to open the printed URL; the
    server goes on serving it."""
    empty = tmp_path / "no-browsers"
    empty.mkdir()
    env = {"BROWSER": "", "DISPLAY": "", "WAYLAND_DISPLAY": "", "TERM": "xterm"}
    with serve(tmp_path, "--open", path=str(empty), env=env) as served:
        deadline = time.monotonic() + 20
        while "--open:" not in served.log():
            assert served.proc.poll() is None, served.log()
            assert time.monotonic() < deadline, served.log()
            time.sleep(0.1)
        said = [ln for ln in served.log().splitlines() if "--open:" in ln]
        assert len(said) == 1 and said[0].endswith("open the URL above"), said
        time.sleep(0.5)
        assert served.proc.poll() is None, served.log()
        try:
            with urllib.request.urlopen(served.base, timeout=10) as page:
                status = page.status
        except urllib.error.HTTPError as e:  # no token: refused, but answered
            status = e.code
        assert 200 <= status < 500, status


def test_a_redirect_file_the_browser_removed_does_not_spoil_the_exit(tmp_path: Path) -> None:
    """`--open` hands the browser a private redirect file; a browser wrapper (or a tmp
    cleaner) may remove it before the server stops. Stopping the server is still a clean
    exit: no traceback, the status of a server stopped by SIGTERM."""
    seen = tmp_path / "browser-argv"
    fake = tmp_path / "fake-browser"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$1" > {seen}\nrm -f "${{1#file://}}"\n')
    fake.chmod(0o755)
    with serve(tmp_path, "--open", env={"BROWSER": str(fake), "DISPLAY": ""}) as served:
        deadline = time.monotonic() + 10
        while not seen.exists() or not seen.read_text():
            assert time.monotonic() < deadline, served.log()
            time.sleep(0.1)
        page = Path(seen.read_text().strip()[len("file://"):])
        while page.exists():
            assert time.monotonic() < deadline, served.log()
            time.sleep(0.05)
    assert "Traceback" not in served.log(), served.log()
    assert served.proc.returncode in (0, -signal.SIGTERM), (served.proc.returncode, served.log())


def test_the_tab_title_names_three_hosts_and_counts_the_rest(tmp_path: Path) -> None:
    """A fleet served to one tab: its title names the first three hosts and how many
    more there are, so two tabs of different fleets tell apart."""
    from tui.cli.common import Ctx
    from tui.cli.serve import page_title

    config = tmp_path / "eagle3.toml"
    config.write_text('[run]\nname = "llama-draft"\ncommand = ["python", "train.py"]\n')
    obj = Ctx(str(config), None, False)
    hosts = [f"gpu{i}" for i in range(1, 8)]
    assert page_title(obj, hosts[:1]) == "gpu1 · llama-draft · eagle3-tui"
    assert page_title(obj, hosts[:3]) == "gpu1, gpu2, gpu3 · llama-draft · eagle3-tui"
    assert page_title(obj, hosts[:4]) == "gpu1, gpu2, gpu3 +1 · llama-draft · eagle3-tui"
    assert page_title(obj, hosts) == "gpu1, gpu2, gpu3 +4 · llama-draft · eagle3-tui"
