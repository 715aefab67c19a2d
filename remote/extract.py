"""EAGLE-3 hidden-state extraction job, run with the host's Python: the entry point.

    python extract.py --backend hf|vllm --model DIR --data FILE.jsonl --out DIR
                      [--layers 2,16,29,31] [--raw] [--batch-size N] [--max-seq-len N]
                      [--device cpu|cuda] [--dtype float32|bfloat16] [--tp N]
                      [--writers N] [--preflight] [--shard-delay S]

Input: JSON lines, each {"input_ids": [...]} (optionally with "loss_mask"), or
{"text": "..."}, or {"conversations"|"messages": [{"role", "content"}, ...]}. Text and
chat lines are tokenized with the model's tokenizer and chat template; for chat, the
loss mask marks the tokens of assistant turns.

Layers: layer L means the output of decoder layer L (0-based) *before* the final norm,
the same tensor speculators' worker captures (hidden_states + residual). Default is
speculators 0.3.0's choice: [2, n // 2, n - 3, n - 1] for an n-layer model. An EAGLE-3
drafter trains on exactly 3 aux layers plus the last one (n - 1); any other choice is
refused unless --raw is given.

Output in --out: speculators 0.3.0's own training-data format, which its
scripts/train.py reads as it is (--data-path OUT):
  data_{i}.pt   one per input line, i from 0 in input order; the bytes torch.save writes for
      {"input_ids": int64 [seq], "hidden_states": [the layers ascending, each
       [seq, hidden], each on its own storage], "loss_mask": int64 [seq] (the input's,
       else all ones)}
  token_freq.pth  {token id: count} of the tokens whose loss_mask is 1, for
      speculators' scripts/build_vocab_mapping.py --token-freq-path (not named *pt:
      speculators' loader takes every file whose name ends in "pt")
  data_config.json  model, layers, dtype, counts and the file schema (written last:
      its presence = done)
Every file is written to a temp name that does not end in "pt" (data_7.tmp-PID),
fsynced, then renamed. No timestamps anywhere, so a killed-and-resumed run is
byte-identical to an uninterrupted one; a rerun skips batches whose files are all
complete and match the input. Batches group sequences of similar length, longest first
(little padding); with the hf backend, which pads each batch to its longest sequence,
each batch holds as many sequences as fit --batch-size x the longest sequence's tokens,
so short sequences make forwards as large as the first; the files keep the input order.
On CUDA each layer's batch is copied to pinned host memory on a side stream, overlapped
with the next batch's forward, and a pool of --writers threads writes the files from
those buffers (extraction/files.py says how), each thread a run of a batch's files.

Progress goes to stdout (flushed), in exactly these forms (the TUI's parser reads them):
  [extract] batch 3/9 | seqs 6/18 | tokens 1536/4608 | 980.3 tok/s | elapsed 0:00:02 | eta 0:00:03
  [extract] batch 3/16 skipped (already done)
  [extract] done: 128 sequences, 32768 tokens in 0:00:21 (1560.2 tok/s) -> /path/data_config.json
The tok/s of the done line counts this run's extracted tokens over the wall time from
the first batch to the last file on disk (token_freq.pth, from the input alone, is
written before the first batch; on CUDA the hf backend first makes one untimed pass over
the first batch, and says how long it took on stderr). At the end a stderr line says how
long the forwards waited for the output writers (where the disk is the limit). The hf
backend reports shard loading on stderr in vLLM's bar format, one line per shard, then
`Loading weights took X.XX seconds`. `--shard-delay S` sleeps S seconds per shard: a demo aid only, so the bar can
be watched on a tiny model.

--backend vllm drives speculators' VllmHiddenStatesGenerator (tensor parallel, --tp).
--preflight checks in seconds, without loading weights, that the installed vLLM and the
speculators generator file fit together; the vllm backend runs it before loading too.

Exit codes: 0 ok, 1 preflight failed, 2 bad input or missing dependency (one line on
stderr), 3 extraction failed.

This file is the CLI and the run loop; the modules of remote/extraction/ (shipped with
it: the client uploads the whole remote package) hold the rest: common.py (errors,
progress lines), input.py (dataset, batches, layers), files.py (the output files), zip.py
(their zip layout, by hand), hf.py and vllm.py (the backends), preflight.py. From the rest
of the host side the job imports remote.base alone (pyproject.toml's import contracts).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Deque, List, Optional, Tuple

if not __package__:  # started as a file: docs/architecture.md, "Upload layout and imports"
    _HERE = os.path.dirname(os.path.abspath(__file__))  # off sys.path, for the dir above
    _ABOVE = os.path.dirname(_HERE)
    sys.path[:] = [_ABOVE] + [p for p in sys.path if os.path.abspath(p) != _HERE]

from remote.base import atomicfile
from remote.base.wire import one_line
from remote.extraction.common import PREFIX, Fail, hms, note, say
from remote.extraction.files import (
    CONFIG_FILE,
    SAMPLE_FILE,
    TOKEN_FREQ_FILE,
    data_config,
    fsync_path,
    lock_out_dir,
    sample_ok,
    save_token_freq,
    skip_crc32,
    write_sample,
)
from remote.extraction.input import choose_layers, plan_batches, read_dataset, read_model_config
from remote.extraction.vllm import VLLM_MAX_SEQS, VLLM_MIN_BATCH_TOKENS

# Batches whose files may still be in the writers' hands, besides the one being made;
# bounds pinned host memory.
IN_FLIGHT = 4


def preflight(generator_file: Optional[str]) -> int:
    """The checks live in extraction/preflight.py, shipped with this file."""
    from remote.extraction import preflight as checks

    return checks.preflight(generator_file)


def run(args: argparse.Namespace) -> int:
    model_dir = Path(args.model).resolve()
    cfg = read_model_config(model_dir)
    num_layers, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    layers = choose_layers(args.layers, num_layers, args.raw)
    max_seq_len = args.max_seq_len
    samples, truncated = read_dataset(Path(args.data), model_dir, max_seq_len)
    vocab = cfg.get("vocab_size")
    if isinstance(vocab, int):
        for n, s in enumerate(samples, 1):
            big = max(s.ids)
            if big >= vocab:
                raise Fail("%s: sequence %d has token id %d >= vocab size %d"
                           % (Path(args.data).name, n, big, vocab))
    if truncated:
        note("%s %d sequence(s) truncated to --max-seq-len %d" % (PREFIX, truncated, max_seq_len))
    max_tokens = None
    if args.backend == "vllm":
        if args.batch_size > VLLM_MAX_SEQS:
            raise Fail("--batch-size must be <= %d with the vllm backend" % VLLM_MAX_SEQS)
        max_tokens = max(VLLM_MIN_BATCH_TOKENS, max_seq_len + 1)
    plan = plan_batches(samples, args.batch_size, max_tokens, fill=args.backend == "hf")

    out = Path(args.out).resolve()
    lock = lock_out_dir(out)  # noqa: F841  (held until exit)
    try:
        import torch
    except ImportError as exc:
        raise Fail("the %s backend needs torch: %s" % (args.backend, one_line(exc))) from None
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device == "cuda" or args.backend == "vllm"
    dtype_name = args.dtype or ("bfloat16" if on_gpu else "float32")
    dtype = getattr(torch, dtype_name)

    files = [out / (SAMPLE_FILE % i) for i in range(len(samples))]
    have = {i for i, f in enumerate(files)
            if f.is_file() and sample_ok(f, samples[i], len(layers), hidden, dtype)}
    todo = {b for b, idx in enumerate(plan) if any(i not in have for i in idx)}
    backend: Any = None
    if todo:
        if args.backend == "hf":
            try:
                import safetensors  # noqa: F401
                import transformers  # noqa: F401
            except ImportError:
                raise Fail("the hf backend needs transformers and safetensors: "
                           "pip install transformers safetensors") from None
            if device == "cuda" and not torch.cuda.is_available():
                raise Fail("--device cuda, but torch sees no CUDA device")
            from remote.extraction.hf import HfBackend

            backend = HfBackend(model_dir, layers, device, dtype_name, args.shard_delay)
        else:
            if not args.skip_preflight and preflight(args.generator_file) != 0:
                return 1
            from remote.extraction.vllm import VllmBackend

            backend = VllmBackend(model_dir, layers, hidden, dtype_name, args.tp, max_seq_len)
        backend.load()
        backend.warm_up([samples[i] for i in plan[min(todo)]], IN_FLIGHT + 1)

    # Input-only work, before the clock starts: the counts depend on the input alone.
    masked = save_token_freq(out / TOKEN_FREQ_FILE, samples)
    total_seqs, total_tokens = len(samples), sum(len(s.ids) for s in samples)
    done = {"seqs": 0, "tokens": 0, "work": 0}
    t_start = time.monotonic()
    n = len(plan)
    # (batch number, its writes); lines are printed in batch order as writes complete.
    pending: Deque[Tuple[int, List[Future]]] = collections.deque()

    def finish_oldest() -> None:
        b, futures = pending.popleft()
        for f in futures:
            try:
                f.result()
            except OSError as exc:
                raise Fail("cannot write %s: %s" % (out, one_line(exc)), 3) from None
        idx = plan[b]
        tokens = sum(len(samples[i].ids) for i in idx)
        done["seqs"] += len(idx)
        done["tokens"] += tokens
        if b not in todo:
            say("%s batch %d/%d skipped (already done)" % (PREFIX, b + 1, n))
            return
        done["work"] += tokens
        elapsed = time.monotonic() - t_start
        rate = done["work"] / elapsed if elapsed > 0 else 0.0
        eta = (total_tokens - done["tokens"]) / rate if rate > 0 else 0.0
        say("%s batch %d/%d | seqs %d/%d | tokens %d/%d | %.1f tok/s | elapsed %s | eta %s" % (
            PREFIX, b + 1, n, done["seqs"], total_seqs, done["tokens"], total_tokens, rate,
            hms(elapsed), hms(eta)))

    skip_crc32(torch)
    # Threads blocked in fsync or on a CUDA event hold no GIL: more of them than cores.
    writers = args.writers or max(4, min(32, 2 * (os.cpu_count() or 2)))
    pool = ThreadPoolExecutor(max_workers=writers)
    # Seconds the next forward waited for the writers (IN_FLIGHT batches in their hands),
    # and the writing left after the last forward: where the output's disk is the limit.
    waited = tail = 0.0
    try:
        for b, idx in enumerate(plan):
            futures: List[Future] = []
            if b in todo:
                per_sample, ready = backend.extract([samples[i] for i in idx])
                jobs = [(files[i], samples[i], hs) for i, hs in zip(idx, per_sample)
                        if i not in have]
                # At most one task per writer thread, each a run of the batch's files: a
                # batch of many short sequences would otherwise wake every thread for
                # every file, and their wake-ups take the GIL the next forward needs.
                k = min(writers, len(jobs))
                futures = [pool.submit(write_samples, jobs[j * len(jobs) // k:
                                                           (j + 1) * len(jobs) // k], ready)
                           for j in range(k)]
            pending.append((b, futures))
            while pending and (len(pending) > IN_FLIGHT
                               or all(f.done() for f in pending[0][1])):
                t0 = time.monotonic()
                full = len(pending) > IN_FLIGHT
                finish_oldest()
                waited += time.monotonic() - t0 if full else 0.0
        t0 = time.monotonic()
        while pending:
            finish_oldest()
        tail = time.monotonic() - t0
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    fsync_path(out)  # the renames of the sample files
    config = data_config(args, model_dir, cfg, layers, dtype_name, samples, truncated, masked)
    config_path = out / CONFIG_FILE
    atomicfile.write_json(str(config_path), config, indent=2)
    elapsed = time.monotonic() - t_start
    if todo:
        note("%s waited %.2f s for the output writers before a forward, %.2f s after the "
             "last one (of %.2f s)" % (PREFIX, waited, tail, elapsed))
    rate = done["work"] / elapsed if elapsed > 0 else 0.0
    say("%s done: %d sequences, %d tokens in %s (%.1f tok/s) -> %s"
        % (PREFIX, total_seqs, total_tokens, hms(elapsed), rate, config_path))
    return 0


def write_samples(jobs: List[Tuple[Path, Any, List[Any]]], ready: Any) -> None:
    """Some files of one batch, one after the other (a writer thread's task)."""
    for path, sample, hs in jobs:
        write_sample(path, sample, hs, ready)
        ready = None  # the batch's copies are done


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr and exit 2."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        note("%s error: %s (see --help)" % (PREFIX, message))
        sys.exit(2)


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = _Parser(prog="extract.py", description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    p.add_argument("--model", help="model directory (config.json + safetensors)")
    p.add_argument("--data", help="input JSONL")
    p.add_argument("--out", help="output directory")
    p.add_argument("--layers", help="comma-separated layer ids (default: speculators' choice)")
    p.add_argument("--raw", action="store_true",
                   help="write the layers asked for even if they cannot train an EAGLE-3 "
                        "drafter (which needs 3 aux layers + the last)")
    p.add_argument("--batch-size", type=int, default=8,
                   help="sequences per forward pass (hf: of the longest; shorter ones fill "
                        "the same padded size, so more of them)")
    p.add_argument("--max-seq-len", type=int, default=2048, help="truncate longer sequences")
    p.add_argument("--device", choices=("cpu", "cuda"), help="hf backend (default: cuda if any)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="output (and hf compute) dtype; default float32 on CPU, else bfloat16")
    p.add_argument("--writers", type=int,
                   help="threads writing the output files (default: 2 per CPU, 4 to 32)")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel size (vllm backend)")
    p.add_argument("--preflight", action="store_true",
                   help="only check that vLLM and speculators fit together; load nothing")
    p.add_argument("--skip-preflight", action="store_true",
                   help="vllm backend: do not run the preflight checks before loading")
    p.add_argument("--generator-file",
                   help="speculators generator source to check (default: the installed one)")
    p.add_argument("--shard-delay", type=float, default=0.0,
                   help="demo aid: sleep this many seconds per shard while loading (hf)")
    args = p.parse_args(argv)
    if not args.preflight:
        for name in ("model", "data", "out"):
            if not getattr(args, name):
                p.error("--%s is required" % name)
    for name in ("batch_size", "max_seq_len", "tp", "writers"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error("--%s must be at least 1" % name.replace("_", "-"))
    if args.shard_delay < 0:
        p.error("--shard-delay must not be negative")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    try:
        if args.preflight:
            return preflight(args.generator_file)
        return run(args)
    except Fail as exc:
        note("%s error: %s" % (PREFIX, exc))
        return exc.code
    except KeyboardInterrupt:
        note("%s interrupted" % PREFIX)
        return 130


if __name__ == "__main__":
    sys.exit(main())
