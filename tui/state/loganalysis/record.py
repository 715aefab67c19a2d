"""The log analysis's record and how one line's changes are applied to it.

``LogAnalysis`` (what the fold has learned), ``Failure`` (one recognised failure),
the built-in signature set, and ``Builder``, which collects the changes one line
makes (phase, stage, milestones, failures, root cause) and applies them with a single
``replace``. The fold itself is ``tui.state.loganalysis.fold.step``; the failure recognition
it calls is ``tui.state.loganalysis.failures``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from tui.state.format import duration
from tui.state.loganalysis.lineshapes import ExtractProgress, ShardProgress
from tui.state.loganalysis.signatures import Signature, SignatureSet, load_signatures
from tui.state.loganalysis.train import TrainProgress

MAX_FAILURES = 200
MAX_MILESTONES = 200
MAX_WORKERS = 64  # shard bars tracked per worker
MAX_TIMES = 64  # shard completion times kept for the stall median
MAX_TB_LINES = 2000  # a traceback still open after this many lines is dropped
LINE_KEEP = 500  # characters of a failure's line kept in the record

MAX_LOADS = 16  # other loaders' bars kept
CHAIN_GAP = 50  # lines between an exception line and the next link of its chain

PHASES = ("starting", "loading", "loaded", "serving", "extracting", "training", "evaluating", "saving",
          "finished", "failed")
# A phase's place in the run's order: the fold only moves a run forward (`advance`).
PHASE_RANK = {"starting": 0, "loading": 1, "loaded": 2, "serving": 3, "extracting": 4, "training": 4,
         "evaluating": 4, "saving": 4, "finished": 5}
QUIET_LEVELS = frozenset({"DEBUG", "INFO", "WARNING"})  # never failures at these levels


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
    train: TrainProgress | None = None  # a training loop's progress and loss (tui.state.loganalysis.train)
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
    # the line where the user's interrupt showed (KeyboardInterrupt, "Aborted!", SIGINT or
    # SIGTERM received): what dies after it dies of it, so it is no root cause
    interrupted_at: int | None = None
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
                 "training": "while training", "evaluating": "while evaluating",
                 "saving": "while saving a checkpoint", "finished": "after finishing"}.get(self.failed_in or "", "")
        if self.failed_stage:
            where = f"during {self.failed_stage}"
        if self.failed_in == "loading" and self.shard is not None:
            where += f" (shard {self.shard.done}/{self.shard.total})"
        if self.failed_in in ("training", "evaluating", "saving") and self.train is not None \
                and self.train.step is not None:
            of = f"/{self.train.total}" if self.train.total else ""
            where += f" (step {self.train.step}{of})"
        after = f" after {duration(int(self.failed_after_s))}" if self.failed_after_s is not None else ""
        return f"died {where}{after}".replace("died  ", "died ").strip()


# The post-load stages a line can show (graph capture, compiling, …), as the screen names them.
STAGES = {"capture": "graph capture", "compile": "compiling", "warm": "warm-up", "profile": "profiling"}
_TS = re.compile(r"(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")
_MONTH_DAYS = (0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334)


def log_seconds(stamp: str | None) -> float | None:
    """Seconds into the year of vLLM's "MM-DD HH:MM:SS" (it prints no year)."""
    m = _TS.fullmatch(stamp) if stamp else None
    if not m:
        return None
    mo, d, h, mi, sec = (int(g) for g in m.groups())
    if not 1 <= mo <= 12:
        return None
    return float((((_MONTH_DAYS[mo - 1] + d - 1) * 24 + h) * 60 + mi) * 60 + sec)


def advance(phase: str, to: str) -> str:
    """Move forward only; "failed" is left only by the extractor's own progress."""
    if phase == "failed":
        return phase
    return to if PHASE_RANK[to] > PHASE_RANK[phase] else phase


class Builder:
    """Collects the changes one line makes, then applies them with one ``replace``.

    The per-line fold (``tui.state.loganalysis.fold.step``) and the failure recognition
    (``tui.state.loganalysis.failures``) both write through it: ``get``/``set`` a field of the
    ``LogAnalysis``, ``milestone``, ``loaded``, ``stage``, ``failure``, ``requote``,
    ``chain_link``; ``result()`` is the new record."""

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
        self.set("phase", advance(self.get("phase"), "loaded"))

    def stage(self, kind: str, line_no: int) -> None:
        """Evidence of a post-load stage: the weights are loaded, whatever the bars say."""
        name = STAGES[kind]
        if self.get("phase") == "failed":
            if PHASE_RANK.get(self.get("failed_in") or "", 9) <= PHASE_RANK["loaded"]:
                self.set("failed_in", "loaded")  # the run got that far before it died
                if self.get("failed_stage") is None:
                    self.set("failed_stage", name)
            return
        if PHASE_RANK[self.get("phase")] <= PHASE_RANK["loaded"]:
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
        if self.get("interrupted_at") is not None and self.get("root_cause") is None:
            return f  # a consequence of the interrupt, not a failure of its own
        phase = self.get("phase")
        if phase != "failed":
            if sig.serving_fatal:
                phase = advance(phase, "serving")
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

