"""Extraction speed against what the GPU allows, measured in one session.

    python bench/bench_extract.py [--layers 24] [--hidden 2048] [--sequences 1024]
                                  [--seq-len 512] [--batch-size 32] [--dir /tmp/bench-extract]
                                  [--old OLD_EXTRACT.py]

Builds a random Llama-style model with tui.services.demo (bf16 on the GPU), then times, on the
same batches of the same data:

  bare   the forward pass with forward hooks on the same decoder layers as extract.py
         (speculators' default [2, n//2, n-3, n-1]) and each layer's output copied to
         pinned host memory, nothing written: what the GPU allows. Run before and after
         the extract runs; the faster one is the peer.
  extract  remote/extract.py --backend hf --device cuda --dtype bfloat16 (its done line's
         tok/s: this run's tokens over the wall time from the first batch to the last file
         fsynced, data_config.json written), into --dir (disk) and into /dev/shm (tmpfs:
         the pipeline without the disk).
  disk   the same bytes written as files by 16 threads with fsync, nothing else: the
         disk's ceiling.
  --old  another extract.py (e.g. the previous version) run the same way, for comparison.

Prints one table; the ratio is extract tok/s / bare tok/s (goal >= 0.85).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tui.services.demo import build_demo  # noqa: E402

EXTRACT = ROOT / "remote" / "extract.py"
DONE = re.compile(r"^\[extract\] done: .* \((?P<rate>[\d.]+) tok/s\) -> ", re.M)


def default_layers(n: int) -> list[int]:
    return sorted({2, n // 2, n - 3, n - 1})


def bare(model_dir: Path, data: Path, batch_size: int) -> tuple[float, int]:
    """tokens/s of forward + hooks + copy to pinned host memory, nothing written."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)
    model = model.to("cuda").eval()
    base = model.model
    layers = default_layers(model.config.num_hidden_layers)
    captured: dict[int, torch.Tensor] = {}
    for L in layers:
        def hook(_m, _i, out, L=L):
            captured[L] = out[0] if isinstance(out, tuple) else out
        base.layers[L].register_forward_hook(hook)
    rows = [json.loads(line)["input_ids"] for line in data.read_text().splitlines()]
    # extract.py's batches: longest first, then input order (all equal here).
    order = sorted(range(len(rows)), key=lambda i: (-len(rows[i]), i))
    batches = [[rows[i] for i in order[a:a + batch_size]] for a in range(0, len(order), batch_size)]
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    tokens = 0
    pending = []
    for batch in batches:
        ids = torch.tensor(batch, dtype=torch.long)
        with torch.inference_mode():
            base(input_ids=ids.to("cuda"), use_cache=False)
        hs = [captured.pop(L) for L in layers]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            host = [torch.empty(h.shape, dtype=h.dtype, pin_memory=True) for h in hs]
            for dst, h in zip(host, hs):
                dst.copy_(h, non_blocking=True)
                h.record_stream(side)
            ev = torch.cuda.Event()
            ev.record(side)
        pending.append((ev, host))
        if len(pending) > 2:
            pending.pop(0)[0].synchronize()
        tokens += ids.numel()
    for ev, _ in pending:
        ev.synchronize()
    rate = tokens / (time.perf_counter() - t0)
    del model, base
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
    return float(m["rate"]), wall


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--sequences", type=int, default=1024)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--dir", default="/tmp/bench-extract")
    p.add_argument("--old", help="another extract.py to time the same way")
    args = p.parse_args()
    import torch

    root = Path(args.dir)
    t0 = time.perf_counter()
    paths = build_demo(root, shards=8, layers=args.layers, hidden=args.hidden,
                       sequences=args.sequences, seq_len=args.seq_len, shard_delay=0.0,
                       patches=False)
    print(f"model: {args.layers} layers x {args.hidden} hidden, {args.sequences} sequences x "
          f"{args.seq_len} tokens, bf16, batch {args.batch_size}; layers "
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
    need = out_bytes / tokens * peer / 1e9
    print(f"\noutput {out_bytes / 2**30:.2f} GiB for {tokens} tokens; writing it at the bare "
          f"rate needs {need:.2f} GB/s; this disk with 16 fsyncing threads: {gbps:.2f} GB/s")
    shm_ratio = f"{ex_shm / peer:.3f}" if ex_shm else "not run"
    print(f"ratio extract/bare (disk) = {ex / peer:.3f}   (tmpfs) = {shm_ratio}   goal >= 0.85")


if __name__ == "__main__":
    main()
