"""Extraction speed against what the GPU allows, measured in one session.

    python bench/bench_extract.py [--layers 24] [--hidden 2048] [--sequences 1024]
                                  [--seq-len 512] [--batch-size 32] [--dir /tmp/bench-extract]
                                  [--old OLD_EXTRACT.py] [--min-len N]

Builds a random Llama-style model with tui.services.demo (bf16 on the GPU), then times, on the
same batches of the same data:

  bare   extract.py's own forward code (remote/extract_hf.py's HfBackend: load, warm-up,
         batches, hooks on speculators' default layers [2, n//2, n-3, n-1], each layer's
         output copied to pinned host memory on a side stream), nothing written: what the
         GPU allows, through the same code path, so only the writing differs. Run before
         and after the extract runs; the faster one is the peer.
  extract  remote/extract.py --backend hf --device cuda --dtype bfloat16 (its done line's
         tok/s: this run's tokens over the wall time from the first batch to the last file
         fsynced, data_config.json written), into --dir (disk) and into /dev/shm (tmpfs:
         the pipeline without the disk).
  disk   the same bytes written as files by 16 threads with fsync, nothing else: the
         disk's ceiling.
  --old  another extract.py (e.g. the previous version) run the same way, for comparison.
  writers  extract.py's own writer alone, the same files from host memory to /dev/shm
         on as many threads as extract.py, no GPU: what the writing allows.
  --min-len  mixed lengths, as real conversations are: each sequence cut to a length drawn
         uniformly from [N, --seq-len] (fixed seed), so batches are padded.

Prints one table; the ratio is extract tok/s / bare tok/s (goal >= 0.85). Where the disk
is slower than the GPU's output, no writer can reach that: the bench also prints what the
disk allows (bare and the output written at the disk's fsynced rate, overlapped, and one
after the other) and extract's ratio to both.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tui.services.demo import build_demo  # noqa: E402

EXTRACT = ROOT / "remote" / "extract.py"
IN_FLIGHT = 4  # extract.py's batches in the writers' hands besides the one being made
DONE = re.compile(r"^\[extract\] done: .* \((?P<rate>[\d.]+) tok/s\) -> ", re.M)
WAITED = re.compile(r"^\[extract\] (waited .*)$", re.M)


def default_layers(n: int) -> list[int]:
    return sorted({2, n // 2, n - 3, n - 1})


def bare(model_dir: Path, data: Path, batch_size: int) -> tuple[float, int]:
    """tokens/s of extract.py's own forward code (remote/extract_hf.py: the same load,
    warm-up, batches, hooks, 4-D mask and copies to pinned host memory on a side stream),
    nothing written: only the writing differs from the extract runs."""
    import torch

    sys.path.insert(0, str(ROOT / "remote"))
    from extract_common import Sample
    from extract_hf import HfBackend
    from extract_input import plan_batches

    cfg = json.loads((model_dir / "config.json").read_text())
    samples = [Sample(json.loads(line)["input_ids"], None)
               for line in data.read_text().splitlines()]
    plan = plan_batches(samples, batch_size, None)
    backend = HfBackend(model_dir, default_layers(cfg["num_hidden_layers"]), "cuda",
                        "bfloat16", 0.0)
    with contextlib.redirect_stderr(io.StringIO()):  # the shard bar
        backend.load()
        backend.warm_up([samples[i] for i in plan[0]], IN_FLIGHT + 1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    tokens = 0
    pending: collections.deque = collections.deque()
    for idx in plan:
        pending.append(backend.extract([samples[i] for i in idx]))  # (host tensors, event)
        if len(pending) > IN_FLIGHT:
            pending.popleft()[1].synchronize()
        tokens += sum(len(samples[i].ids) for i in idx)
    while pending:
        pending.popleft()[1].synchronize()
    rate = tokens / (time.perf_counter() - t0)
    del backend, pending
    torch.cuda.empty_cache()
    return rate, tokens


def check(model_dir: Path, out: Path, picks: list[int]) -> str:
    """Compare some data_{i}.pt with transformers' own forward of that sequence alone."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)
    model = model.to("cuda").eval()
    layers = default_layers(model.config.num_hidden_layers)
    worst = 0.0
    for i in picks:
        d = torch.load(str(out / f"data_{i}.pt"), mmap=True, weights_only=True)
        with torch.inference_mode():
            ref = model(d["input_ids"][None].cuda(), output_hidden_states=True).hidden_states
            for k, L in enumerate(layers):
                ours = d["hidden_states"][k].cuda().float()
                if L == layers[-1]:  # ours is before the final norm, as speculators captures it
                    ours = model.model.norm(ours.to(torch.bfloat16)[None])[0].float()
                want = ref[L + 1][0].float()
                worst = max(worst, ((ours - want).norm() / want.norm()).item())
    del model
    torch.cuda.empty_cache()
    return f"{len(picks)} samples x {len(layers)} layers vs a lone forward: worst relative error {worst:.2e}"


