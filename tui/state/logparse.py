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

This module also re-exports the line-level API so callers need one import.
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from tui.state.lines import collapse_cr, finish_lines, live_segment, split_lines, strip_ansi
from tui.state.logline import (
    ExtractProgress,
    LinePrefix,
    ShardProgress,
    parse_extract_progress,
    parse_shard_progress,
    split_prefix,
)
from tui.state.signatures import Signature, SignatureSet, load_signatures

__all__ = [
    "ExtractProgress",
    "Failure",
    "LogAnalysis",
    "ShardProgress",
    "collapse_cr",
    "default_signatures",
    "finish_lines",
    "format_span",
    "is_stalled",
    "live_segment",
    "parse_extract_progress",
    "parse_shard_progress",
    "signature_errors",
    "split_lines",
    "step",
    "strip_ansi",
]

MAX_FAILURES = 200
MAX_MILESTONES = 200
MAX_WORKERS = 64  # shard bars tracked per worker
MAX_TIMES = 64  # shard completion times kept for the stall median
MAX_TB_LINES = 2000  # a traceback still open after this many lines is dropped
LINE_KEEP = 500  # characters of a failure's line kept in the record

MAX_LOADS = 16  # other loaders' bars kept
CHAIN_GAP = 50  # lines between an exception line and the next link of its chain

PHASES = ("starting", "loading", "loaded", "serving", "extracting", "finished", "failed")
_RANK = {"starting": 0, "loading": 1, "loaded": 2, "serving": 3, "extracting": 4, "finished": 5}
_QUIET = frozenset({"DEBUG", "INFO", "WARNING"})  # never failures at these levels


@dataclass(frozen=True)
class Failure:
    """A recognised failure at one line of the log."""

    id: str
    title: str
    explanation: str
    fix: Any = field(hash=False)  # str, or dict like {"patch": "…", "version": "v4"}
    line_no: int
    line: str
    worker: str | None = None
    wrapper: bool = False
    generic: bool = False
    after_load: bool | None = None

    @property
    def rank(self) -> int:
        """Root-cause preference: specific (0) before the catch-all (1) before wrappers (2)."""
        return 2 if self.wrapper else 1 if self.generic else 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (used by ``eagle3-tui inspect --json``)."""
        return {
            "id": self.id,
            "title": self.title,
            "explanation": self.explanation,
            "fix": self.fix,
            "line_no": self.line_no,
            "line": self.line,
            "worker": self.worker,
            "wrapper": self.wrapper,
            "after_load": self.after_load,
        }


@lru_cache(maxsize=1)
def default_signatures() -> SignatureSet:
    """Built-in signatures merged with the user's file (a broken user file is skipped)."""
    errors: list[str] = []
    sigs = load_signatures(errors=errors)
    _SIGNATURE_ERRORS[:] = errors
    return SignatureSet.build(sigs)


_SIGNATURE_ERRORS: list[str] = []


def signature_errors() -> list[str]:
    """One-line messages for user signature files that were skipped as malformed."""
    default_signatures()
    return list(_SIGNATURE_ERRORS)


