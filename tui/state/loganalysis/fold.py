"""Log analysis as a pure fold: ``analysis = step(analysis, line, line_no, t)``.

``step`` is cheap and linear: it looks at one line (at most ``MAX_SCAN`` characters of
it), keeps bounded lists, never re-scans history, and returns the *same* object when
a line changes nothing (most lines). It never raises on odd input.

What it tracks: the run's phase (starting → loading → loaded, with its stage:
profiling, compiling, graph capture, warm-up → serving or extracting → finished, or
failed, with the phase it died in and how long it had been there), the target
model's shard-loading bar per worker (other loaders' bars — a drafter's, a ``pt``
checkpoint's, a re-read — are kept apart in ``loads``), the extractor's progress,
milestones, recognised failures and the root cause: the raised exception's own line.
"stalled", "hung" and "killed" need wall-clock, process and GPU information, so the
caller decides them (``tui.state.watch``).

The record and the builder that applies a line's changes are ``tui.state.loganalysis.record``;
failure recognition (tracebacks, bare exception lines, chains) is
``tui.state.loganalysis.failures``. This module is the fold over lines and its progress and
lifecycle markers, and re-exports the line-level API so callers need one import.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections.abc import Callable
from dataclasses import replace

from remote.run import diverge
from tui.state.loganalysis.failures import (
    REQUEST_SOURCE,
    find_failures,
    note_interrupt,
    request_error,
    retry_note,
)
from tui.state.loganalysis.lineshapes import (
    ExtractProgress,
    LinePrefix,
    ShardProgress,
    parse_extract_progress,
    parse_shard_progress,
    split_prefix,
)
from tui.state.loganalysis.record import (
    MAX_LOADS,
    MAX_TIMES,
    MAX_WORKERS,
    PHASE_RANK,
    QUIET_LEVELS,
    STAGES,
    Builder,
    Failure,
    LogAnalysis,
    advance,
    default_signatures,
    log_seconds,
    signature_errors,
)
from tui.state.loganalysis.train import (
    MAX_LOSSES,
    TrainLine,
    TrainProgress,
    arrival_rate,
    is_save_frame,
    is_train_frame,
    merge,
    parse_train_line,
    second_bar,
)
from tui.state.loganalysis.trainphases import in_evaluation
from tui.state.logbytes import collapse_cr, finish_lines, live_segment, split_lines, strip_ansi

__all__ = [
    "ExtractProgress",
    "Failure",
    "LogAnalysis",
    "ShardProgress",
    "collapse_cr",
    "default_signatures",
    "finish_lines",
    "is_stalled",
    "live_segment",
    "parse_extract_progress",
    "parse_shard_progress",
    "signature_errors",
    "split_lines",
    "step",
    "strip_ansi",
]


# Milestones: one regex, one named group per kind; each kind is recorded once.
_MILESTONES = re.compile(
    r"(?P<start>Starting to load model (?P<model>\S+?)(?:\.\.\.)?$)"
    r"|(?P<weights>Loading (?:model )?weights took (?P<wsec>\d{1,15}(?:\.\d{1,15})?) (?P<wunit>seconds|GB|GiB))"
    r"|(?P<loaded>Model loading took (?P<gib>\d{1,15}(?:\.\d{1,15})?) Gi?B(?: memory)? and "
    r"(?P<lsec>\d{1,15}(?:\.\d{1,15})?) seconds)"
    r"|(?P<arch>Resolved architecture: (?P<archname>\S+))"
    r"|(?P<async>Asynchronous scheduling is (?P<onoff>enabled|disabled))"
    r"|(?P<maxlen>Using max model len (?P<len>\d+))"
    r"|(?P<prefill>Chunked prefill is enabled)"
    r"|(?P<nccl>vLLM is using nccl==(?P<ncclv>\S+))"
    r"|(?P<attn>Using (?P<backend>\S+) attention backend)"
)


def _milestone_label(m: re.Match[str]) -> tuple[str, str]:
    """(kind, label) for a milestone match."""
    kind = "start"
    for k in ("start", "weights", "loaded", "arch", "async", "maxlen", "prefill", "nccl", "attn"):
        if m.group(k) is not None:
            kind = k
            break
    labels: dict[str, Callable[[], str]] = {
        "start": lambda: f"Starting to load model {m['model']}",
        "weights": lambda: (f"Weights loaded in {float(m['wsec']):.1f} s" if m["wunit"] == "seconds"
                            else f"Weights loaded: {m['wsec']} {m['wunit']}"),
        "loaded": lambda: f"Model loaded: {m['gib']} GiB in {float(m['lsec']):.1f} s",
        "arch": lambda: f"Resolved architecture {m['archname']}",
        "async": lambda: f"Asynchronous scheduling {m['onoff']}",
        "maxlen": lambda: f"Max model len {m['len']}",
        "prefill": lambda: "Chunked prefill enabled",
        "nccl": lambda: f"NCCL {m['ncclv']}",
        "attn": lambda: f"Attention backend {m['backend']}",
    }
    return kind, labels[kind]()


# Lifecycle evidence: the server is up and requests flow, or the engine is past the load.
_LIFECYCLE = re.compile(
    r"(?P<serving>Uvicorn running on|Application startup complete|Avg prompt throughput"
    r"|Starting vLLM API server|Received request|Added request|\"(?:GET|POST) /[^\s\"]* HTTP/1\.[01]\" \d{3}"
    r"|The server is fired up and ready to roll|^Processed prompts:)"
    r"|(?P<load>^Load weight begin\b)"
    r"|(?P<capture>^Capturing (?:CUDA graphs?|cudagraphs|the model for CUDA graphs)|^Capture cuda graph begin"
    r"|^Graph capturing finished|Capture cuda graph failed|during (?:CUDA )?graph capture)"
    r"|(?P<compile>^Compiling a graph|^Dynamo bytecode transform|^torch\.compile takes|^Compiling model)"
    r"|(?P<warm>warming up (?:the )?sampler|^init engine \(profile, create kv cache, warmup model\) took)"
    r"|(?P<profile>^Memory profiling takes|^Available KV cache memory|^GPU KV cache size|^# GPU blocks"
    r"|^the current vLLM instance can use|^Memory pool end|^Load weight end)"
)
# Cheap first test for _LIFECYCLE: each of its alternatives contains one of these.
_LIFECYCLE_WORDS = ("Uvicorn", "startup complete", "throughput", "API server", "request", "HTTP/1",
                    "aptur", "ompil", "Dynamo", "warm", "profiling", "KV cache", "GPU blocks",
                    "instance can use", "Memory pool end", "Load weight", "fired up", "Processed prompts")


# The host's restart supervisor's line that begins attempt 2, 3, … (remote/run/restartpolicy.py STARTS).
_ATTEMPT = re.compile(r"^\[eagle3-tui\] attempt \d+/\d+ starts")


def step(analysis: LogAnalysis, line: str, line_no: int, t: float | None = None) -> LogAnalysis:
    """Fold one assembled line (see ``split_lines``) into ``analysis``.

    ``line_no`` is 1-based; ``t`` is the caller's arrival time for the line (used for
    stall detection and phase durations where the log has no timestamps). Returns
    ``analysis`` itself when the line changes nothing.
    """
    if line.startswith("[eagle3-tui] attempt "):  # the host's restart supervisor's own line
        if _ATTEMPT.match(line):  # the run restarted (remote/run/restart.py): the attempt starts afresh
            return LogAnalysis(signatures=analysis.signatures, phase_t=t)
        return analysis  # it quotes causes by title: never a failure of its own
    pre = split_prefix(line)
    b = Builder(analysis, t, log_seconds(pre.timestamp))
    _fold(b, pre, line, line_no, t)
    phase = b.get("phase")
    if phase != analysis.phase and phase != "failed":
        b.set("phase_t", t)
        b.set("phase_ts", b.ts)
        if PHASE_RANK[phase] > PHASE_RANK["loaded"] and b.get("stage") is not None:
            b.set("stage", None)
    return b.result()


def _diverge(b: Builder, pre: LinePrefix, line: str, line_no: int) -> None:
    """The divergence check (remote/run/diverge.py, the one the host's pace runs): its
    verdict is a failure of the table's signature of that id, quoting the line where the
    divergence began; a table without that id (the user's choice) leaves it unsaid. As on
    the host (remote/run/restartpolicy.py), a divergence after a catch-all or wrapper
    failure is the cause: the run lived on after that line, and it is the divergence the
    host's watch acts on; after a specific failure it stays a consequence."""
    tp = b.get("train")
    before = tp.div if tp is not None else _NO_DIV
    after = diverge.fold(before, line, line_no)
    if after is before:
        return
    b.set("train", replace(tp or TrainProgress(), div=after))
    root = b.get("root_cause")
    if after.verdict is not None and (b.get("phase") != "failed" or (root is not None and root.rank > 0)):
        sid, _, first_no, first = after.verdict
        sigs = b.get("signatures") or default_signatures()
        sig = sigs.by_id(sid)
        if sig is not None:
            if b.get("phase") in _BEFORE_TRAINING:  # a loss, a loss scale: only a training run has them
                b.set("phase", "training")
            b.failure(sig, sig.search(first), first, first_no, pre.worker)


def _nan_loss(b: Builder, line_no: int) -> None:
    """A line whose loss the divergence check read as non-finite in a spelling the
    training parser does not know ("[Loss] nan", a tensor repr, "Loss is nan"): the
    latest loss is NaN."""
    tp = b.get("train")
    if tp is None or tp.div.loss_bad_at != line_no or (tp.loss is not None and math.isnan(tp.loss)):
        return
    losses = (tp.losses + (math.nan,))[-MAX_LOSSES:]
    b.set("train", replace(tp, loss=math.nan, losses=losses))


_NO_DIV = diverge.State()


def _fold(b: Builder, pre: LinePrefix, line: str, line_no: int, t: float | None) -> None:
    _diverge(b, pre, line, line_no)
    msg = pre.message
    key = pre.worker or ""
    if "%" in msg:
        sp = parse_shard_progress(pre)
        if sp is not None and not _SAVING_BAR.search(sp.desc):  # a save's shards are no load
            _on_shard(b, sp, line_no, t)
            return
    if "[extract] " in msg:
        ep = parse_extract_progress(msg)
        if ep is not None:
            _on_extract(b, ep, line_no)
            return
    tl = parse_train_line(msg)
    if tl is None or tl.loss is None:
        _nan_loss(b, line_no)
    if tl is not None:
        _on_train(b, tl, pre, line, line_no, t)
    elif msg[:1].isspace() and is_save_frame(msg) and b.get("phase") != "failed":
        b.set("phase", "saving")  # a traceback through a checkpoint save: it failed saving
    elif msg[:1].isspace() and is_train_frame(msg):  # a traceback through the training loop:
        if b.get("phase") in _BEFORE_TRAINING:  # it got that far
            b.set("phase", "training")
        elif b.get("phase") == "failed" and b.get("failed_in") in _BEFORE_TRAINING:
            b.set("failed_in", "training")  # the failure (a watchdog) came before its traceback
    if "took" in msg or " is " in msg or "Using" in msg or "Resolved" in msg or "Starting" in msg:
        mm = _MILESTONES.search(msg)
        if mm:
            kind, label = _milestone_label(mm)
            b.milestone(kind, line_no, label)
            if kind in ("start",):
                b.set("phase", advance(b.get("phase"), "loading"))
            elif kind in ("weights", "loaded") and not _loading_elsewhere(b, pre.worker):
                b.loaded(line_no)
            return
    lm = _LIFECYCLE.search(msg) if any(k in msg for k in _LIFECYCLE_WORDS) else None
    if lm:
        if lm.group("serving"):
            if b.get("phase") != "failed":
                b.set("phase", advance(b.get("phase"), "serving"))
            b.milestone("serving", line_no, "Serving requests")
        elif lm.group("load"):  # SGLang's loader starting (vLLM says "Starting to load model")
            b.set("phase", advance(b.get("phase"), "loading"))
            b.milestone("start", line_no, "Loading weights")
        else:
            kind = str(lm.lastgroup)
            b.stage(kind, line_no)
            b.milestone("stage:" + kind, line_no, f"Engine {STAGES[kind]}")
    if pre.level in QUIET_LEVELS:
        if "SIG" in msg or "signal" in msg:  # "received SIGTERM" at INFO: the run is being stopped
            note_interrupt(b, msg, line_no)
        return
    if pre.level is None and retry_note(msg):  # "INFO:x:… retried after: <an error>": handled
        return
    if pre.source is not None and REQUEST_SOURCE.search(pre.source):
        request_error(b, pre.worker, msg, line, line_no)
        return
    find_failures(b, pre.worker, key, msg, line, line_no)


_TRAIN_PHASES = ("training", "evaluating", "saving")
_SAVING_BAR = re.compile(r"(?i)\b(?:sav|writ)ing\b")
_BEFORE_TRAINING = ("starting", "loading", "loaded")


def _on_train(b: Builder, tl: TrainLine, pre: LinePrefix, line: str, line_no: int, t: float | None) -> None:
    """A training bar, metrics line or phase line: progress, loss, phase; a loss or grad
    norm that stays non-finite for a signature's ``persist`` lines is a failure."""
    old = b.get("train")
    tl = second_bar(old, tl)
    tp = merge(old, tl, line_no, line)
    if t is not None and tl.progress and tl.rate is None:
        tp = arrival_rate(tp, t)
    if tp is not old:
        b.set("train", tp)
    if tl.progress and t is not None and (old is None or tp.step != old.step or tp.lines != old.lines):
        b.set("last_progress_t", t)
    phase = b.get("phase")
    to = "evaluating" if tl.evaluating else tl.phase or ("training" if tl.progress else None)
    if to == "training" and not tl.phase and in_evaluation(tp.eval_open, tp.step) and "poch" in (tl.desc or ""):
        to = "evaluating"  # Lightning's epoch bar redrawn while its validation bar moves
    if to == "training" and tl.phase and phase == "saving" and tp.epochs and tp.epochs_done == tp.epochs:
        to = "finished"  # the last epoch's checkpoint is saved
    if to is not None and phase != "failed" and (phase != "finished" or to != "training"):
        if phase != to:
            b.set("phase", to)
            if old is None or old.step is None:
                b.milestone("train-start", line_no, "Training started")
        if to == "finished":
            b.milestone("train-done", line_no, "Training finished")


def _loading_elsewhere(b: Builder, worker: str | None) -> bool:
    """A worker's "weights took" line does not end the load while another worker's
    target bar is still short of its total (old Ray/V0 logs print both)."""
    if worker is None:
        return False
    return any(not sp.complete and (sp.worker or "") != worker for sp in b.get("shards").values())


def _on_shard(b: Builder, sp: ShardProgress, line_no: int, t: float | None) -> None:
    """A shard bar redraw: the target model's bars update progress, phase and timing;
    any other loader's bar (a drafter's, a ``pt`` checkpoint's, a re-read of the same
    checkpoint after the load finished) is kept apart in ``loads``."""
    wkey = sp.worker or ""
    target = b.get("_target_desc")
    if target is None:
        target = sp.desc
        b.set("_target_desc", target)
    shards = dict(b.get("shards"))
    prev = shards.get(wkey)
    restarted = prev is not None and prev.complete and sp.done < prev.done
    done_before = bool(shards) and all(s.complete for s in shards.values()) and prev is None
    if sp.desc != target or restarted or done_before or f"re:{wkey}" in b.get("_seen"):
        if restarted:
            b.set("_seen", b.get("_seen") | {f"re:{wkey}"})
        loads = dict(b.get("loads"))
        lkey = f"{sp.desc} [{wkey}]" if wkey else sp.desc
        if lkey not in loads and len(loads) >= MAX_LOADS:
            del loads[next(iter(loads))]
        loads[lkey] = sp
        b.set("loads", loads)
        b.milestone("load:" + lkey, line_no, f"{sp.desc}: {sp.total} (another loader)")
        if not shards:
            b.set("phase", advance(b.get("phase"), "loading"))
        return
    if prev is None and len(shards) >= MAX_WORKERS:
        del shards[next(iter(shards))]  # bounded even for a log with endless worker names
    shards[wkey] = sp
    b.set("shards", shards)
    overall = min(shards.values(), key=lambda s: (s.percent, s.done))
    old = b.get("shard")
    b.set("shard", overall)
    if prev is None:
        b.milestone("shards:" + sp.desc, line_no, f"{sp.desc}: {sp.total} shards")
    if t is not None and (old is None or overall.done > old.done or overall.desc != old.desc):
        b.set("last_progress_t", t)
        if old is not None and overall.done > old.done:
            b.set("shard_times", (b.get("shard_times") + (t,))[-MAX_TIMES:])
    if overall.complete:
        b.milestone("shards-done:" + sp.desc, line_no, f"All {sp.total} shards loaded")
        b.loaded(line_no)
    else:
        b.set("phase", advance(b.get("phase"), "loading"))


def _on_extract(b: Builder, ep: ExtractProgress, line_no: int) -> None:
    """An extractor progress line. Its counts are authoritative, even after a failure."""
    prev = b.get("extract")
    if ep.skipped and prev is not None:
        ep = replace(prev, batch=ep.batch, batches=ep.batches, skipped=True)
    elif ep.done and prev is not None:
        ep = replace(ep, batch=prev.batches, batches=prev.batches)
    b.set("extract", ep)
    if ep.done:
        b.milestone("extract-done", line_no, f"Extraction finished: {ep.seqs} sequences, {ep.tokens} tokens")
        b.set("phase", "finished")
    else:
        b.milestone("extract-start", line_no, f"Extraction started: {ep.batches} batches")
        phase = b.get("phase")
        b.set("phase", "extracting" if phase in ("failed", "finished") else advance(phase, "extracting"))


def is_stalled(analysis: LogAnalysis, now: float, k: float = 3.0, min_s: float = 60.0) -> bool:
    """True while loading when no shard finished for ``k`` × the median shard interval.

    Needs the arrival times passed to ``step`` as ``t``. With fewer than two recorded
    shard completions the bar's own rate stands in for the median. Never less than
    ``min_s`` seconds, so a fast load is not flagged by noise.
    """
    if analysis.phase != "loading" or analysis.last_progress_t is None:
        return False
    times = analysis.shard_times
    if len(times) >= 3:
        expected = statistics.median(b - a for a, b in itertools.pairwise(times))
    elif analysis.shard is not None and analysis.shard.rate_it_s:
        expected = 1.0 / analysis.shard.rate_it_s
    else:
        return False
    return now - analysis.last_progress_t > max(k * expected, min_s)

