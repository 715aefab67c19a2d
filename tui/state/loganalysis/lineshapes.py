"""Parsers for single log lines: prefixes, shard-loading bars, extractor progress.

All functions take one already-assembled line (see ``tui.state.logbytes``) and never
raise on odd input: anything unrecognised gives ``None``.

Shapes (checked against the vLLM 0.8.2 and 0.16.0 wheels):

- worker prefix, written by vLLM's ``decorate_logs`` at the start of every line:
  ``(Worker_TP0 pid=1234) ``, ``(Worker_DP0_TP0_EP0 pid=…)``, ``(VllmWorker TP3 pid=…)``,
  ``(VllmWorker rank=1 pid=…)``, ``(VllmWorkerProcess pid=…)``, ``(EngineCore_DP0 pid=…)``;
- level prefix ``INFO 11-29 12:00:01 [loader.py:123] `` (``logger.py`` ``_FORMAT``) and the
  bracket-less ``INFO 11-29 12:00:01 loader.py:123] `` seen in older logs;
- vLLM's shard bar ``{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt}
  [{elapsed}<{remaining}, {rate_fmt}]`` (``weight_utils.py`` ``_BAR_FORMAT``) and tqdm's
  default ``{desc}: {pct}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}]``;
- the extractor's own ``[extract] …`` lines (``remote/extract.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "FOREIGN_PREFIX",
    "VLLM_PREFIX",
    "WORKER_PREFIX",
    "ExtractProgress",
    "LinePrefix",
    "ShardProgress",
    "parse_duration",
    "parse_extract_progress",
    "parse_shard_progress",
    "split_prefix",
    "worker_label",
]

# The prefix shapes below are also sent to the host's supervisor as they are
# (tui/services/restartpolicy.py), so a line means the same there as here.

# Longest slice of a line any parser looks at: keeps the per-line cost bounded, so a
# pathological 1 GB line costs the same as a normal one. The host's parsers use the same
# (remote/base/wire.py MAX_SCAN). Within it every pattern is linear: no two quantifiers next to
# each other over the same characters, a number starts where its digit run starts and has
# a bounded number of digits (a longer one is not a count; int() refuses > 4300 digits),
# and no ".*" between two words is searched from every occurrence of the first
# (tests/test_linear_time.py feeds 1 MB adversarial lines to every parser).
MAX_SCAN = 8192

# "(Worker_TP0 pid=1)", "(ServeReplica:app:Deployment pid=2)", "(RayWorkerWrapper pid=3, ip=10.0.0.1)",
# Ray's nameless "(pid=4)"; nested ones ("(EngineCore_DP0 pid=5) (Worker_TP0 pid=6)") keep the innermost.
WORKER_PREFIX = re.compile(
    r"\s*\((?:(?P<name>[A-Za-z][\w:.\-]*(?: [\w=\-]+)?) )?pid=(?P<pid>\d{1,10})(?:, ip=[\w.:\-]+)?\) ?"
)
# What launchers, containers and other loggers put before (or instead of) vLLM's prefix:
# ISO timestamps (bare or in brackets, SGLang's "[2025-03-07 23:50:27 TP0]", or its older
# time-only "[17:39:38 TP3]"), docker
# compose's "vllm-1  | ", Python logging's " - name - LEVEL - ", "[Error]", "(Process)",
# torch's "[rank0]:" and glog's "[W106 12:41:43.88 ProcessGroupNCCL.cpp:1553]".
FOREIGN_PREFIX = re.compile(
    r"(?:\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?Z?(?: [A-Z]{2,3}\d+)*\]?"
    r"|\[\d\d:\d\d:\d\d(?: [A-Z]{2,3}\d+)+\]"  # older SGLang: "[17:39:38 TP3]"
    r"|[\w.\-]+ +\|(?= )"
    r"|- [\w.]+ - (?P<plevel>DEBUG|INFO|WARNING|ERROR|CRITICAL) -"
    r"|\[(?P<blevel>(?i:debug|info|warning|warn|error|critical))\]"
    r"|\([A-Z][a-z]+\)"
    r"|\[rank\d+\]:"
    r"|\u2502"  # a box-drawing border, from a pane copied out of k9s or a TUI
    r"|(?P<slevel>DEBUG|INFO|WARNING|ERROR|CRITICAL)(?: \d+)? \[[\w./\-]{1,200}:\d+\]"
    r"|\[(?P<glog>[IWEF])\d{0,4} [^\]]{1,120}\])"
    r" ?"
)
_LEVELS = {"DEBUG": "DEBUG", "INFO": "INFO", "WARNING": "WARNING", "WARN": "WARNING", "ERROR": "ERROR",
           "CRITICAL": "CRITICAL", "I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
VLLM_PREFIX = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(?P<date>\d\d-\d\d) (?P<time>\d\d:\d\d:\d\d)(?:[.,]\d+)? "
    r"\[?(?P<file>[^\s\]]{1,200}):(?P<lineno>\d+)\] ?"
)


@dataclass(frozen=True)
class LinePrefix:
    """A line split into its vLLM prefixes and the message proper."""

    worker: str | None  # normalised worker label, e.g. "TP0", "rank=1"
    pid: int | None
    level: str | None  # "INFO", "ERROR", … when a vLLM level prefix is present
    timestamp: str | None  # "11-29 12:00:01" (vLLM prints no year)
    source: str | None  # "loader.py:123"
    message: str  # the rest, leading indentation preserved


def worker_label(name: str, pid: int | None = None) -> str:
    """Normalise a vLLM process name: "Worker_TP0" → "TP0", "VllmWorker rank=1" → "rank=1".

    "VllmWorkerProcess" (V0 engine, no rank in the name) becomes "pid=N" so that
    different workers stay apart.
    """
    if name.startswith("VllmWorker "):
        return name[len("VllmWorker ") :]
    if name.startswith("Worker_"):
        return name[len("Worker_") :]
    if name == "VllmWorkerProcess" and pid is not None:
        return f"pid={pid}"
    return name


def split_prefix(line: str) -> LinePrefix:
    """Split the worker prefix and the level/time/source prefix off ``line``.

    Foreign prefixes before them (timestamps, container and logging-module prefixes)
    are dropped too; a level they carry counts when vLLM's own is absent.
    """
    text = line[:MAX_SCAN]
    worker = None
    pid = None
    foreign_level = None
    for _ in range(8):  # a bounded number of stacked prefixes
        m = WORKER_PREFIX.match(text)
        if m:
            pid = int(m.group("pid"))
            worker = worker_label(m.group("name"), pid) if m.group("name") else f"pid={pid}"
            text = text[m.end() :]
            continue
        f = FOREIGN_PREFIX.match(text)
        if f and f.end() > 0 and (worker is None or f.group("plevel") or f.group("blevel") or f.group("glog")
                                  or f.group("slevel") or text[:1] == "["):
            lv = f.group("plevel") or f.group("blevel") or f.group("glog") or f.group("slevel")
            if lv:
                foreign_level = _LEVELS[lv.upper()]
            text = text[f.end() :]
            continue
        break
    lm = VLLM_PREFIX.match(text)
    if not lm:
        return LinePrefix(worker, pid, foreign_level, None, None, text)
    return LinePrefix(
        worker,
        pid,
        lm.group("level"),
        f"{lm.group('date')} {lm.group('time')}",
        f"{lm.group('file')}:{lm.group('lineno')}",
        text[lm.end() :],
    )


def parse_duration(text: str) -> float | None:
    """Seconds in "07:12", "1:02:03", "0:00:04", "2 days, 1:00:00"; None for "?" or junk."""
    text = text.strip()
    days = 0
    m = re.fullmatch(r"(\d{1,6}) days?, (.*)", text)
    if m:
        days = int(m.group(1))
        text = m.group(2)
    parts = text.split(":")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() and len(p) <= 12 for p in parts):
        return None
    total = 0
    for p in parts:
        total = total * 60 + int(p)
    return float(total + days * 86400)


_SI = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_RATE = re.compile(r"(?P<num>\d+(?:\.\d+)?)(?P<si>[kMGT]?)(?P<unit>[A-Za-z]+)/(?P<per>[A-Za-z]+)")


def _parse_rate(text: str) -> float | None:
    """Items per second from tqdm's rate: "3.21it/s", "18.0s/it", "1.2kit/s"; None for "?"."""
    m = _RATE.fullmatch(text.strip())
    if not m:
        return None
    value = float(m.group("num")) * _SI[m.group("si")]
    if m.group("per") == "s":
        return value
    if m.group("unit") == "s":  # "18.0s/it": seconds per item
        return 1.0 / value if value > 0 else None
    return None


