"""Log analysis as a pure fold: ``analysis = step(analysis, line, line_no, t)``.

``step`` is cheap and linear: it looks at one line (at most ``MAX_SCAN`` characters of
it), keeps bounded lists, never re-scans history, and returns the *same* object when
a line changes nothing (most lines). It never raises on odd input.

What it tracks: the run's phase, the latest shard-loading bar per worker, the
extractor's progress, milestones, recognised failures and the root cause.
"stalled" and "killed" need wall-clock and GPU information, so the caller decides
them (``is_stalled`` helps with the first).

This module also re-exports the line-level API so callers need one import.
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from tui.state.lines import collapse_cr, finish_lines, live_segment, split_lines, strip_ansi
from tui.state.logline import (
    ExtractProgress,
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

PHASES = ("starting", "loading", "loaded", "extracting", "finished", "failed")
_RANK = {"starting": 0, "loading": 1, "loaded": 2, "extracting": 3, "finished": 4}
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
    signatures: SignatureSet | None = field(default=None, compare=False, repr=False)
    # open tracebacks, by worker key: (first line_no, a specific signature matched)
    _tracebacks: Mapping[str, tuple[int, bool]] = field(default_factory=dict, hash=False, repr=False)
    _seen: frozenset[str] = frozenset()  # milestone kinds and failure keys already recorded


# Milestones: one regex, one named group per kind; each kind is recorded once.
_MILESTONES = re.compile(
    r"(?P<start>Starting to load model (?P<model>\S+?)(?:\.\.\.)?$)"
    r"|(?P<weights>Loading weights took (?P<wsec>[\d.]+) seconds)"
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
    labels = {
        "start": lambda: f"Starting to load model {m['model']}",
        "weights": lambda: f"Weights loaded in {float(m['wsec']):.1f} s",
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
_TB_START = "Traceback (most recent call last)"


def _advance(phase: str, to: str) -> str:
    """Move forward only; "failed" is left only by the extractor's own progress."""
    if phase == "failed":
        return phase
    return to if _RANK[to] > _RANK[phase] else phase


class _Builder:
    """Collects the changes one line makes, then applies them with one ``replace``."""

    def __init__(self, a: LogAnalysis) -> None:
        self.a = a
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

    def failure(self, sig: Signature, m: re.Match[str] | None, line: str, line_no: int,
                worker: str | None) -> None:
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
        self.set("phase", "failed")
        root = self.get("root_cause")
        if root is None or f.rank < root.rank:
            self.set("root_cause", f)
        seen = self.get("_seen")
        key = f"f:{f.id}:{worker}"
        if key in seen or len(self.get("failures")) >= MAX_FAILURES:
            return
        self.set("_seen", seen | {key})
        self.set("failures", self.get("failures") + (f,))

    def result(self) -> LogAnalysis:
        return replace(self.a, **self.changes) if self.changes else self.a


def step(analysis: LogAnalysis, line: str, line_no: int, t: float | None = None) -> LogAnalysis:
    """Fold one assembled line (see ``split_lines``) into ``analysis``.

    ``line_no`` is 1-based; ``t`` is the caller's arrival time for the line (used only
    for stall detection). Returns ``analysis`` itself when the line changes nothing.
    """
    b = _Builder(analysis)
    pre = split_prefix(line)
    msg = pre.message
    key = pre.worker or ""

    if "%" in msg:
        sp = parse_shard_progress(pre)
        if sp is not None:
            _on_shard(b, sp, line_no, t)
            return b.result()
    if "[extract] " in msg:
        ep = parse_extract_progress(msg)
        if ep is not None:
            _on_extract(b, ep, line_no)
            return b.result()
    if "took" in msg or " is " in msg or "Using" in msg or "Resolved" in msg or "Starting" in msg:
        mm = _MILESTONES.search(msg)
        if mm:
            kind, label = _milestone_label(mm)
            b.milestone(kind, line_no, label)
            if kind in ("start",):
                b.set("phase", _advance(b.get("phase"), "loading"))
            elif kind in ("weights", "loaded"):
                b.loaded(line_no)
            return b.result()

    if pre.level in _QUIET:
        return b.result()
    _failures(b, pre.worker, key, msg, line, line_no)
    return b.result()


def _on_shard(b: _Builder, sp: ShardProgress, line_no: int, t: float | None) -> None:
    """A shard bar redraw: update per-worker and overall progress, phase, timing."""
    wkey = sp.worker or ""
    shards = dict(b.get("shards"))
    prev = shards.get(wkey)
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


def _failures(b: _Builder, worker: str | None, key: str, msg: str, line: str, line_no: int) -> None:
    """Failure signatures and Python tracebacks (tracked per worker, since they interleave)."""
    sigs = b.get("signatures") or default_signatures()
    tbs = b.get("_tracebacks")
    if msg.startswith(_TB_START):
        b.set("_tracebacks", {**tbs, key: (line_no, False)})
        return
    open_tb = tbs.get(key)
    if open_tb is not None and line_no - open_tb[0] > MAX_TB_LINES:
        b.set("_tracebacks", {k: v for k, v in tbs.items() if k != key})
        open_tb = None
    hit = sigs.match(msg)
    if open_tb is None:
        if hit:
            b.failure(hit[0], hit[1], line, line_no, worker)
        return
    continuation = not msg or msg[0].isspace() or msg.startswith(("During handling", "The above"))
    if continuation or not _EXC_LINE.match(msg):
        # a frame or source line, or a foreign line in between: the traceback goes on
        if hit:
            b.failure(hit[0], hit[1], line, line_no, worker)
            if not open_tb[1]:
                b.set("_tracebacks", {**tbs, key: (open_tb[0], True)})
        return
    # the exception line ends this traceback
    if hit:
        b.failure(hit[0], hit[1], line, line_no, worker)
    elif not open_tb[1] and sigs.generic is not None:
        b.failure(sigs.generic, None, line, line_no, worker)
    b.set("_tracebacks", {k: v for k, v in tbs.items() if k != key})


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
