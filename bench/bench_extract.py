"""Extraction speed against what the GPU allows with zero waste, for several length mixes.

    python bench/bench_extract.py [--layers 24] [--hidden 2048] [--seq-len 512]
                                  [--batch-size 32] [--mixes equal,mixed,longtail]
                                  [--dir /tmp/bench-extract] [--writers N] [--compare N]
                                  [--disk] [--old OLD_EXTRACT.py] [--scale F]

Builds a random Llama-style model with tui.services.demo (bf16 on the GPU) and, for each
length mix (fixed seed; every length at most --seq-len):

  equal     2,048 sequences x --seq-len tokens
  mixed     4,096 sequences, lengths uniform in [64, --seq-len] (as real conversations are)
  longtail  8,192 sequences, lengths log-normal (median 64, sigma 1) clipped to
            [16, --seq-len]: most short, a few long

times, on the same data, through extract.py's own forward code (remote/extraction/hf.py's
HfBackend: load, warm-up, hooks on speculators' default layers [2, n//2, n-3, n-1], each
layer's output copied to pinned host memory on a side stream), nothing written:

  peer      the bare forward on EQUAL-length batches (--batch-size x --seq-len) of the same
            total tokens: the GPU's rate with no padding and full batches. Timed before
            and after the mix's extract run; the faster one is the peer.
  today     the mix in batches of --batch-size sequences, longest first, each padded to
            its longest (the plan before filled batches)
  filled    the job's plan: longest first, each batch as many sequences as fit
            --batch-size x the longest sequence's tokens
  packed    sequences packed into rows of --seq-len tokens (first fit, longest first),
            --batch-size rows a forward, each row's sequences kept apart by a
            block-diagonal causal mask and their own position ids
  extract   remote/extract.py --backend hf --device cuda --dtype bfloat16 (its done line's
            tok/s: this run's tokens over the wall time from the first batch to the last
            file fsynced) into /dev/shm (tmpfs: the pipeline without the disk);
            --writers N also with that many writer threads; --disk also into --dir;
            --old runs another extract.py (a copy of an older remote/) the same way
            into /dev/shm.

Every rate is useful tokens/s: real tokens only, padding excluded; "padding" is the share
of the tokens computed that are padding. The ratio is rate / peer (goal for extract on
tmpfs: >= 0.95). Checks, per mix: (1) some of extract's files against transformers'
forward of that sequence alone (worst relative error per layer, bf16), for the files of
today's plan and of the job's; (2) every file of extract's run against the same sequences
extracted in the unbucketed order (input order, --batch-size a batch, each padded to its
longest) and written by the job's own writer: how many files are byte-identical (the
first --compare files).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tui.services.demo import build_demo  # noqa: E402

EXTRACT = ROOT / "remote" / "extract.py"
IN_FLIGHT = 4  # extract.py's batches in the writers' hands besides the one being made
DONE = re.compile(r"^\[extract\] done: .* \((?P<rate>[\d.]+) tok/s\) -> ", re.M)
WAITED = re.compile(r"^\[extract\] (waited .*)$", re.M)


def default_layers(n: int) -> list[int]:
    return sorted({2, n // 2, n - 3, n - 1})


def mix(name: str, seq_len: int) -> list[int]:
    """The lengths of one mix (fixed seed)."""
    rng = random.Random(0)
    if name == "equal":
        return [seq_len] * 2048
    if name == "mixed":
        return [rng.randint(64, seq_len) for _ in range(4096)]
    if name == "longtail":
        return [min(seq_len, max(16, round(rng.lognormvariate(math.log(64), 1.0))))
                for _ in range(8192)]
    raise SystemExit(f"unknown mix {name!r}")


def write_data(path: Path, lengths: list[int], vocab: int, seed: int) -> list[Any]:
    """JSON lines of random token ids of these lengths; returns them as Samples."""
    from remote.extraction.common import Sample

    rng = random.Random(seed)
    samples = [Sample([1] + [rng.randrange(3, vocab) for _ in range(n - 1)], None)
               for n in lengths]
    path.write_text("".join(json.dumps({"input_ids": s.ids}) + "\n" for s in samples))
    return samples


def padding(batches: list[tuple[int, int, int]]) -> float:
    """Share of the tokens computed that are padding: (rows, width, useful) a batch."""
    computed = sum(r * w for r, w, _ in batches)
    return 1 - sum(u for _, _, u in batches) / computed


class Bench:
    """One HfBackend (extract.py's forward code) for every bare pass of the session."""

    def __init__(self, model_dir: Path, batch_size: int, seq_len: int) -> None:
        import torch

        from remote.extraction.hf import HfBackend

        self.torch = torch
        self.batch_size, self.seq_len = batch_size, seq_len
        cfg = json.loads((model_dir / "config.json").read_text())
        self.layers = default_layers(cfg["num_hidden_layers"])
        self.backend = HfBackend(model_dir, self.layers, "cuda", "bfloat16", 0.0)
        with contextlib.redirect_stderr(io.StringIO()):  # the shard bar, the warm-up line
            self.backend.load()
            from remote.extraction.common import Sample
            widest = [Sample([1] * seq_len, None)] * batch_size
            self.backend.warm_up(widest, IN_FLIGHT + 1)

    def timed(self, calls: list[Callable[[], Any]], tokens: int) -> float:
        """Useful tokens/s of these batches (each call: one batch's (host tensors,
        event)), at most IN_FLIGHT + 1 batches in the GPU's and copies' hands, as in
        extract.py; one untimed batch first."""
        import collections

        torch = self.torch
        calls[0]()[1].synchronize()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        pending: collections.deque = collections.deque()
        for call in calls:
            pending.append(call())
            if len(pending) > IN_FLIGHT:
                pending.popleft()[1].synchronize()
        while pending:
            pending.popleft()[1].synchronize()
        return tokens / (time.perf_counter() - t0)

    def padded(self, samples: list[Any], plan: list[list[int]]) -> tuple[float, float]:
        """(useful tok/s, padding share) of these padded batches."""
        calls = [lambda idx=idx: self.backend.extract([samples[i] for i in idx]) for idx in plan]
        shape = [(len(idx), max(len(samples[i].ids) for i in idx),
                  sum(len(samples[i].ids) for i in idx)) for idx in plan]
        return self.timed(calls, sum(u for *_, u in shape)), padding(shape)

    def pack(self, samples: list[Any]) -> list[list[list[int]]]:
        """Sequences packed into rows of seq_len tokens, first fit, longest first;
        batch_size rows a batch."""
        rows: list[list[int]] = []
        free: list[int] = []
        for i in sorted(range(len(samples)), key=lambda i: (-len(samples[i].ids), i)):
            n = len(samples[i].ids)
            for r, f in enumerate(free):
                if f >= n:
                    rows[r].append(i)
                    free[r] -= n
                    break
            else:
                rows.append([i])
                free.append(self.seq_len - n)
        return [rows[k:k + self.batch_size] for k in range(0, len(rows), self.batch_size)]

    def packed_extract(self, samples: list[Any], batch: list[list[int]]) -> tuple[Any, Any]:
        """One packed batch through HfBackend's forward and host copy: each row's
        sequences side by side, each with its own positions from 0, and a 4-D mask that
        lets a token see only the earlier tokens of its own sequence."""
        torch, b = self.torch, self.backend
        width = max(sum(len(samples[i].ids) for i in row) for row in batch)
        ids, pos, seg, spans = [], [], [], []
        for r, row in enumerate(batch):
            a = 0
            ri, rp, rs = [], [], []
            for k, i in enumerate(row):
                n = len(samples[i].ids)
                ri += samples[i].ids
                rp += range(n)
                rs += [k] * n
                spans.append((r, a, n))
                a += n
            ids.append(ri + [0] * (width - a))
            pos.append(rp + [0] * (width - a))
            seg.append(rs + [-1 - r for r in range(width - a)])  # padding: alone
        ids, pos, seg = (b._to_device(torch.tensor(x, dtype=torch.long)) for x in (ids, pos, seg))
        q = torch.arange(width, device="cuda")
        causal = q[None, :] <= q[:, None]
        mask = ((seg[:, :, None] == seg[:, None, :]) & causal[None])[:, None]
        return b.to_host(b.forward(ids, mask, pos), spans)

    def packed(self, samples: list[Any]) -> tuple[float, float]:
        batches = self.pack(samples)
        calls = [lambda batch=batch: self.packed_extract(samples, batch) for batch in batches]
        shape = [(len(batch), max(sum(len(samples[i].ids) for i in row) for row in batch),
                  sum(len(samples[i].ids) for row in batch for i in row)) for batch in batches]
        return self.timed(calls, sum(u for *_, u in shape)), padding(shape)

    def packed_outputs(self, samples: list[Any], picks: list[int]) -> dict[int, list[Any]]:
        """The picked samples' host tensors as the packed batches give them."""
        got = {}
        for batch in self.pack(samples):
            flat = [i for row in batch for i in row]
            if any(i in picks for i in flat):
                out, done = self.packed_extract(samples, batch)
                done.synchronize()
                got.update({i: [h.clone() for h in o] for i, o in zip(flat, out) if i in picks})
        return got

    def lone_error(self, samples: list[Any], got: dict[int, list[Any]]) -> float:
        """Worst relative error (Frobenius, per layer) of the given host tensors of these
        samples against transformers' own forward of each sequence alone."""
        torch = self.torch
        model = self.backend.model
        worst = 0.0
        for i, hs in got.items():
            with torch.inference_mode():
                ref = model(torch.tensor([samples[i].ids], device="cuda"),
                            output_hidden_states=True).hidden_states
                for k, L in enumerate(self.layers):
                    ours = hs[k].cuda()
                    if L == self.layers[-1]:  # ours is before the final norm, as speculators captures it
                        ours = model.model.norm(ours[None])[0]
                    want = ref[L + 1][0].float()
                    worst = max(worst, ((ours.float() - want).norm() / want.norm()).item())
        return worst

    def plan_outputs(self, samples: list[Any], plan: list[list[int]],
                     picks: list[int]) -> dict[int, list[Any]]:
        """The picked samples' host tensors as this plan's batches give them."""
        got = {}
        for idx in plan:
            if any(i in picks for i in idx):
                out, done = self.backend.extract([samples[i] for i in idx])
                done.synchronize()
                got.update({i: [h.clone() for h in o] for i, o in zip(idx, out) if i in picks})
        return got

    def same_bytes(self, samples: list[Any], out: Path, scratch: Path) -> tuple[int, int, float]:
        """The samples extracted in input order (batch_size a batch, each padded to its
        longest), written by extract.py's own writer under the same names into `scratch`,
        compared byte for byte with `out`'s files: (identical, compared, worst max-abs
        difference of the others' hidden states)."""
        from remote.extraction import files as extract_files

        torch = self.torch
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        extract_files.skip_crc32(torch)
        same = worst = 0
        lock = threading.Lock()

        def one(i: int, hs: list[Any], ready: Any) -> None:
            nonlocal same, worst
            name = f"data_{i}.pt"
            extract_files.write_sample(scratch / name, samples[i], hs, ready)
            ok = (scratch / name).read_bytes() == (out / name).read_bytes()
            diff = 0.0
            if not ok:
                theirs = torch.load(str(out / name), weights_only=True)["hidden_states"]
                diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(hs, theirs))
            (scratch / name).unlink()
            with lock:
                same += ok
                worst = max(worst, diff)

        with ThreadPoolExecutor(max_workers=16) as pool:
            for a in range(0, len(samples), self.batch_size):
                idx = list(range(a, min(a + self.batch_size, len(samples))))
                hs, ready = self.backend.extract([samples[i] for i in idx])
                ready.synchronize()
                list(pool.map(lambda x: one(*x), [(i, h, None) for i, h in zip(idx, hs)]))
        shutil.rmtree(scratch, ignore_errors=True)
        return same, len(samples), worst


