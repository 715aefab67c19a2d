"""GPU memory used: the agent's reading beside `nvidia-smi --query-gpu=memory.used` and
NVML's first memory call, on idle GPUs and with torch holding memory on each. Exits 1
when the agent and nvidia-smi differ by more than 1 MiB on any card.

    python bench/gpu_memory_check.py [--gib 10]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("EAGLE3_TUI_GPU_SOURCE", "nvml")
from remote.base.gpus import Gpus  # noqa: E402

MIB = 2**20


def smi() -> list[int]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return [int(x) for x in out.split()]


def table(label: str, gpus: Gpus) -> bool:
    nv = gpus._nv
    ours = [g["mem_used"] for g in gpus.read()[0]]
    v1 = [nv.nvmlDeviceGetMemoryInfo(h).used for h in gpus._handles]
    ref = smi()
    ok = True
    print(f"\n{label}  (memory API in use: {'v2' if gpus._mem_v2 else 'v1'})")
    print(f"{'GPU':>3} {'agent MiB':>12} {'nvidia-smi MiB':>15} {'diff MiB':>9} {'NVML v1 used MiB':>17}")
    for i, (a, s, f) in enumerate(zip(ours, ref, v1)):
        diff = a / MIB - s
        ok &= abs(diff) <= 1
        print(f"{i:>3} {a / MIB:>12.2f} {s:>15} {diff:>9.2f} {f / MIB:>17.2f}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=10.0)
    args = ap.parse_args()
    gpus = Gpus()
    if gpus.source != "nvml":
        print("no NVML:", gpus.error)
        return 1
    ok = table("idle", gpus)
    import torch

    held = [torch.empty(int(args.gib * 2**30) + 123 * MIB, dtype=torch.uint8, device=f"cuda:{i}")
            for i in range(torch.cuda.device_count())]
    torch.cuda.synchronize()
    time.sleep(1)
    ok &= table(f"under load: torch holds {args.gib:g} GiB + 123 MiB per GPU", gpus)
    del held
    print("\nequal within 1 MiB:", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
