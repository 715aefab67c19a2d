"""Which NVML memory call the agent uses, checked here against a stand-in `pynvml`
module (this machine has no GPU; tests/test_gpu.py checks the real NVML on the device
beside nvidia-smi). The stand-in mimics nvidia-ml-py's signatures: the v2 call takes
`version`, an old pynvml has no such argument, an old driver lacks the v2 symbol."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from remote.base.gpus import Gpus

MIB = 2**20


class _Mem:
    def __init__(self, used: int) -> None:
        self.used, self.total = used, 140_000 * MIB


def standin(v2: str) -> types.ModuleType:
    """v2: "ok" (new pynvml and driver), "old-pynvml" (no version arg), "old-driver"."""
    nv = types.ModuleType("pynvml")
    nv.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    if v2 != "old-pynvml":
        nv.nvmlMemory_v2 = 0x02000028  # type: ignore[attr-defined]

    def get_mem(h: Any, version: Any = None) -> _Mem:
        if version is None:
            return _Mem(615 * MIB)  # the first call counts the driver's reserve
        if v2 == "old-driver":
            raise RuntimeError("Function Not Found")
        return _Mem(0)

    def get_mem_old(h: Any) -> _Mem:
        return _Mem(615 * MIB)

    funcs = {
        "nvmlInit": lambda: None, "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda i: i, "nvmlDeviceGetName": lambda h: "NVIDIA H200",
        "nvmlDeviceGetUUID": lambda h: "GPU-0", "nvmlDeviceGetUtilizationRates": lambda h: None,
        "nvmlDeviceGetPowerUsage": lambda h: 100_000, "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700_000,
        "nvmlDeviceGetTemperature": lambda h, s: 30, "nvmlDeviceGetComputeRunningProcesses": lambda h: [],
        "nvmlDeviceGetGraphicsRunningProcesses": lambda h: [],
        "nvmlDeviceGetMemoryInfo": get_mem_old if v2 == "old-pynvml" else get_mem,
    }
    for name, fn in funcs.items():
        setattr(nv, name, fn)
    return nv


@pytest.mark.parametrize(("kind", "used_mib"), [("ok", 0), ("old-pynvml", 615), ("old-driver", 615)])
def test_v2_memory_else_first_call(monkeypatch: pytest.MonkeyPatch, kind: str, used_mib: int) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", standin(kind))
    monkeypatch.setenv("EAGLE3_TUI_GPU_SOURCE", "nvml")
    gpus = Gpus()
    for _ in range(2):  # the choice is made once and kept
        (gpu,), err = gpus.read()
        assert err is None and gpu["mem_used"] == used_mib * MIB and gpu["mem_total"] == 140_000 * MIB
