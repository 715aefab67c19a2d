"""Where one extract.py run's time goes, from PyTorch's profiler: does the GPU sit idle
between forwards, and what is the thread that launches them doing meanwhile.

    python bench/profile_extract.py [--mix longtail] [--scale 0.25] [--layers 24]
                                    [--hidden 2048] [--seq-len 512] [--batch-size 32]
                                    [--device cuda] [--writers N] [--trace FILE.json]

Builds bench_extract.py's model and length mix, and runs remote/extract.py's main() in
this process under torch.profiler (CPU ops, CUDA runtime calls, kernels and copies) into
/dev/shm, each batch's HfBackend.extract() marked. Over the batches after the warm-up it
prints:

  gpu       the window's wall time, the time some kernel or copy ran, the idle share, and
            the idle gaps of 1 ms or more (count, total, the largest with what the
            launching thread was running at the gap's start)
  launcher  the launching (main) thread's time inside torch ops and between them
            (Python, the writers' hand-offs, waiting for the GIL, waiting for writes),
            its top-level ops and CUDA runtime calls by total time: a call that waits
            for the GPU (cudaStreamSynchronize, cudaEventSynchronize, cudaMemcpy,
            cudaHostAlloc) shows here
  writers   the other threads' CUDA runtime calls
  plan      batches, sequences a batch, the padding share

On CUDA the same batches are then profiled the same way without extract.py's loop and
writers (bench_extract.py's bare pass: HfBackend.extract, at most 5 batches in flight,
nothing written), as the control: what the GPU and the launching thread do with no
files to write.

The profiler slows the launching thread (it records every op), so the rates here are
not bench_extract.py's; this says where the time goes, that one how much.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "remote"))

from bench_extract import Bench, mix, write_data  # noqa: E402

from tui.services.demo import build_demo  # noqa: E402

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
MARK = "extract batch"


def union(spans: List[Tuple[float, float]]) -> List[Tuple[float, float]]:
    """Merged (start, end) intervals, in order."""
    out: List[List[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def top_level(events: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The events of one thread not inside another of them."""
    out: List[Dict[str, Any]] = []
    end = float("-inf")
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        if e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e["dur"]
    return out


def analyse(trace: Dict[str, Any], plan_note: str, skip: int) -> List[str]:
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    marks = sorted((e for e in events if e.get("cat") == "user_annotation"
                    and e["name"] == MARK), key=lambda e: e["ts"])
    marks = marks[skip:]  # the untimed passes
    if not marks:
        return ["no batch marked: nothing to profile"]
    main_tid = marks[0]["tid"]
    start = marks[0]["ts"]
    gpu = [(e["ts"], e["ts"] + e["dur"]) for e in events
           if e.get("cat") in GPU_CATS and e["ts"] + e["dur"] > start]
    cpu = [e for e in events if e["ts"] >= start and e.get("cat") in (
        "cpu_op", "cuda_runtime", "cuda_driver", "user_annotation")]
    end = max([b for _, b in gpu] + [e["ts"] + e["dur"] for e in cpu])
    wall = end - start
    lines = [plan_note, "window: %d batches (untimed passes left out), %.3f s" % (len(marks), wall / 1e6)]
    busy_spans = union([(max(a, start), b) for a, b in gpu])
    busy = sum(b - a for a, b in busy_spans)
    main_ops = top_level([e for e in cpu if e["tid"] == main_tid and e.get("cat") == "cpu_op"])
    gaps = [(b0, a1) for (_, b0), (a1, _) in zip(busy_spans, busy_spans[1:])
            if a1 - b0 >= 1000]
    if gpu:
        lines.append("gpu: busy %.3f s of %.3f s (idle %.1f %%); %d gaps >= 1 ms, %.3f s in all"
                     % (busy / 1e6, wall / 1e6, 100 * (1 - busy / wall), len(gaps),
                        sum(b - a for a, b in gaps) / 1e6))
        kernels = sum(1 for e in events if e.get("cat") == "kernel" and e["ts"] >= start)
        lines.append("gpu: %d kernels, %.0f a batch" % (kernels, kernels / len(marks)))
        for a, b in sorted(gaps, key=lambda g: g[0] - g[1])[:8]:
            running = [e["name"] for e in main_ops if e["ts"] <= a < e["ts"] + e["dur"]]
            lines.append("  gap %.2f ms at +%.3f s; launcher in: %s"
                         % ((b - a) / 1e3, (a - start) / 1e6, running[0] if running
                            else "(no torch op: Python, GIL or waiting)"))
    else:
        lines.append("gpu: no kernels recorded (a CPU run)")
    inside = sum(e["dur"] for e in main_ops)
    lines.append("launcher: %.3f s inside torch ops, %.3f s between them (Python, GIL, waits)"
                 % (inside / 1e6, (wall - inside) / 1e6))
    for title, group in (("launcher top-level ops", main_ops),):
        totals: Dict[str, float] = collections.Counter()
        for e in group:
            totals[e["name"]] += e["dur"]
        lines.append(title + ": " + ", ".join("%s %.3f s" % (n, t / 1e6)
                                              for n, t in totals.most_common(8)))
    for title, pick in (("launcher CUDA calls", lambda e: e["tid"] == main_tid),
                        ("writers' CUDA calls", lambda e: e["tid"] != main_tid)):
        totals = collections.Counter()
        counts: Dict[str, int] = collections.Counter()
        for e in cpu:
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and pick(e):
                totals[e["name"]] += e["dur"]
                counts[e["name"]] += 1
        lines.append(title + ": " + (", ".join("%s %d x %.3f s" % (n, counts[n], t / 1e6)
                                               for n, t in totals.most_common(8)) or "none"))
    return lines