@dataclass(frozen=True)
class LogAnalysis:
    """Everything learned from the lines folded in so far."""

    phase: str = "starting"
    shards: Mapping[str, ShardProgress] = field(default_factory=dict, hash=False)  # by worker
    shard: ShardProgress | None = None  # overall: the slowest worker's latest bar
    extract: ExtractProgress | None = None
    milestones: tuple[tuple[int, str], ...] = ()
    failures: tuple[Failure, ...] = ()
    root_cause: Failure | None = None
    loaded_at_line: int | None = None
    shard_times: tuple[float, ...] = ()  # arrival times of shard completions (if t given)
    last_progress_t: float | None = None
    stage: str | None = None  # after the load: "profiling", "compiling", "graph capture", "warm-up"
    loads: Mapping[str, ShardProgress] = field(default_factory=dict, hash=False)  # other loaders' bars
    failed_in: str | None = None  # the phase the run was in when it failed
    failed_stage: str | None = None  # and its stage, if any
    failed_after_s: float | None = None  # how long it had been in that phase
    phase_t: float | None = None  # arrival time (``t``) the current phase began
    phase_ts: float | None = None  # log timestamp (s into the year) the current phase began
    signatures: SignatureSet | None = field(default=None, compare=False, repr=False)
    # open tracebacks, by worker key: (first line_no, a specific signature matched,
    # line_no of the failure recorded from one of its frames or None)
    _tracebacks: Mapping[str, tuple[int, bool, int | None]] = field(default_factory=dict, hash=False, repr=False)
    # exception chains after an exception line, by worker key: (last line_no, failure line_no)
    _chains: Mapping[str, tuple[int, int | None]] = field(default_factory=dict, hash=False, repr=False)
    _target_desc: str | None = None  # the first loader's bar is the target model's
    _seen: frozenset[str] = frozenset()  # milestone kinds and failure keys already recorded

    def failure_summary(self) -> str | None:
        """ "died while serving after 2 h 14 m", or None while nothing failed."""
        if self.root_cause is None:
            return None
        where = {"starting": "while starting", "loading": "while loading", "loaded": "after loading",
                 "serving": "while serving", "extracting": "while extracting",
                 "finished": "after finishing"}.get(self.failed_in or "", "")
        if self.failed_stage:
            where = f"during {self.failed_stage}"
        if self.failed_in == "loading" and self.shard is not None:
            where += f" (shard {self.shard.done}/{self.shard.total})"
        after = f" after {format_span(self.failed_after_s)}" if self.failed_after_s is not None else ""
        return f"died {where}{after}".replace("died  ", "died ").strip()


