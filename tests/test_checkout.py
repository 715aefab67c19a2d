"""The tests test this checkout: a subprocess started the way the CLI tests start one
(tests/checkout.py's environment, from a temp directory) imports this repo's `tui` and
`remote`, and uploads this repo's agent -- never another checkout installed in the venv."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import remote
import tui
from tests import checkout

HERE = Path(__file__).resolve().parent.parent  # not checkout.ROOT: this is what it must equal

PROBE = """
import json, remote, tui, tui.cli
from tui.transport.bundle import default_agent_dir
print(json.dumps({"tui": tui.__file__, "remote": remote.__file__, "agent": str(default_agent_dir())}))
"""


def _under_here(path: str) -> bool:
    return Path(path).resolve().is_relative_to(HERE)


def test_this_process_imports_this_checkout() -> None:
    assert _under_here(tui.__file__) and _under_here(remote.__file__), (tui.__file__, remote.__file__)


def test_a_cli_subprocess_imports_this_checkout(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=checkout.env(),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    wrong = {k: v for k, v in seen.items() if not _under_here(v)}
    assert not wrong, f"a subprocess imports another checkout than {HERE}: {wrong}"
