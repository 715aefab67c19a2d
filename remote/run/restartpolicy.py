"""The restart policy applied on the host: which failure an attempt died of, whether it
is restarted, and how long the run waits first. Pure decisions over data (log lines, the
attempts so far, the policy); the process that runs the attempts and acts on them is
remote/run/restart.py.

The policy comes compiled by the client (``launch.json``'s ``restart``, from eagle3.toml
and the one signature table: tui/services/restartpolicy.py). ``Matcher`` names an
attempt's root cause with the client's own regexes, so the host and the client agree on
every line (tests/test_restart.py); ``decide`` says restart or not, and why, in words;
``delay`` is the wait before restart n. Stdlib only, Python 3.9+.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from remote.base.wire import MAX_SCAN
from remote.run import diverge

MARK = "[eagle3-tui] attempt "  # the supervisor's own lines in the run's log
# The line that begins attempt 2, 3, …: the client's log analysis and the host's pace
# start afresh there (tui/state/logparse.py, remote/run/pace.py have the same regex).
STARTS = re.compile(r"^\[eagle3-tui\] attempt \d+/\d+ starts")


def delay(policy: dict, n: int) -> float:
    """Seconds before restart ``n`` (1-based): doubling from restart_delay, capped."""
    base = float(policy.get("restart_delay", 30.0))
    cap = float(policy.get("restart_delay_max", 600.0))
    return float(min(cap, base * 2 ** max(0, n - 1)))


# ---------------------------------------------------------------- the matcher


class _Keep(dict):  # type: ignore[type-arg]
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


class Matcher:
    """The client's failure classification over a log, with the regexes it compiled:
    prefixes split the same way (tui/state/logline.split_prefix), quiet levels and
    request handlers' errors skipped, and so are lines at a quiet level that only say a
    failure is being retried; signatures tried in the client's order, a bare exception
    line the catch-all, and what dies after an interrupt no cause. The root cause is the
    first failure of the best rank (specific, catch-all, wrapper): a later failure of the
    same rank is a consequence (the ranks that waited on the one that died first)."""

    def __init__(self, policy: dict) -> None:
        ln = policy.get("lines") or {}
        self.ansi = re.compile(ln["ansi"])
        self.worker = re.compile(ln["worker"])
        self.foreign = re.compile(ln["foreign"])
        self.level = re.compile(ln["level"])
        self.quiet = set(ln.get("quiet") or ())
        self.exc = re.compile(ln["exception"])
        self.interrupt = re.compile(ln["interrupt"])
        self.request = re.compile(ln["request_source"])
        # a quiet-level line that only says a failure is retried (an older client sends none)
        self.note_level = re.compile(ln["note_level"]) if ln.get("note_level") else None
        self.note_retry = re.compile(ln["note_retry"]) if ln.get("note_retry") else None
        self.note_head = int(ln.get("note_head") or 64)
        self.sigs: list[dict] = []
        self.generic: dict | None = None
        for s in policy.get("signatures") or []:
            entry = dict(s, compiled=[re.compile(p) for p in s.get("patterns") or []])
            if s.get("generic"):
                self.generic = self.generic or entry
            elif (s.get("persist") or 1) > 1:
                continue  # a streak's signature: the divergence fold tells it (by_id)
            else:
                self.sigs.append(entry)
        self.sigs.sort(key=lambda s: bool(s.get("wrapper")))  # stable: specific, then wrappers
        # divergence is told by remote/run/diverge.py's fold, as the client's analysis does; its
        # verdict names one of these signatures (a table without that id leaves it unsaid)
        self.by_id = {str(s.get("id")): s for s in policy.get("signatures") or []}

    def split(self, line: str) -> tuple[str | None, str | None, str]:
        """(level, source, message) as the client's split_prefix gives them."""
        text = line[:MAX_SCAN]
        worker = False
        foreign_level = None
        for _ in range(8):
            m = self.worker.match(text)
            if m:
                worker, text = True, text[m.end():]
                continue
            f = self.foreign.match(text)
            if f and f.end() > 0 and (not worker or f.group("plevel") or f.group("blevel") or f.group("glog")
                                      or f.group("slevel") or text[:1] == "["):
                lv = f.group("plevel") or f.group("blevel") or f.group("glog") or f.group("slevel")
                if lv:
                    lv = lv.upper()
                    foreign_level = {"WARN": "WARNING", "I": "INFO", "W": "WARNING", "E": "ERROR",
                                     "F": "CRITICAL"}.get(lv, lv)
                text = text[f.end():]
                continue
            break
        lm = self.level.match(text)
        if not lm:
            return foreign_level, None, text
        return lm.group("level"), "%s:%s" % (lm.group("file"), lm.group("lineno")), text[lm.end():]

    def retry_note(self, msg: str) -> bool:
        """A quiet-level line that only says a failure is being retried: never a failure."""
        return (self.note_level is not None and self.note_retry is not None
                and self.note_level.search(msg[:self.note_head]) is not None
                and self.note_retry.search(msg) is not None)

    def match(self, msg: str) -> tuple[dict, Any] | None:
        for s in self.sigs:
            for pat in s["compiled"]:
                m = pat.search(msg)
                if m:
                    return s, m
        return None

    def root_cause(self, lines: Iterable[str]) -> dict | None:
        """{"id", "title", "class", "line"} of the root cause, or None."""
        best: tuple[int, dict, Any, str] | None = None
        interrupted = False
        div = diverge.State()
        for raw in lines:
            raw = raw[: MAX_SCAN * 4]  # the head of a line only, as the client reads it: a line may be 1 GB
            line = (self.ansi.sub("", raw) if "\x1b" in raw else raw)[:MAX_SCAN]
            if line.startswith(MARK):  # this supervisor's own lines: never a failure
                if STARTS.match(line):
                    best, interrupted, div = None, False, diverge.State()  # a new attempt: its own failures only
                continue
            if div.verdict is None:
                div = diverge.fold(div, line, 0)
                verdict = div.verdict
                sig = self.by_id.get(verdict[0]) if verdict is not None else None
                if verdict is not None and sig is not None and (best is None or best[0] > 0):
                    best = (0, sig, None, verdict[3])
            level, source, msg = self.split(line)
            if level in self.quiet or (level is None and self.retry_note(msg)):
                continue
            hit = self.match(msg)
            if source is not None and self.request.search(source):
                if not (hit and hit[0].get("serving_fatal") and self.exc.match(msg)):
                    continue
            continuation = not msg or msg[0].isspace()
            if not continuation and self.interrupt.search(msg.rstrip()):
                interrupted = True
                continue
            if hit is None:
                if continuation or self.generic is None or not self.exc.match(msg):
                    continue
                hit = (self.generic, None)
            if interrupted and best is None:
                continue  # a consequence of the interrupt, not a failure of its own
            sig = hit[0]
            rank = 2 if sig.get("wrapper") else 1 if sig.get("generic") else 0
            if best is None or rank < best[0]:
                best = (rank, sig, hit[1], line)
        if best is None:
            return None
        _, sig, m, line = best
        title = str(sig.get("title") or sig["id"])
        if m is not None and "{" in title:
            try:
                title = title.format_map(_Keep({k: v for k, v in m.groupdict().items() if v is not None}))
            except (ValueError, IndexError, AttributeError):
                pass
        return {"id": sig["id"], "title": title, "class": sig.get("class") or "unclassified",
                "line": line.strip()[:500]}