def report(prof: Any, path: Path, plan_note: str, skip: int) -> None:
    prof.export_chrome_trace(str(path))
    for line in analyse(json.loads(path.read_text()), plan_note, skip):
        print("  " + line)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mix", default="longtail", help="equal, mixed or longtail")
    p.add_argument("--scale", type=float, default=0.25, help="share of the mix's sequences")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--writers", type=int)
    p.add_argument("--trace", help="also keep the chrome trace here")
    args = p.parse_args()
    import extract
    import extract_hf
    import torch
    from extract_input import plan_batches
    from torch.profiler import ProfilerActivity, profile, record_function

    root = Path(tempfile.mkdtemp(prefix="profile-extract-"))
    out = Path("/dev/shm/profile-extract-out")
    try:
        paths = build_demo(root, shards=2, layers=args.layers, hidden=args.hidden,
                           sequences=1, seq_len=args.seq_len, shard_delay=0.0, patches=False)
        vocab = json.loads((paths.model / "config.json").read_text())["vocab_size"]
        lengths = mix(args.mix, args.seq_len)
        lengths = lengths[:max(1, round(len(lengths) * args.scale))]
        samples = write_data(root / "data.jsonl", lengths, vocab, 1)
        plan = plan_batches(samples, args.batch_size, None, fill=True)
        computed = sum(len(idx) * max(len(samples[i].ids) for i in idx) for idx in plan)
        plan_note = ("plan: %s, %d sequences, %d tokens, %d batches (%.0f sequences a "
                     "batch), padding %.1f %%" % (args.mix, len(samples), sum(lengths),
                                                  len(plan), len(samples) / len(plan),
                                                  100 * (1 - sum(lengths) / computed)))
        plain = extract_hf.HfBackend.extract

        def marked(self: Any, batch: Any) -> Any:
            with record_function(MARK):
                return plain(self, batch)

        extract_hf.HfBackend.extract = marked  # type: ignore[method-assign]
        activities = [ProfilerActivity.CPU]
        if args.device == "cuda":
            activities.append(ProfilerActivity.CUDA)
        shutil.rmtree(out, ignore_errors=True)
        argv = ["--backend", "hf", "--model", str(paths.model), "--data",
                str(root / "data.jsonl"), "--out", str(out), "--device", args.device,
                "--dtype", "bfloat16" if args.device == "cuda" else "float32",
                "--batch-size", str(args.batch_size)]
        if args.writers:
            argv += ["--writers", str(args.writers)]
        with profile(activities=activities) as prof:
            code = extract.main(argv)
        if code != 0:
            sys.exit("extract.py failed (%d)" % code)
        print("torch %s; %s" % (torch.__version__, torch.cuda.get_device_name(0)
                                if args.device == "cuda" else "CPU"))
        print("\nextract.py (%s):" % " ".join(argv[-2:]))
        report(prof, Path(args.trace) if args.trace else root / "trace.json", plan_note,
               1 if args.device == "cuda" else 0)
        if args.device == "cuda":
            bench = Bench(paths.model, args.batch_size, args.seq_len)
            with profile(activities=activities) as prof:
                bench.padded(samples, plan)
            print("\ncontrol: the same batches, bare (nothing written):")
            report(prof, root / "control.json", plan_note, 1)  # timed()'s untimed first batch
    finally:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
