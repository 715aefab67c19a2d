"""What the output writers cost the thread that launches the forwards, no model needed.

    python bench/bench_writer_gil.py [--files-per-s 1400] [--seconds 4] [--threads 32]

The main thread launches tiny kernels (CUDA if there is a GPU, else tiny CPU ops; each
launch drops the GIL and takes it back, as every op of a forward does) as fast as it
can, alone and then beside writers writing long-tailed-length files (extract.py's mix:
log-normal, median 64, 4 layers x 2048 hidden bf16) to /dev/shm at --files-per-s, in
batches of 160 files split into one run per thread (as extract.py submits them):

  per file   remote/extraction/files.py's write_sample laying out each archive per file
             (the writer before templates)
  template   write_sample as it is (the archive from a template per length)
  process    the same writer in a separate process: no GIL shared with the launches

Prints launches/s and the launching time lost per file written:
(time beside - time alone) / files written meanwhile."""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import random
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = Path("/dev/shm/bench-writer-gil")
BATCH = 160
from remote.extraction import zip as extract_zip  # noqa: E402

TEMPLATE = extract_zip.Layout.template  # as the module has it, kept before any variant patches it


def lengths(count: int) -> list[int]:
    rng = random.Random(0)
    return [min(512, max(16, round(rng.lognormvariate(math.log(64), 1.0)))) for _ in range(count)]


def writer_loop(variant: str, files_per_s: float, threads: int, stop: object,
                count: object) -> None:
    """Write batches of BATCH files at files_per_s until `stop` is set; count files."""
    import torch

    from remote.extraction import files as extract_files
    from remote.extraction import zip as extract_zip
    from remote.extraction.common import Sample

    extract_files.skip_crc32(torch)
    # The variants run one after another in this process: each starts from the module as
    # it is (a patch left by "per file" once made the "template" row measure it again).
    extract_zip.Layout.template = TEMPLATE  # type: ignore[method-assign]
    if variant == "per file":
        extract_zip.Layout.template = lambda self, n, name_len: None  # type: ignore
    lens = lengths(4096)
    samples = [Sample([1] * n, None) for n in lens]
    bufs = [torch.randn(BATCH, 512, 2048).to(torch.bfloat16) for _ in range(4)]
    d = OUT / variant.replace(" ", "-")
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    pool = ThreadPoolExecutor(max_workers=threads)

    def run(jobs: list) -> None:
        for i, row in jobs:
            n = lens[i]
            extract_files.write_sample(d / f"data_{i}.pt", samples[i],
                                       [b[row, :n] for b in bufs], None)

    b = 0
    t0 = time.perf_counter()
    while not stop.is_set():  # type: ignore[attr-defined]
        idx = [(b * BATCH + r) % len(lens) for r in range(BATCH)]
        jobs = list(zip(idx, range(BATCH)))
        k = threads
        futures = [pool.submit(run, jobs[j * len(jobs) // k:(j + 1) * len(jobs) // k])
                   for j in range(k)]
        for f in futures:
            f.result()
        b += 1
        count.value = b * BATCH  # type: ignore[attr-defined]
        ahead = t0 + b * BATCH / files_per_s - time.perf_counter()
        if ahead > 0:
            time.sleep(ahead)
    pool.shutdown()
    shutil.rmtree(d, ignore_errors=True)


def launches(seconds: float) -> tuple[int, float]:
    """(launches, seconds) of tiny ops for about `seconds`."""
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.zeros(16, device=dev)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(1000):
            x.add_(1)
        n += 1000
        if dev == "cuda":
            torch.cuda.synchronize()
    return n, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--files-per-s", type=float, default=1400.0)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--threads", type=int, default=32)
    args = p.parse_args()
    import torch

    print(f"launches on {'cuda' if torch.cuda.is_available() else 'cpu'}; CPUs "
          f"{os.cpu_count()}; writers {args.threads} threads, {args.files_per_s:.0f} "
          f"files/s asked", flush=True)
    launches(1.0)  # warm
    n, t = launches(args.seconds)
    alone = n / t
    print(f"  alone: {alone:,.0f} launches/s", flush=True)
    for variant in ("per file", "template", "process"):
        if variant == "process":
            ctx = multiprocessing.get_context("spawn")
            stop, count = ctx.Event(), ctx.Value("q", 0)
            worker = ctx.Process(target=writer_loop, args=("template", args.files_per_s,
                                                           args.threads, stop, count))
        else:
            stop, count = threading.Event(), multiprocessing.Value("q", 0, lock=False)
            worker = threading.Thread(target=writer_loop, args=(variant, args.files_per_s,
                                                                args.threads, stop, count))
        worker.start()
        while count.value < 2 * BATCH:  # started, layouts made
            time.sleep(0.05)
        c0 = count.value
        n, t = launches(args.seconds)
        files = count.value - c0
        stop.set()
        worker.join()
        lost = (t - n / alone) / max(files, 1)
        print(f"  {variant:<9} {n / t:>12,.0f} launches/s ({n / t / alone:.3f} of alone), "
              f"{files / t:,.0f} files/s written: {lost * 1e6:.0f} us of launching lost "
              f"per file", flush=True)


if __name__ == "__main__":
    main()