# ---------------------------------------------------------------- the decision


def decide(policy: dict, attempts: list[dict], ended: dict, now: float) -> tuple[bool, str]:
    """Whether the attempt that just ended (``ended``, not yet in ``attempts``) is
    restarted, and why, in words. Kill and success first, then the cause's class, then
    the limits: max_restarts and the thrash guard."""
    if ended.get("killed"):
        return False, "killed"
    if ended.get("diverged"):  # its weights are NaN: a restart from scratch wastes the same hours
        how = "stopped (on_diverge = kill)" if ended.get("stopped") == "diverged" else "not restarted"
        return False, "diverged: %s" % how
    if ended.get("stopped") == "idle":
        return False, "idle: stopped (on_idle = kill)"
    if ended.get("exit_code") == 0 and not ended.get("hung"):
        return False, "finished"
    cause = ended.get("cause") or {}
    klass = cause.get("class") or "unclassified"
    if ended.get("hung"):
        if policy.get("on_hang") != "restart":
            return False, "hung: stopped (on_hang = %s)" % policy.get("on_hang")
        klass, what = "transient", "hung"
    else:
        what = "%s (%s)" % (cause.get("title"), cause.get("id")) if cause else "no cause in the log"
        if policy.get("restart") != "on-failure":
            return False, "not restarted: restart = never"
    if klass == "deterministic":
        return False, "not restarted: %s is deterministic" % what
    if klass != "transient":
        prev = next((a.get("progress") for a in reversed(attempts) if a.get("progress")), None) or {}
        got, had = (ended.get("progress") or {}).get("batch"), prev.get("batch")
        if got is None or (had is not None and got <= had):
            return False, "not restarted: %s, and no progress beyond the previous attempt" % what
        what += ", after progress to batch %d" % got
    restarts = sum(1 for a in attempts if a.get("restarted"))
    if restarts >= int(policy.get("max_restarts", 3)):
        return False, "gave up: %s after %d restart(s) (max_restarts)" % (what, restarts)
    burst, window = int(policy.get("thrash_failures", 4)), float(policy.get("thrash_window", 600))
    failures = 1 + sum(1 for a in attempts if a.get("exit_code") != 0 and (a.get("ended_at") or 0) >= now - window)
    if burst > 0 and failures >= burst:
        return False, "gave up: %d failures within %s (thrash guard)" % (failures, span(window))
    return True, "restarting: %s" % what


def span(seconds: float) -> str:
    """How long, in the client's words (tui/state/format.py `duration`, held equal by
    tests/test_duration.py): "42s", "1.5s", "5m12s", "37m", "5h12m", "3d4h"."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not -2 < seconds < 100 * 365 * 86400:
        return "N/A"
    if 0 < seconds < 10 and seconds != int(seconds):
        return ("%.1f" % seconds).rstrip("0").rstrip(".") + "s"
    s = max(0, int(seconds))
    if s < 60:
        return "%ds" % s
    m, h, d = s // 60, s // 3600, s // 86400
    if m < 10:
        return "%dm%ds" % (m, s % 60) if s % 60 else "%dm" % m
    if m < 180:
        return "%dm" % m
    if h < 8:
        return "%dh%dm" % (h, m % 60) if m % 60 else "%dh" % h
    if h < 48:
        return "%dh" % h
    if d < 8:
        return "%dd%dh" % (d, h % 24) if h % 24 else "%dd" % d
    return "%dd" % d