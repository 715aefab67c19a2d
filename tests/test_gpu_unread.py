"""A GPU source that is there but fails: the local kill's GPU-free proof and the
dashboard say nvidia-smi's error, never "GPUs free" or "no GPUs".

Real agent, real run, real kill. One stand-in: `nvidia-smi`, shaped like the other
tests' stand-ins (tests/test_agent.py FAKE_SMI, tests/slurm.py NODE_SMI), here failing
the way the real one does when it cannot reach the driver: its reason on stdout, exit 9.
An empty answer from a failed reading once read as "no card lists the run": a vacuous
proof that the run's GPU memory was free.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.agent_driver import AgentProc
from tests.replay import ReplayClient, snapshot
from tui.protocol.ops import KillReport
from tui.services.config import parse_config
from tui.state import view
from tui.transport import AgentClient
from tui.transport.local import LocalLink
from tui.views.app import make_app
from tui.views.widgets.gpus import GpuPanel

DRIVER_GONE = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.")
BROKEN_SMI = """#!{python}
import sys
arg = sys.argv[1]
if arg.startswith(("--query-gpu=", "--query-compute-apps=")):
    print({reason!r})
    sys.exit(9)
sys.exit("unexpected " + arg)
"""
ERROR = "nvidia-smi failed: " + DRIVER_GONE


@pytest.fixture()
def broken_smi_env(tmp_path: Path) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(BROKEN_SMI.format(python=sys.executable, reason=DRIVER_GONE))
    smi.chmod(0o755)
    return {"EAGLE3_TUI_GPU_SOURCE": "nvidia-smi", "PATH": "%s:%s" % (bindir, os.environ.get("PATH", ""))}


def test_a_kill_with_a_failing_nvidia_smi_says_the_proof_could_not_be_read(
        tmp_path: Path, broken_smi_env: dict[str, str]) -> None:
    with AgentProc(env=broken_smi_env, args=["--runs-dir", str(tmp_path / "runs")]) as a:
        assert a.hello["gpu_source"] == "nvidia-smi" and a.hello["gpu_error"] is None
        snap = a.call("snapshot")
        assert snap["gpus"] == [] and snap["gpu_error"] == ERROR, snap
        rec = a.call("launch", {"name": "unproven", "argv": [sys.executable, "-c", "import time; time.sleep(600)"],
                                "cwd": str(tmp_path), "env": {}, "patch_state": None, "log": None})
        deadline = time.monotonic() + 20
        while not any(r["run_id"] == rec["run_id"] and r.get("pid") for r in a.call("runs")["runs"]):
            assert time.monotonic() < deadline, "the run never started"
            time.sleep(0.1)
        report = a.call("kill", {"run_id": rec["run_id"], "graces": [1, 1], "gpu_wait": 0}, timeout=30)
    assert report["ok"] and report["remaining"] == [] and report["stages"][0]["signal"] == "SIGINT", report
    assert report["gpus_free"] is None, report  # not proven: the reading failed, it listed no card
    assert report["note"] == "the GPU-free proof could not be read: " + ERROR, report
    verdict = view.kill_verdict(KillReport.parse(report))
    assert "GPUs free" not in verdict and "\n" not in verdict, verdict
    assert verdict.endswith("(the GPU-free proof could not be read: %s)" % ERROR), verdict
    print(view.describe_kill(KillReport.parse(report))[0])


async def panel_after_a_snapshot(app: Any, pilot: Any, timeout: float) -> str:
    """The GPU panel's text once the dashboard has its first snapshot."""
    deadline = time.monotonic() + timeout
    while app.dashboard.state.snapshot_time is None:
        assert time.monotonic() < deadline, "no snapshot came"
        await pilot.pause(0.05)
    await pilot.pause()
    return str(app.query_one(GpuPanel).render())

async def test_the_dashboard_shows_the_gpu_source_s_error(
        tmp_path: Path, broken_smi_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in broken_smi_env.items():  # the local agent is started with this environment
        monkeypatch.setenv(key, value)
    cfg = parse_config(f'[host]\nruns_dir = "{tmp_path / "runs"}"\npython = "{sys.executable}"\ninterval = 0.3\n')
    app = make_app(AgentClient(LocalLink(runs_dir=cfg.host.runs_dir), reconnect=False), cfg, "local")
    async with app.run_test(size=(160, 50)) as pilot:
        text = await panel_after_a_snapshot(app, pilot, 20)
    assert text.startswith("GPU reading failed (nvidia-smi):\n"), text
    assert " ".join(text.split("\n\n")[0].split()[4:]) == ERROR, text  # its words, wrapped
    assert "no GPU source" not in text and "reported no GPUs" not in text, text


async def test_a_source_with_no_cards_says_so_once_a_snapshot_came() -> None:
    # Before the first snapshot the panel waits; after it, a working source that lists no
    # card says the host reported none (the panel once kept "waiting" for good: the
    # reading, [] before and after, had not changed).
    client = ReplayClient([])
    app = make_app(client, parse_config(""), "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause(0.3)
        assert "waiting for the first reading" in str(app.query_one(GpuPanel).render())
        client.push(snapshot(0, gpu_source="nvml", gpu_error=None))  # the source the hello named
        text = await panel_after_a_snapshot(app, pilot, 10)
    assert text.startswith("GPUs (nvml):\nthe host reported no GPUs"), text