@dataclass(frozen=True)
class ShardProgress:
    """One redraw of a checkpoint-shard loading bar."""

    desc: str  # "Loading safetensors checkpoint shards (eager)"
    done: int
    total: int
    percent: float  # 0-100, from done/total
    elapsed_s: float | None
    remaining_s: float | None  # None while tqdm shows "?"
    rate_it_s: float | None  # shards per second ("s/it" is inverted)
    worker: str | None  # "TP0", "rank=1", None for an unprefixed line

    @property
    def complete(self) -> bool:
        """All shards are loaded."""
        return self.total > 0 and self.done >= self.total


# Only bars that load weights are shard progress; other tqdm bars are ignored.
_SHARD_DESC = re.compile(r"(?i)shards|Loading safetensors|checkpoint")
_PCT = re.compile(r":\s*(\d{1,3})%")
# Anchored right after "NN%": either vLLM's " Completed |" or tqdm's "|███▊      |".
_BAR_TAIL = re.compile(
    # after "NN%": vLLM's " Completed |", tqdm's "|███▊  |", or nothing (a bar
    # rendered without its bar, as some notebook/ray log captures do)
    r"(?: Completed \||\|[^|\n]{0,200}\||)\s*(?P<n>\d{1,9})/(?P<total>\d{1,9})\s*"
    r"\[(?P<elapsed>[\d:]{1,12}|\d{1,6} days?, [\d:]{1,12})<(?P<remaining>[\d:]{1,12}|\?),\s*"
    r"(?P<rate>[^\],]{1,40})(?:,[^\]]{0,200})?\]"  # the rate up to its "," or "]", blanks and all
)


