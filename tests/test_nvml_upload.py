"""nvidia-ml-py's own pynvml travels with the agent, so a host Python without it still
reads GPUs through NVML (not two nvidia-smi processes a snapshot)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

from tui.transport.bundle import UPLOADED_PYNVML, agent_files, agent_sha

REMOTE = Path(__file__).resolve().parent.parent / "remote"


def test_the_agent_upload_carries_the_clients_pynvml() -> None:
    files = agent_files(REMOTE)
    installed = Path(str(importlib.metadata.distribution("nvidia-ml-py").locate_file("pynvml.py")))
    assert files[UPLOADED_PYNVML] == installed.read_bytes()
    # part of the content hash: another nvidia-ml-py is another agent directory on the host
    without = {k: v for k, v in files.items() if k != UPLOADED_PYNVML}
    assert agent_sha(without) != agent_sha(files)


def test_an_agent_on_a_python_without_pynvml_uses_the_uploaded_one(tmp_path: Path) -> None:
    for name, data in agent_files(REMOTE).items():  # the directory as the client uploads it
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    probe = ("import json, sys; sys.path.insert(0, sys.argv[1]); from remote.base import gpus; g = gpus.Gpus(); "
             "print(json.dumps([g.source, g.error, g.source_detail]))")
    # -S -E: no site-packages and no PYTHONPATH, as a login's python3 without nvidia-ml-py
    no_site = subprocess.run([sys.executable, "-E", "-S", "-c", "import pynvml"], capture_output=True)
    assert no_site.returncode != 0, "this Python finds a pynvml even without site-packages"
    out = subprocess.run([sys.executable, "-E", "-S", "-c", probe, str(tmp_path)], capture_output=True,
                         text=True, env={"EAGLE3_TUI_GPU_SOURCE": "nvml"}, check=True)
    source, error, detail = json.loads(out.stdout)
    if source == "nvml":  # a host with the driver
        assert "uploaded" in detail
    else:  # no driver here: NVML itself says so, the bindings were there
        assert error.startswith("pynvml: ") and "not installed" not in error, error