def run_extract(script: Path, model_dir: Path, data: Path, out: Path, batch_size: int) -> tuple[float, float]:
    """(tok/s from the done line, wall seconds of the whole process)."""
    shutil.rmtree(out, ignore_errors=True)
    argv = [sys.executable, str(script), "--backend", "hf", "--model", str(model_dir),
            "--data", str(data), "--out", str(out), "--device", "cuda", "--dtype", "bfloat16",
            "--batch-size", str(batch_size)]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{script} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    m = DONE.search(proc.stdout)
    if not m:
        sys.exit(f"no done line from {script}: {proc.stdout[-500:]}")
    w = WAITED.search(proc.stderr)
    if w:
        print(f"  {out}: {w[1]}", flush=True)
    return float(m["rate"]), wall


def writers_alone(data: Path, out: Path, layers: int, hidden: int, batch_size: int,
                  threads: int | None = None) -> float:
    """tok/s of extract.py's own writer (remote/extract_files.py's write_sample, on as many
    threads as extract.py runs) writing the same files from host memory, no GPU: what
    the writing alone allows. The rows come from batch-shaped buffers, as in extract.py."""
    import torch

    sys.path.insert(0, str(ROOT / "remote"))
    import extract_files
    from extract_common import Sample

    samples = [Sample(json.loads(line)["input_ids"], None)
               for line in data.read_text().splitlines()]
    width = max(len(s.ids) for s in samples)
    bufs = [torch.randn(batch_size, width, hidden).to(torch.bfloat16) for _ in range(layers)]
    extract_files.skip_crc32(torch)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)

    def write(i: int) -> None:
        n = len(samples[i].ids)
        extract_files.write_sample(out / f"data_{i}.pt", samples[i],
                                   [b[i % batch_size, :n] for b in bufs], None)

    threads = threads or max(4, min(32, 2 * (os.cpu_count() or 2)))  # as extract.py
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(write, range(len(samples))))
    rate = sum(len(s.ids) for s in samples) / (time.perf_counter() - t0)
    shutil.rmtree(out, ignore_errors=True)
    return rate