def parse_shard_progress(line: str | LinePrefix) -> ShardProgress | None:
    """Parse a vLLM or transformers shard-loading bar; None for any other line.

    Accepts the line, or its ``split_prefix`` result when the caller already has it.
    """
    pre = line if isinstance(line, LinePrefix) else split_prefix(line)
    body = pre.message
    if "%" not in body:
        return None
    for m in _PCT.finditer(body):
        tail = _BAR_TAIL.match(body, m.end())
        if not tail:
            continue
        desc = body[: m.start()].strip()
        if not _SHARD_DESC.search(desc):
            return None
        done, total = int(tail.group("n")), int(tail.group("total"))
        percent = 100.0 * done / total if total > 0 else float(m.group(1))
        return ShardProgress(
            desc=desc,
            done=done,
            total=total,
            percent=percent,
            elapsed_s=parse_duration(tail.group("elapsed")),
            remaining_s=parse_duration(tail.group("remaining")),
            rate_it_s=_parse_rate(tail.group("rate")),
            worker=pre.worker,
        )
    return None


@dataclass(frozen=True)
class ExtractProgress:
    """The extractor's latest progress report (see remote/extract.py)."""

    batch: int | None
    batches: int | None
    seqs: int | None
    seqs_total: int | None
    tokens: int | None
    tokens_total: int | None
    tok_s: float | None
    elapsed_s: float | None
    eta_s: float | None
    done: bool = False
    skipped: bool = False  # this batch was already on disk (resumed run)
    output: str | None = None  # the index file named by the final "done" line


_DUR = r"(?:\d{1,6} days?, )?[\d:]{1,20}|\?"
_N = r"\d{1,15}"  # a count: at most 15 digits
_EX_BATCH = re.compile(
    rf"\[extract\] batch (?P<b>{_N})/(?P<bs>{_N}) \| seqs (?P<s>{_N})/(?P<st>{_N}) \| "
    rf"tokens (?P<t>{_N})/(?P<tt>{_N}) \| (?P<rate>[\d.]{{1,30}}|\?) tok/s \| "
    rf"elapsed (?P<el>{_DUR}) \| eta (?P<eta>{_DUR})\s*$"
)
_EX_SKIP = re.compile(rf"\[extract\] batch (?P<b>{_N})/(?P<bs>{_N}) skipped\b")
# (the output name ends at its last non-blank: a lazy ".+?" before "\s*$" re-read the
# blanks after every character)
_EX_DONE = re.compile(
    rf"\[extract\] done: (?P<s>{_N}) sequences, (?P<t>{_N}) tokens in (?P<el>"
    + _DUR
    + r") \((?P<rate>[\d.]{1,30}|\?) tok/s\)(?: -> (?P<out>.*\S))?\s*$"
)


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_extract_progress(line: str) -> ExtractProgress | None:
    """Parse one ``[extract] …`` line; None for any other line.

    A "skipped" line carries only the batch numbers; its other fields are None and
    the caller keeps the previous counts.
    """
    at = line.find("[extract] ", 0, MAX_SCAN)
    if at < 0:
        return None
    text = line[at:MAX_SCAN]
    m = _EX_BATCH.match(text)
    if m:
        return ExtractProgress(
            batch=int(m["b"]),
            batches=int(m["bs"]),
            seqs=int(m["s"]),
            seqs_total=int(m["st"]),
            tokens=int(m["t"]),
            tokens_total=int(m["tt"]),
            tok_s=_float(m["rate"]),
            elapsed_s=parse_duration(m["el"]),
            eta_s=parse_duration(m["eta"]),
        )
    m = _EX_SKIP.match(text)
    if m:
        return ExtractProgress(
            int(m["b"]), int(m["bs"]), None, None, None, None, None, None, None, skipped=True
        )
    m = _EX_DONE.match(text)
    if m:
        seqs, tokens = int(m["s"]), int(m["t"])
        return ExtractProgress(
            batch=None,
            batches=None,
            seqs=seqs,
            seqs_total=seqs,
            tokens=tokens,
            tokens_total=tokens,
            tok_s=_float(m["rate"]),
            elapsed_s=parse_duration(m["el"]),
            eta_s=0.0,
            done=True,
            output=m["out"],
        )
    return None
