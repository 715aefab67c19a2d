"""A stand-in for a tensor-parallel vLLM run: a parent and one worker per GPU, each
worker holding GPU memory (like TP workers after the weights load), then idling.

    python bench/tp_stub.py [--gib 8]

Used by the device benchmarks to measure kill -> "GPUs free". Needs torch with CUDA.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time


def worker(rank: int, gib: float) -> None:
    import torch

    torch.cuda.set_device(rank)
    held = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=f"cuda:{rank}")
    held.fill_(1)
    torch.cuda.synchronize()
    print(f"(Worker_TP{rank} pid={mp.current_process().pid}) holding {gib} GiB on cuda:{rank}", flush=True)
    while True:
        time.sleep(1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=8.0)
    args = ap.parse_args()
    import torch

    n = torch.cuda.device_count()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r, args.gib)) for r in range(n)]
    for p in procs:
        p.start()
    print(f"started {n} workers", flush=True)
    for p in procs:
        p.join()


if __name__ == "__main__":
    main()
