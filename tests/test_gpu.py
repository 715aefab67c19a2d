"""The agent's NVML readings on a real GPU host (run on the device machine).

Skipped, with the reason, where NVML cannot initialise (no driver, no GPU, no pynvml).
Needs torch for the allocation test (skipped without it).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from tests import need
from tests.agent_driver import AgentProc

pytestmark = pytest.mark.gpu
GIB = 1024**3


def _nvml_reason() -> str | None:
    """None if NVML initialises here, else why not."""
    try:
        import pynvml  # type: ignore
    except ImportError:
        return "pynvml (nvidia-ml-py) not installed"
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return "NVML cannot initialise: %s" % exc
    return None if count else "NVML sees no GPU"


_REASON = _nvml_reason()
if _REASON:
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason=_REASON)]

ALLOC = """
import sys, time, torch
n = torch.cuda.device_count()
held = [torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda:%d" % i) for i in range(n)]
torch.cuda.synchronize()
print("ready", n, flush=True)
sys.stdin.read()  # hold the memory until the test closes our stdin
"""


@pytest.fixture
def agent() -> Iterator[AgentProc]:
    with AgentProc(env={"EAGLE3_TUI_GPU_SOURCE": "nvml"}) as a:
        yield a


def test_nvml_readings(agent: AgentProc) -> None:
    assert agent.hello["gpu_source"] == "nvml", agent.hello["gpu_error"]
    snap = agent.call("snapshot")
    assert snap["gpu_source"] == "nvml" and snap["gpu_error"] is None
    assert snap["gpus"], "NVML initialised but the agent lists no GPU"
    for i, g in enumerate(snap["gpus"]):
        assert g["index"] == i
        assert g["name"] and g["uuid"].startswith("GPU-")
        assert g["mem_total"] > GIB and 0 <= g["mem_used"] <= g["mem_total"]
        assert 0 < g["temp"] < 120
        assert g["util"] is None or 0 <= g["util"] <= 100
        assert g["power"] is None or 0 < g["power"] < 2000
        assert isinstance(g["processes"], list)


def test_gpu_process_listed(agent: AgentProc) -> None:
    need.module("torch", "pip install torch (a CUDA build, on the GPU machine)")
    marker = "gpu-alloc-" + uuid.uuid4().hex[:8]
    child = subprocess.Popen([sys.executable, "-c", ALLOC, marker], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # blocks until allocated (or the child died)
        assert line.startswith("ready"), "allocator failed: %r" % line
        mark = agent.mark()
        agent.call("configure", {"interval": 0.5})

        def holds(m: dict) -> bool:
            if m["type"] != "snapshot":
                return False
            per_gpu = [[p for p in g["processes"] if p["pid"] == child.pid] for g in m["gpus"]]
            return all(ps and ps[0]["mem"] is not None and ps[0]["mem"] >= 1.5 * GIB
                       for ps in per_gpu)

        snap = agent.wait_for(holds, since=mark, timeout=30,
                              what="snapshot with the allocator on every GPU")
        (proc,) = [p for p in snap["processes"] if p["pid"] == child.pid]
        assert "gpu" in proc["why"] and marker in proc["cmdline"]
    finally:
        if child.stdin:
            child.stdin.close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _smi_used_mib() -> list[int]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return [int(line.strip()) for line in out.splitlines() if line.strip()]


def _agent_used_mib(agent: AgentProc) -> list[float]:
    return [g["mem_used"] / 2**20 for g in agent.call("snapshot")["gpus"]]


def test_memory_used_as_nvidia_smi(agent: AgentProc) -> None:
    """GPU memory used is what nvidia-smi shows (NVML v2: the driver's reserve left out),
    on idle cards and with 2 GiB allocated on each, within 1 MiB (smi rounds to MiB)."""
    if subprocess.run(["which", "nvidia-smi"], capture_output=True).returncode:
        pytest.skip("nvidia-smi not found")
    ours, smi = _agent_used_mib(agent), _smi_used_mib()
    assert len(ours) == len(smi) and all(abs(a - s) <= 1 for a, s in zip(ours, smi)), (ours, smi)
    need.module("torch", "pip install torch (a CUDA build, on the GPU machine)")
    child = subprocess.Popen([sys.executable, "-c", ALLOC, "mem-check"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().startswith("ready")
        ours, smi = _agent_used_mib(agent), _smi_used_mib()
        assert all(s >= 2048 for s in smi), smi
        assert all(abs(a - s) <= 1 for a, s in zip(ours, smi)), (ours, smi)
    finally:
        if child.stdin:
            child.stdin.close()
        child.wait(timeout=30)
