"""The real `eagle3-tui connect` in a real terminal (tmux at 160x50), as a user sees it:
every panel drawn, the shard bar from the log, a line appended to the log shows up,
and `q` exits 0."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests import checkout

ROOT = Path(__file__).resolve().parent.parent



@pytest.fixture(autouse=True)
def _tmux() -> None:
    if shutil.which("tmux") is None:  # never a silent skip: ./tests/run installs it
        pytest.fail("tmux not found: apt-get install tmux", pytrace=False)


def screen(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout


def wait_screen(session: str, needles: list[str], timeout: float) -> float:
    """Seconds until every needle is on the screen."""
    t0 = time.monotonic()
    while True:
        text = screen(session)
        if all(n in text for n in needles):
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not on screen after {timeout} s: {needles}\n{text}")
        time.sleep(0.05)


def test_connect_local_in_tmux(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_bytes(
        b"INFO 11-30 02:00:00 [loader.py:1] Starting to load model /m...\n"
        b"(Worker_TP0 pid=1) \rLoading safetensors checkpoint shards:  37% Completed | 24/64 [07:12<12:01, 18.0s/it]\n"
    )
    cfg = tmp_path / "eagle3.toml"
    cfg.write_text(f'[host]\nruns_dir = "{tmp_path / "runs"}"\n[run]\nlog = "{log}"\nmatch = "no-such-thing"\n')
    session = f"e3-{uuid.uuid4().hex[:8]}"
    exit_file = tmp_path / "exit"
    cmd = (
        # The pane inherits the test process's environment; COLUMNS/LINES there (set by
        # the test session, 80x24) would override the pane's real size in Textual.
        f"env -u COLUMNS -u LINES PYTHONPATH={shlex.quote(checkout.pythonpath())}"
        f" {shlex.quote(sys.executable)} -m tui.cli connect local "
        f"--config {shlex.quote(str(cfg))}; echo $? > {shlex.quote(str(exit_file))}"
    )
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "50", cmd], check=True)
    try:
        drawn = wait_screen(session, ["Runs", "GPUs", "Processes", "Log", "Progress", "connected", "24/64"], 20)
        print(f"every panel and the shard bar drawn after {drawn:.2f} s")
        marker = f"appended-{uuid.uuid4().hex[:8]}"
        with open(log, "ab") as f:
            f.write(f"INFO 11-30 02:00:05 [x.py:1] {marker}\n".encode())
        seen = wait_screen(session, [marker], 5)
        print(f"appended line on screen after {seen:.2f} s")
        assert seen < 2.0  # the goal is 1 s; 2 s leaves room for a loaded CI machine
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        deadline = time.monotonic() + 10
        while not exit_file.exists() or not exit_file.read_text().strip():
            assert time.monotonic() < deadline, screen(session)
            time.sleep(0.05)
        assert exit_file.read_text().strip() == "0"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
