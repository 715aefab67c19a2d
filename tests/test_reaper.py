"""The leftover-run reaper (tests/conftest.py): a test that leaves a run alive FAILS,
named, and the run is killed anyway -- checked on a real pytest session in a subprocess."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from tests import checkout

LEAKY = """
import sys
from remote.run import runner
from tests.conftest import _no_run_left_alive  # noqa: F401 - the autouse reaper under test

def test_leaves_its_run(tmp_path):
    rec = runner.launch(str(tmp_path / "runs"), "leak", [sys.executable, "-c", "import time; time.sleep(300)"],
                        str(tmp_path), {})
    (tmp_path.parent.parent / "pid").write_text(str(rec["pid"]))  # --basetemp is beside it
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_test_that_leaves_a_run_alive_fails_by_name_and_the_run_dies(tmp_path: Path) -> None:
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    base = tmp_path / "base"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--basetemp", str(base), str(tmp_path / "test_leaky.py")],
                          cwd=tmp_path, env=checkout.env(), capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert re.search(r"ERROR .*test_leaky\.py::test_leaves_its_run", out), out
    assert "test_leaky.py::test_leaves_its_run left 1 run(s) alive" in out, out
    pid = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), f"the leaked run {pid} is still alive"