def format_span(seconds: float) -> str:
    """ "2 h 14 m", "14 m", "42 s"."""
    s = max(0, int(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60} m"
    if s >= 60:
        return f"{s // 60} m"
    return f"{s} s"


# Milestones: one regex, one named group per kind; each kind is recorded once.
_MILESTONES = re.compile(
    r"(?P<start>Starting to load model (?P<model>\S+?)(?:\.\.\.)?$)"
    r"|(?P<weights>Loading (?:model )?weights took (?P<wsec>[\d.]+) (?P<wunit>seconds|GB|GiB))"
    r"|(?P<loaded>Model loading took (?P<gib>[\d.]+) Gi?B(?: memory)? and (?P<lsec>[\d.]+) seconds)"
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


_EXC_LINE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?::\s.*|:)?$")
# A raised exception's line, wherever it stands: "RuntimeError: …",
# "ray.exceptions.RayTaskError(ActorDiedError): …", "AssertionError", "Exception: …".
# Names ending in "Warning" are not exceptions being raised.
_EXC_SHAPE = re.compile(
    r"(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Failure|Timeout)|Exception)"
    r"(?:\([\w.]*\))?(?::(?:\s|$)|$)"
)
_TB_START = "Traceback (most recent call last)"
# Log lines of an API request handler: their errors are the request's (answered with a
# 4xx/5xx while the server keeps serving), unless they say the engine itself is dead.
_REQUEST_SOURCE = re.compile(r"(?:^|/)(?:serving\w*|api_router)\.py:")
# Lifecycle evidence: the server is up and requests flow, or the engine is past the load.
_LIFECYCLE = re.compile(
    r"(?P<serving>Uvicorn running on|Application startup complete|Avg prompt throughput"
    r"|Starting vLLM API server|Received request|Added request|\"(?:GET|POST) /\S* HTTP/1\.[01]\" \d{3}"
    r"|The server is fired up and ready to roll)"
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
                    "instance can use", "Memory pool end", "Load weight end", "fired up")
# Frames that only run after the load: where a traceback was when the run died.
_STAGE_FRAME = re.compile(
    r'^\s+File ".*", line \d+, in (?:(?P<capture>capture_model|capture_one_batch_size|capture_end|capture)'
    r"|(?P<warm>_dummy_sampler_run|compile_or_warm_up_model|warm_up_model|_warmup\w*)"
    r"|(?P<profile>profile_run|determine_available_memory|_initialize_kv_caches|determine_num_available_blocks))$"
)
_STAGES = {"capture": "graph capture", "compile": "compiling", "warm": "warm-up", "profile": "profiling"}
_TS = re.compile(r"(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")
_MONTH_DAYS = (0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334)


def _log_seconds(stamp: str | None) -> float | None:
    """Seconds into the year of vLLM's "MM-DD HH:MM:SS" (it prints no year)."""
    m = _TS.fullmatch(stamp) if stamp else None
    if not m:
        return None
    mo, d, h, mi, sec = (int(g) for g in m.groups())
    if not 1 <= mo <= 12:
        return None
    return float((((_MONTH_DAYS[mo - 1] + d - 1) * 24 + h) * 60 + mi) * 60 + sec)


def _advance(phase: str, to: str) -> str:
    """Move forward only; "failed" is left only by the extractor's own progress."""
    if phase == "failed":
        return phase
    return to if _RANK[to] > _RANK[phase] else phase


class _Builder:
    """Collects the changes one line makes, then applies them with one ``replace``."""

    def __init__(self, a: LogAnalysis, t: float | None, ts: float | None) -> None:
        self.a = a
        self.t = t
        self.ts = ts
        self.changes: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        return self.changes.get(name, getattr(self.a, name))

    def set(self, name: str, value: Any) -> None:
        if name in self.changes or getattr(self.a, name) is not value:
            self.changes[name] = value

    def milestone(self, kind: str, line_no: int, label: str) -> None:
        seen = self.get("_seen")
        key = "m:" + kind
        if key in seen or len(self.get("milestones")) >= MAX_MILESTONES:
            return
        self.set("_seen", seen | {key})
        self.set("milestones", self.get("milestones") + ((line_no, label),))

    def loaded(self, line_no: int) -> None:
        if self.get("loaded_at_line") is None:
            self.set("loaded_at_line", line_no)
        self.set("phase", _advance(self.get("phase"), "loaded"))

    def stage(self, kind: str, line_no: int) -> None:
        """Evidence of a post-load stage: the weights are loaded, whatever the bars say."""
        name = _STAGES[kind]
        if self.get("phase") == "failed":
            if _RANK.get(self.get("failed_in") or "", 9) <= _RANK["loaded"]:
                self.set("failed_in", "loaded")  # the run got that far before it died
                if self.get("failed_stage") is None:
                    self.set("failed_stage", name)
            return
        if _RANK[self.get("phase")] <= _RANK["loaded"]:
            self.loaded(line_no)
            if self.get("stage") != name:
                self.set("stage", name)

    def failure(self, sig: Signature, m: re.Match[str] | None, line: str, line_no: int,
                worker: str | None) -> Failure:
        f = Failure(
            id=sig.id,
            title=sig.render_title(m),
            explanation=sig.explanation,
            fix=sig.fix,
            line_no=line_no,
            line=line[:LINE_KEEP],
            worker=worker,
            wrapper=sig.wrapper,
            generic=sig.generic,
            after_load=sig.after_load,
        )
        phase = self.get("phase")
        if phase != "failed":
            if sig.serving_fatal:
                phase = _advance(phase, "serving")
            self.set("failed_in", phase)
            self.set("failed_stage", self.get("stage") if phase == "loaded" else None)
            self.set("failed_after_s", self._since())
        self.set("phase", "failed")
        root = self.get("root_cause")
        if root is None or f.rank < root.rank:
            self.set("root_cause", f)
        seen = self.get("_seen")
        key = f"f:{f.id}:{worker}"
        if key in seen or len(self.get("failures")) >= MAX_FAILURES:
            return f
        self.set("_seen", seen | {key})
        self.set("failures", self.get("failures") + (f,))
        return f

    def _since(self) -> float | None:
        ts0, t0 = self.get("phase_ts"), self.get("phase_t")
        if ts0 is not None and self.ts is not None and self.ts >= ts0:
            return float(self.ts - ts0)
        if t0 is not None and self.t is not None:
            return max(0.0, float(self.t - t0))
        return None

    def requote(self, old_line_no: int, line: str, line_no: int, better: Failure | None = None) -> None:
        """The failure first seen at ``old_line_no`` (a frame or source line) is quoted by
        the exception line that was raised; ``better`` replaces it when it ranks higher."""
        def fix(f: Failure) -> Failure:
            if better is not None and better.rank < f.rank:
                return replace(better, line_no=line_no, line=line[:LINE_KEEP])
            return replace(f, line_no=line_no, line=line[:LINE_KEEP])

        fails = self.get("failures")
        self.set("failures", tuple(fix(f) if f.line_no == old_line_no else f for f in fails))
        root = self.get("root_cause")
        if root is not None and root.line_no == old_line_no:
            self.set("root_cause", fix(root))

    def chain_link(self, prev_line_no: int | None, f: Failure) -> None:
        """A later exception of the same chain: it is the raised one, so it becomes the root
        cause in place of the chain's earlier exception, unless it ranks lower."""
        root = self.get("root_cause")
        if prev_line_no is not None and root is not None and root.line_no == prev_line_no and f.rank <= root.rank:
            self.set("root_cause", f)

    def result(self) -> LogAnalysis:
        return replace(self.a, **self.changes) if self.changes else self.a


def step(analysis: LogAnalysis, line: str, line_no: int, t: float | None = None) -> LogAnalysis:
    """Fold one assembled line (see ``split_lines``) into ``analysis``.

    ``line_no`` is 1-based; ``t`` is the caller's arrival time for the line (used for
    stall detection and phase durations where the log has no timestamps). Returns
    ``analysis`` itself when the line changes nothing.
    """
    pre = split_prefix(line)
    b = _Builder(analysis, t, _log_seconds(pre.timestamp))
    _fold(b, pre, line, line_no, t)
    phase = b.get("phase")
    if phase != analysis.phase and phase != "failed":
        b.set("phase_t", t)
        b.set("phase_ts", b.ts)
        if _RANK[phase] > _RANK["loaded"] and b.get("stage") is not None:
            b.set("stage", None)
    return b.result()


def _fold(b: _Builder, pre: LinePrefix, line: str, line_no: int, t: float | None) -> None:
    msg = pre.message
    key = pre.worker or ""
    if "%" in msg:
        sp = parse_shard_progress(pre)
        if sp is not None:
            _on_shard(b, sp, line_no, t)
            return
    if "[extract] " in msg:
        ep = parse_extract_progress(msg)
        if ep is not None:
            _on_extract(b, ep, line_no)
            return
    if "took" in msg or " is " in msg or "Using" in msg or "Resolved" in msg or "Starting" in msg:
        mm = _MILESTONES.search(msg)
        if mm:
            kind, label = _milestone_label(mm)
            b.milestone(kind, line_no, label)
            if kind in ("start",):
                b.set("phase", _advance(b.get("phase"), "loading"))
            elif kind in ("weights", "loaded") and not _loading_elsewhere(b, pre.worker):
                b.loaded(line_no)
            return
    lm = _LIFECYCLE.search(msg) if any(k in msg for k in _LIFECYCLE_WORDS) else None
    if lm:
        if lm.group("serving"):
            if b.get("phase") != "failed":
                b.set("phase", _advance(b.get("phase"), "serving"))
            b.milestone("serving", line_no, "Serving requests")
        else:
            kind = str(lm.lastgroup)
            b.stage(kind, line_no)
            b.milestone("stage:" + kind, line_no, f"Engine {_STAGES[kind]}")
    if pre.level in _QUIET:
        return
    if pre.source is not None and _REQUEST_SOURCE.search(pre.source):
        _request_error(b, pre.worker, msg, line, line_no)
        return
    _failures(b, pre.worker, key, msg, line, line_no)


def _loading_elsewhere(b: _Builder, worker: str | None) -> bool:
    """A worker's "weights took" line does not end the load while another worker's
    target bar is still short of its total (old Ray/V0 logs print both)."""
    if worker is None:
        return False
    return any(not sp.complete and (sp.worker or "") != worker for sp in b.get("shards").values())


def _on_shard(b: _Builder, sp: ShardProgress, line_no: int, t: float | None) -> None:
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
            b.set("phase", _advance(b.get("phase"), "loading"))
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
        b.set("phase", _advance(b.get("phase"), "loading"))


def _on_extract(b: _Builder, ep: ExtractProgress, line_no: int) -> None:
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
        b.set("phase", "extracting" if phase in ("failed", "finished") else _advance(phase, "extracting"))


def _request_error(b: _Builder, worker: str | None, msg: str, line: str, line_no: int) -> None:
    """An API request handler logged an error: requests flow, so the run is serving. The
    request's own error (a 400 for a too-long prompt, a bad argument) is not the run's
    failure; an engine that is dead is."""
    if b.get("phase") != "failed":
        b.set("phase", _advance(b.get("phase"), "serving"))
    sigs = b.get("signatures") or default_signatures()
    hit = sigs.match(msg)
    if hit and hit[0].serving_fatal and _EXC_SHAPE.match(msg):
        b.failure(hit[0], hit[1], line, line_no, worker)


def _failures(b: _Builder, worker: str | None, key: str, msg: str, line: str, line_no: int) -> None:
    """Failure signatures, Python tracebacks and bare exception lines (tracked per
    worker, since they interleave). The quoted line is the exception that was raised."""
    sigs = b.get("signatures") or default_signatures()
    tbs = b.get("_tracebacks")
    chains = b.get("_chains")
    at = msg.find(_TB_START)
    if at >= 0 and (at == 0 or msg[:at].rstrip().endswith(":")):
        # "Traceback (most recent call last):", or "Scheduler hit an exception: Traceback …"
        head = msg[:at]
        hit = sigs.match(head) if head.strip() else None
        fail_at = b.failure(hit[0], hit[1], line, line_no, worker).line_no if hit else None
        b.set("_tracebacks", {**tbs, key: (line_no, False, fail_at)})
        if key in chains:
            b.set("_chains", {k: v for k, v in chains.items() if k != key})
        return
    open_tb = tbs.get(key)
    if open_tb is not None and line_no - open_tb[0] > MAX_TB_LINES:
        b.set("_tracebacks", {k: v for k, v in tbs.items() if k != key})
        open_tb = None
    chain = chains.get(key)
    if chain is not None and (open_tb is not None or line_no - chain[0] > CHAIN_GAP):
        chains = {k: v for k, v in chains.items() if k != key}
        b.set("_chains", chains)
        chain = None
    continuation = not msg or msg[0].isspace() or msg.startswith(("During handling", "The above"))
    hit = sigs.match(msg)
    if continuation:
        sm = _STAGE_FRAME.match(msg)
        if sm:
            b.stage(str(sm.lastgroup), line_no)
    if open_tb is not None:
        if continuation or not _EXC_LINE.match(msg):
            # a frame or source line, or a foreign line in between: the traceback goes on
            if hit:
                f = b.failure(hit[0], hit[1], line, line_no, worker)
                if not open_tb[1]:
                    b.set("_tracebacks", {**tbs, key: (open_tb[0], True, open_tb[2] or f.line_no)})
            return
        # the exception line ends this traceback
        fail_at = open_tb[2]
        if fail_at is not None and (hit is None or not hit[0].generic):
            better = b.failure(hit[0], hit[1], line, line_no, worker) if hit else None
            b.requote(fail_at, line, line_no, better)
            linked = line_no
        elif hit:
            linked = b.failure(hit[0], hit[1], line, line_no, worker).line_no
        elif not open_tb[1] and sigs.generic is not None:
            linked = b.failure(sigs.generic, None, line, line_no, worker).line_no
        else:
            linked = None
        b.set("_tracebacks", {k: v for k, v in tbs.items() if k != key})
        b.set("_chains", {**b.get("_chains"), key: (line_no, linked)})
        return
    if chain is not None and continuation:
        b.set("_chains", {**chains, key: (line_no, chain[1])})
        return
    if continuation and hit:
        # a frame or source line of a traceback whose header is not in the log (an
        # excerpt, or a process that logs only the end): the exception line will quote it
        f = b.failure(hit[0], hit[1], line, line_no, worker)
        b.set("_tracebacks", {**tbs, key: (line_no, True, f.line_no)})
        return
    exc = _EXC_SHAPE.match(msg)
    if exc:
        sig, m = hit if hit else (sigs.generic, None)
        if sig is None:
            return
        f = b.failure(sig, m, line, line_no, worker)
        if chain is not None:
            b.chain_link(chain[1], f)
        b.set("_chains", {**b.get("_chains"), key: (line_no, f.line_no)})
        return
    if chain is not None:
        b.set("_chains", {k: v for k, v in chains.items() if k != key})
    if hit:
        b.failure(hit[0], hit[1], line, line_no, worker)


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
