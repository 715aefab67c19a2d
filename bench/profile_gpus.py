"""CPU time of each NVML reading the agent takes per GPU (run on a GPU host).

    python bench/profile_gpus.py [--n 500]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "remote"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=500)
    n = ap.parse_args().n
    import pynvml as nv

    nv.nvmlInit()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    calls = {
        "memory": lambda h: nv.nvmlDeviceGetMemoryInfo(h),
        "utilization": lambda h: nv.nvmlDeviceGetUtilizationRates(h),
        "power": lambda h: nv.nvmlDeviceGetPowerUsage(h),
        "power limit": lambda h: nv.nvmlDeviceGetEnforcedPowerLimit(h),
        "temperature": lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "compute processes": lambda h: nv.nvmlDeviceGetComputeRunningProcesses(h),
        "graphics processes": lambda h: nv.nvmlDeviceGetGraphicsRunningProcesses(h),
    }
    print(f"{len(handles)} GPUs, {n} rounds; CPU µs per call per GPU")
    for name, fn in calls.items():
        t = time.process_time()
        for _ in range(n):
            for h in handles:
                fn(h)
        print(f"  {name:<20} {1e6 * (time.process_time() - t) / n / len(handles):8.1f}")
    import gpus

    src = gpus.Gpus()
    t = time.process_time()
    for _ in range(n):
        src.read()
    print(f"  {'agent Gpus.read':<20} {1e6 * (time.process_time() - t) / n:8.1f} (all GPUs)")


if __name__ == "__main__":
    main()