def run_extract(script: Path, model_dir: Path, data: Path, out: Path, batch_size: int,
                *extra: str) -> tuple[float, float]:
    """(tok/s from the done line, wall seconds of the whole process)."""
    shutil.rmtree(out, ignore_errors=True)
    argv = [sys.executable, str(script), "--backend", "hf", "--model", str(model_dir),
            "--data", str(data), "--out", str(out), "--device", "cuda", "--dtype", "bfloat16",
            "--batch-size", str(batch_size), *extra]
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
    for line in proc.stderr.splitlines():
        if "warning" in line:
            print(f"  {out}: {line}", flush=True)
    return float(m["rate"]), wall


def writers_alone(data: Path, out: Path, layers: int, hidden: int, batch_size: int,
                  threads: int | None = None) -> float:
    """tok/s of extract.py's own writer (remote/extraction/files.py's write_sample, on as many
    threads as extract.py runs) writing the same files from host memory, no GPU: what
    the writing alone allows. The rows come from batch-shaped buffers, as in extract.py."""
    import torch

    from remote.extraction import files as extract_files
    from remote.extraction.common import Sample

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--mixes", default="equal,mixed,longtail")
    p.add_argument("--dir", default="/tmp/bench-extract")
    p.add_argument("--disk", action="store_true", help="also extract to --dir, and time the disk")
    p.add_argument("--old", help="another extract.py to time the same way (to --dir)")
    p.add_argument("--writers", type=int, action="append", default=[],
                   help="also run extract.py --writers N to /dev/shm (repeatable)")
    p.add_argument("--compare", type=int, default=1024,
                   help="files compared with the unbucketed order, from the first")
    p.add_argument("--scale", type=float, default=1.0, help="scale the mixes' sizes (a quick try)")
    args = p.parse_args()
    import torch

    from remote.extraction.input import plan_batches

    root = Path(args.dir)
    t0 = time.perf_counter()
    paths = build_demo(root, shards=8, layers=args.layers, hidden=args.hidden, sequences=1,
                       seq_len=args.seq_len, shard_delay=0.0, patches=False)
    vocab = json.loads((paths.model / "config.json").read_text())["vocab_size"]
    os.sync()  # the model's shards on disk now, not written back during the first run
    bs = args.batch_size
    print(f"model: {args.layers} layers x {args.hidden} hidden, bf16, batch {bs} x "
          f"{args.seq_len} tokens; layers {default_layers(args.layers)}; built in "
          f"{time.perf_counter() - t0:.0f} s")
    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; "
          f"CPUs {os.cpu_count()}", flush=True)
    bench = Bench(paths.model, bs, args.seq_len)
    shm = Path("/dev/shm/bench-extract-out")
    table = []
    for name in args.mixes.split(","):
        lengths = mix(name, args.seq_len)
        lengths = lengths[:max(1, round(len(lengths) * args.scale))]
        tokens = sum(lengths)
        data = root / f"{name}.jsonl"
        samples = write_data(data, lengths, vocab, 1)
        peer_samples = [s for s in write_data(root / f"{name}-peer.jsonl",
                                             [args.seq_len] * max(1, round(tokens / args.seq_len)),
                                             vocab, 2)]
        peer_plan = plan_batches(peer_samples, bs, None)
        today_plan = plan_batches(samples, bs, None)
        filled_plan = plan_batches(samples, bs, None, fill=True)
        print(f"\n{name}: {len(lengths)} sequences, {tokens} tokens, lengths {min(lengths)}-"
              f"{max(lengths)} (median {sorted(lengths)[len(lengths) // 2]}); peer "
              f"{len(peer_samples)} x {args.seq_len}", flush=True)
        rows = []
        p1, _ = bench.padded(peer_samples, peer_plan)
        print(f"  peer (before): {p1:.0f} tok/s", flush=True)
        r, pad = bench.padded(samples, today_plan)
        rows.append((f"bare, today's batches ({bs} sequences)", r, pad))
        r, pad = bench.padded(samples, filled_plan)
        rows.append((f"bare, filled batches ({bs} x {args.seq_len} padded tokens)", r, pad))
        r, pad = bench.packed(samples)
        rows.append((f"bare, packed rows of {args.seq_len} ({bs} rows a batch)", r, pad))
        for n in args.writers:
            ex, wall = run_extract(EXTRACT, paths.model, data, shm, bs, "--writers", str(n))
            rows.append((f"extract.py --writers {n} -> /dev/shm (wall {wall:.1f} s)", ex, None))
        ex, wall = run_extract(EXTRACT, paths.model, data, shm, bs)
        rows.append((f"extract.py -> /dev/shm (tmpfs; process wall {wall:.1f} s)", ex, None))
        if args.disk:
            ex_disk, wall_disk = run_extract(EXTRACT, paths.model, data, root / "out", bs)
            rows.append((f"extract.py -> {root / 'out'} (disk; wall {wall_disk:.1f} s)", ex_disk, None))
            alone = writers_alone(data, root / "writers", len(bench.layers), args.hidden, bs)
            rows.append(("extract.py's writers alone -> disk (no GPU)", alone, None))
        if args.old:
            shm_old = Path("/dev/shm/bench-extract-old")
            old, wall_old = run_extract(Path(args.old), paths.model, data, shm_old, bs)
            shutil.rmtree(shm_old, ignore_errors=True)
            rows.append((f"--old {args.old} -> /dev/shm (wall {wall_old:.1f} s)", old, None))
        p2, _ = bench.padded(peer_samples, peer_plan)
        print(f"  peer (after): {p2:.0f} tok/s", flush=True)
        peer = max(p1, p2)
        # Checks: lone forwards (today's plan and the job's files), the unbucketed order.
        picks = sorted({0, len(samples) // 2, len(samples) - 1,
                        *random.Random(3).sample(range(len(samples)), min(13, len(samples)))})
        err_today = bench.lone_error(samples, bench.plan_outputs(samples, today_plan, picks))
        job = {i: torch.load(str(shm / f"data_{i}.pt"), weights_only=True)["hidden_states"]
               for i in picks}
        err_job = bench.lone_error(samples, job)
        packed = bench.packed_outputs(samples, picks)
        err_packed = bench.lone_error(samples, packed)
        same, compared, diff = bench.same_bytes(samples[:args.compare], shm,
                                                Path("/dev/shm/bench-extract-unb"))
        shutil.rmtree(shm, ignore_errors=True)
        print(f"\n  {'run':<62} {'tok/s':>9} {'x peer':>7} {'padding':>8}")
        print(f"  {'bare, equal lengths, same tokens (peer)':<62} {peer:>9.0f} {1:>7.2f} {0:>7.1%}")
        for what, rate, pad in rows:
            ps = f"{pad:>7.1%}" if pad is not None else f"{'':>7}"
            print(f"  {what:<62} {rate:>9.0f} {rate / peer:>7.3f} {ps}")
        print(f"  {len(picks)} sequences vs a lone forward, worst relative error: today's "
              f"batches {err_today:.2e}, extract.py's files {err_job:.2e}, packed rows "
              f"{err_packed:.2e}")
        print(f"  byte-identical to the unbucketed order (input order, {bs} a batch): "
              f"{same}/{compared} files" + (f"; the others differ by at most {diff:.3g}"
                                            if same < compared else ""), flush=True)
        table.append((name, tokens, peer, rows, err_today, err_job, same, compared))
    if args.disk:
        out_bytes = sum(f.stat().st_size for f in (root / "out").glob("data_*.pt"))
        files = len(list((root / "out").glob("data_*.pt")))
        gbps = disk_ceiling(root / "disk", files=files, size=out_bytes // max(1, files))
        print(f"\nthis disk with 16 fsyncing threads: {gbps:.2f} GB/s")
    print("\nsummary (useful tok/s / peer):")
    for name, tokens, peer, rows, err_today, err_job, same, compared in table:
        ex = next(rate for what, rate, _ in rows if what.startswith("extract.py -> /dev/shm"))
        old = [rate for what, rate, _ in rows if what.startswith("--old ")]
        print(f"  {name:<9} tokens {tokens:>8}  peer {peer:>8.0f}  extract tmpfs {ex:>8.0f}  "
              f"ratio {ex / peer:.3f}" + (f" (--old {old[0] / peer:.3f})" if old else "")
              + f"  lone err {err_today:.2e} -> {err_job:.2e}  bytes {same}/{compared}")


if __name__ == "__main__":
    main()