def disk_ceiling(d: Path, files: int, size: int, threads: int = 16) -> float:
    """GB/s writing `files` files of `size` bytes, each fsynced, from `threads` threads."""
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    blob = os.urandom(size)
    lock = threading.Lock()
    left = list(range(files))

    def work() -> None:
        while True:
            with lock:
                if not left:
                    return
                i = left.pop()
            with open(d / f"f{i}", "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())

    t0 = time.perf_counter()
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    rate = files * size / (time.perf_counter() - t0) / 1e9
    shutil.rmtree(d, ignore_errors=True)
    return rate


def mix_lengths(data: Path, low: int, high: int) -> None:
    """Cut each sequence of `data` (JSON lines of input_ids) to a length in [low, high]."""
    import random

    rng = random.Random(0)
    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    for row in rows:
        row["input_ids"] = row["input_ids"][:rng.randint(low, high)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--sequences", type=int, default=1024)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--dir", default="/tmp/bench-extract")
    p.add_argument("--old", help="another extract.py to time the same way")
    p.add_argument("--min-len", type=int, help="cut sequences to lengths in [N, --seq-len]")
    args = p.parse_args()
    import torch

    root = Path(args.dir)
    t0 = time.perf_counter()
    paths = build_demo(root, shards=8, layers=args.layers, hidden=args.hidden,
                       sequences=args.sequences, seq_len=args.seq_len, shard_delay=0.0,
                       patches=False)
    if args.min_len:
        mix_lengths(paths.data, args.min_len, args.seq_len)
    os.sync()  # the model's shards on disk now, not written back during the first run
    print(f"model: {args.layers} layers x {args.hidden} hidden, {args.sequences} sequences x "
          f"{f'{args.min_len}-' if args.min_len else ''}{args.seq_len} tokens, bf16, batch {args.batch_size}; layers "
          f"{default_layers(args.layers)}; built in {time.perf_counter() - t0:.0f} s")
    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; "
          f"CPUs {os.cpu_count()}", flush=True)
    rows = []
    b1, tokens = bare(paths.model, paths.data, args.batch_size)
    rows.append(("bare forward + hooks + copy to pinned host (before)", b1))
    print(f"bare: {b1:.0f} tok/s", flush=True)
    ex, wall = run_extract(EXTRACT, paths.model, paths.data, root / "out", args.batch_size)
    print(f"extract: {ex:.0f} tok/s", flush=True)
    print(check(paths.model, root / "out", [0, args.sequences // 2, args.sequences - 1]), flush=True)
    rows.append((f"extract.py -> {root / 'out'} (disk; process wall {wall:.1f} s)", ex))
    out_bytes = sum(f.stat().st_size for f in (root / "out").glob("data_*.pt"))
    shm = Path("/dev/shm/bench-extract-out")
    ex_shm = None
    if Path("/dev/shm").is_dir() and shutil.disk_usage("/dev/shm").free > 1.5 * out_bytes:
        ex_shm, wall_shm = run_extract(EXTRACT, paths.model, paths.data, shm, args.batch_size)
        shutil.rmtree(shm, ignore_errors=True)
        rows.append((f"extract.py -> /dev/shm (tmpfs; process wall {wall_shm:.1f} s)", ex_shm))
        alone = writers_alone(paths.data, shm, len(default_layers(args.layers)), args.hidden,
                              args.batch_size)
        rows.append(("extract.py's writers alone -> /dev/shm (no GPU)", alone))
    else:
        print("no room in /dev/shm for the tmpfs run", flush=True)
    if args.old:
        old, wall_old = run_extract(Path(args.old), paths.model, paths.data, root / "out-old",
                                    args.batch_size)
        shutil.rmtree(root / "out-old", ignore_errors=True)
        rows.append((f"{Path(args.old).name} (process wall {wall_old:.1f} s)", old))
    b2, _ = bare(paths.model, paths.data, args.batch_size)
    rows.append(("bare forward + hooks + copy to pinned host (after)", b2))
    peer = max(b1, b2)
    gbps = disk_ceiling(root / "disk", files=args.sequences, size=out_bytes // args.sequences)
    print(f"\n{'run':<70} {'tok/s':>10} {'x bare':>7}")
    for name, rate in rows:
        print(f"{name:<70} {rate:>10.0f} {rate / peer:>7.2f}")
    per_token = out_bytes / tokens
    need = per_token * peer / 1e9
    print(f"\noutput {out_bytes / 2**30:.2f} GiB for {tokens} tokens; writing it at the bare "
          f"rate needs {need:.2f} GB/s; this disk with 16 fsyncing threads: {gbps:.2f} GB/s")
    # What the disk allows: the GPU and the disk each at full speed, perfectly overlapped
    # (the slower one sets the pace), and the same done one after the other.
    disk_rate = gbps * 1e9 / per_token
    ceiling = min(peer, disk_rate)
    serial = 1 / (1 / peer + 1 / disk_rate)
    print(f"the disk alone allows {disk_rate:.0f} tok/s; bare and the write at disk speed, "
          f"overlapped: {ceiling:.0f} tok/s, one after the other: {serial:.0f} tok/s")
    shm_ratio = f"{ex_shm / peer:.3f}" if ex_shm else "not run"
    print(f"ratio extract/bare (disk) = {ex / peer:.3f}   (tmpfs) = {shm_ratio}   goal >= 0.85")
    print(f"ratio extract (disk) / (bare + write at disk speed): overlapped = {ex / ceiling:.3f}"
          f"   one after the other = {ex / serial:.3f}")


if __name__ == "__main__":
    main()
