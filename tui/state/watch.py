"""Stall and hang detection, and the run's ending, as a pure function of time.

``observe(ws, run, analysis, lines, procs, gpus, now)`` folds one look at a run (its
record, its log's analysis and line count, its processes, the GPUs) into a
``WatchState`` and returns the new state. Nothing here reads a clock: the caller
passes ``now``, so tests drive it with a fake one.

- **stalled**: the run's progress (the target's shard bar while loading, the
  extractor's batches while extracting, the training step while training, the log's
  growth otherwise) has not moved for
  ``factor`` × the median interval between its steps so far, and at least the
  phase's floor (``[watch] stall_<phase>_s``; 0 turns a phase off).
- **hung**: after the load, every process of the run sleeps and every GPU it holds
  (all GPUs when it holds none that we can see) is at most ``idle_util`` % busy,
  continuously for ``hang_s`` seconds. A serving engine with no requests looks like
  that on purpose, so serving is never called hung.
- **diverged**: the log's training loss or grad norm went non-finite for good, or the
  trainer said so (remote/run/diverge.py: the client's analysis, or the host's pace with
  no client watching); told once, as the run's failure.
- **failed / finished / killed**: a root cause in the log (even while the processes
  linger, as vLLM's often do), or the run's end with its exit code.

Each event is recorded once in ``events`` (with a sequence number), so a notifier or
``eagle3-tui watch`` can act on the new ones only.

The pace so far need not have been watched by this client: a live run's record carries
the host's ``pace`` (remote/run/pace.py: the supervisor shim's last step, its time and the
recent intervals, or an adopted run's log mtime). A watch that meets a run for the first
time starts from it (``seed``), and ``assess`` judges a run from it alone, which is what
``eagle3-tui status --json`` and the runs table show for runs nobody has been watching:
stalled from the pace, hung from the host's ``idle_since`` (no CPU ticks in the run's
process group, its GPUs idle where the host can see them, since after the load).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import replace

from tui.protocol import Snapshot
from tui.protocol.hostjson import number
from tui.protocol.jsontypes import JSONObject, JSONValue
from tui.protocol.records import GpuReading, ProcReading, RunRecord
from tui.state.format import duration
from tui.state.loganalysis.record import LogAnalysis
from tui.state.model import AppState
from tui.state.watchstate import Mark, WatchConfig, WatchEvent, WatchState

__all__ = ["WatchConfig", "WatchEvent", "WatchState", "assess", "ending", "judge", "observe", "seed", "update_state"]

MAX_STEPS = 64  # step times kept for the pace median
MAX_EVENTS = 100
# Lines that say "still waiting", not progress: vLLM's shared-memory broadcast wait,
# the V0 client's poll, SGLang's launcher.
_WAITING = ("No available shared memory broadcast block", "Waiting for output from",
            "Please wait for sglang server", "No available block found")
_ENDED = ("exited", "killed", "failed", "lost")
_PHASES = ("starting", "loading", "loaded", "serving", "extracting", "training", "evaluating", "saving",
           "finished")
# where a hang can still be
_UP_TO_LOADED = ("starting", "loading", "loaded", "extracting", "training", "evaluating", "saving")
# where every process asleep and the GPUs idle means hung (a checkpoint save may wait on a disk)
_AFTER_LOAD = ("loaded", "extracting", "training", "evaluating")


def _progress(phase: str, analysis: LogAnalysis | None, lines: int) -> tuple[Mark, str]:
    """What counts as a step in this phase, and its label."""
    shard = getattr(analysis, "shard", None)
    ex = getattr(analysis, "extract", None)
    if phase == "loading" and shard is not None:
        return ("shard", shard.done, shard.total), f"shard {shard.done}/{shard.total}"
    if phase == "extracting" and ex is not None:
        return ("batch", ex.batch), f"batch {ex.batch}/{ex.batches}"
    tr = getattr(analysis, "train", None)
    if phase == "training" and tr is not None and (tr.step is not None or tr.lines):
        if tr.step is None:  # a trainer that prints its loss but no step: each metrics line is one
            return ("step", None, tr.lines), f"training log {tr.lines}"
        of = f"/{tr.total}" if tr.total else ""
        return ("step", tr.step, tr.lines), f"step {tr.step}{of}"
    return ("lines", lines), f"log line {lines}"


def _waiting_only(tail: Sequence[str]) -> bool:
    """The new lines only say "still waiting"."""
    return bool(tail) and all(any(w in line for w in _WAITING) for line in tail)


def observe(
    ws: WatchState | None,
    run: RunRecord,
    analysis: LogAnalysis | None,
    lines: int,
    procs: Sequence[ProcReading],
    gpus: Sequence[GpuReading],
    now: float,
    new_lines: Sequence[str] = (),
) -> WatchState:
    """Fold one look at ``run`` (a ``tui.protocol.records.RunRecord``-like object with ``run_id``,
    ``state``, ``exit_code``, ``signal``) into the watch state.

    ``analysis`` is the run's ``LogAnalysis`` (or None), ``lines`` its log's line
    count, ``procs``/``gpus`` the snapshot's (``Proc``/``Gpu``-like objects), and
    ``new_lines`` the lines added since the last look (to tell waiting from progress).
    """
    ws = ws or WatchState()
    cfg = ws.config
    if run is None:
        return ws
    if ws.run_id != run.run_id or ws.last_step_t is None and ws.condition == "ok":
        # a run seen for the first time: forget the old one's pace and its stall or hang
        # (this run's own is news), keep the events; one that had already ended is history
        ws = WatchState(config=cfg, run_id=run.run_id, events=ws.events, seq=ws.seq,
                        once=ws.once - {"stalled", "hung"},
                        condition="ended" if run.state in _ENDED else "ok")
        ws = seed(ws, run)
    if ws.condition == "ended":
        return ws
    if run.state in _ENDED and ws.condition != "ending":
        ws = _emit(ws, _attempt_events(run), run.run_id, now)
        return replace(ws, condition="ending")  # the log's last lines may still be on their way
    phase = getattr(analysis, "phase", None) or ws.phase or "starting"
    events: list[tuple[str, str, JSONObject]] = []

    # failures the log already shows, and the run's end
    root = getattr(analysis, "root_cause", None)
    if root is not None and root.line.rstrip().endswith(("KeyboardInterrupt", "SystemExit")):
        root = None  # a run being killed prints these; its end says what happened
    events.extend(_attempt_events(run))
    if root is not None and bool(getattr(run, "attempts", None)) and run.state not in _ENDED:
        root = None  # the host decides whether this attempt's failure ends the run: its record says
    verdict = diverged(run, analysis)
    if verdict is not None and (root is None or root.id == verdict.get("id")):
        events.append(("diverged", f"diverged: {verdict.get('why')}", {
            "cause": str(verdict.get("line") or "").strip(), "id": verdict.get("id"),
            "phase": getattr(analysis, "failed_in", None) or "training"}))
    elif root is not None and analysis is not None:  # (a root cause comes from the analysis)
        summary = analysis.failure_summary() or "failed"
        events.append(("failed", f"{summary}: {root.title}", {"cause": root.line.strip(), "id": root.id,
                                                               "phase": getattr(analysis, "failed_in", None)}))
    if run.state in _ENDED:
        kind = ending(run, analysis)
        detail: JSONObject = {"exit_code": run.exit_code, "signal": run.signal, "state": run.state}
        if kind == "failed" and root is None and verdict is None:
            code = run.exit_code if run.exit_code is not None else run.signal
            events.append(("failed", f"run {run.state} (exit {code})", detail))
        elif kind != "failed":
            again = f" after {run.restarts} restart(s)" if getattr(run, "restarts", 0) else ""
            events.append((kind, end_text(kind, run) + again, dict(detail, restarts=getattr(run, "restarts", 0))))
        ws = replace(ws, condition="ended")
        return _emit(ws, events, run.run_id, now)

    if getattr(run, "restart_at", None) is not None:  # the host waits to restart it: no
        ws = replace(ws, last_step_t=now, steps=(now,), idle_since=None, seeded=False,  # progress is due
                     condition="ok" if ws.condition in ("stalled", "hung") else ws.condition)
        return _emit(ws, events, run.run_id, now)

    # progress
    mark, label = _progress(phase, analysis, lines)
    if ws.seeded:  # the host's history stands: this look only learns what its marks look like
        ws = replace(ws, seeded=False, phase=phase, mark=mark)
    elif phase != ws.phase:
        ws = replace(ws, phase=phase, steps=(now,), last_step_t=now, last_step=label, mark=mark)
    elif mark != ws.mark and not (mark[0] == "lines" and _waiting_only(new_lines)):
        ws = replace(ws, steps=(ws.steps + (now,))[-MAX_STEPS:], last_step_t=now, last_step=label, mark=mark)
        if ws.condition == "stalled":
            events.append(("resumed", f"progress again: {label}", {}))
            ws = replace(ws, condition="ok", once=ws.once - {"stalled"})
    elif ws.last_step_t is None:
        ws = replace(ws, last_step_t=now, last_step=label, mark=mark, steps=(now,))

    # hang: everything asleep and the GPUs idle, after the load
    mine = [p for p in procs if getattr(p, "run_id", None) == run.run_id]
    pids = {p.pid for p in mine}
    held = [g for g in gpus if any(gp.pid in pids for gp in getattr(g, "processes", ()))]
    asleep = bool(mine) and all((p.state or "") in ("S", "I") for p in mine)
    idle = all(g.util is not None and g.util <= cfg.idle_util for g in (held or gpus))
    busy = not idle or any((p.state or "") not in ("S", "I") for p in mine)
    after_load = phase in _AFTER_LOAD
    if asleep and idle and after_load:
        ws = replace(ws, idle_since=ws.idle_since if ws.idle_since is not None else now,
                     gpus_seen=bool(held or gpus))
    elif ws.idle_since is not None and (busy or phase not in _UP_TO_LOADED):
        # (an idle_since the host gave survives a look whose log analysis still lags)
        ws = replace(ws, idle_since=None)
        if ws.condition == "hung":
            ws = replace(ws, condition="ok", once=ws.once - {"hung"})

    idle_s = now - ws.idle_since if ws.idle_since is not None else None
    if idle_s is not None and cfg.hang_s > 0 and idle_s >= cfg.hang_s:
        if ws.condition != "hung":
            ws = replace(ws, condition="hung")
            events.append(("hung", ws.describe(now) or "hung", {"idle_s": idle_s, "phase": phase}))
    elif ws.condition == "ok" and ws.last_step_t is not None:
        # (a run whose log ends in its failure is in phase "failed", which never stalls; an
        # extraction that went on after one is watched again: its stall is news)
        limit = _stall_limit(ws, phase)
        if limit is not None and now - ws.last_step_t > limit:
            ws = replace(ws, condition="stalled")
            events.append(("stalled", ws.describe(now) or "stalled",
                           {"phase": phase, "last": ws.last_step, "last_t": ws.last_step_t, "limit_s": limit}))
    return _emit(ws, events, run.run_id, now)


def diverged(run: RunRecord, analysis: LogAnalysis | None) -> JSONObject | None:
    """The run's divergence verdict (remote/run/diverge.py): the log analysis's, else the
    host's pace's (read with no client watching), else None."""
    tr = getattr(analysis, "train", None)
    div = getattr(tr, "div", None)
    got: JSONValue = div.to_dict() if div is not None and div.verdict is not None else None
    if isinstance(got, dict):
        return got
    pace = getattr(run, "pace", None)
    got = pace.get("diverged") if isinstance(pace, dict) else None
    return got if isinstance(got, dict) else None


def _step_text(progress: JSONValue) -> str:
    """ "batch 1,203/4,000" from an attempt's progress (the host's pace step)."""
    step = progress.get("step") if isinstance(progress, dict) else None
    if not isinstance(step, str) or not step:
        return ""
    # the host's text: its head only, and only a count of at most 18 digits grouped (int()
    # refuses 4300 digits, and a longer number is no count)
    return re.sub(r"(?<!\d)\d{4,18}(?!\d)", lambda m: f"{int(m.group()):,}", step[:200])


def attempt_cause(attempt: JSONObject) -> str:
    """ "NCCL collective timed out at batch 1,203/4,000" for one attempt of a run."""
    cause = attempt.get("cause")
    cause = cause if isinstance(cause, dict) else None
    if attempt.get("hung"):
        what = "hung"
    elif cause:
        what = str(cause.get("title") or cause.get("id") or "failed")
    elif attempt.get("signal"):
        what = f"died of {attempt['signal']}"
    else:
        what = f"exit {attempt.get('exit_code')}"
    step = _step_text(attempt.get("progress"))
    return f"{what} at {step}" if step else what


def _attempt_events(run: RunRecord) -> list[tuple[str, str, JSONObject]]:
    """The host's restart decisions (remote/run/restart.py), one event per ended attempt that
    was restarted, and one when it gave up; each carries the attempt."""
    out: list[tuple[str, str, JSONObject]] = []
    for a in getattr(run, "attempts", ()) or ():
        n, why = a.get("n"), str(a.get("why") or "")
        if a.get("ended_at") is None:
            continue
        detail = {"attempt": n, "cause": a.get("cause"), "progress": a.get("progress"), "why": why,
                  "exit_code": a.get("exit_code"), "signal": a.get("signal"), "restart_at": a.get("restart_at")}
        if a.get("restarted"):
            out.append((f"restarting:{n}", f"attempt {n} failed: {attempt_cause(a)}; restarting", detail))
        elif why.startswith("gave up"):
            out.append(("gave up", f"attempt {n} failed: {attempt_cause(a)}; {why}", detail))
    return out


def seed(ws: WatchState, run: RunRecord) -> WatchState:
    """``ws`` (fresh for ``run``) with the pace the host recorded for it, if any."""
    pace = getattr(run, "pace", None)
    if not isinstance(pace, dict) or getattr(run, "state", None) != "running":
        return ws
    if pace.get("source") == "mtime":
        grew = number(pace.get("grew_at"))  # the host's file: a number out of range is none
        if grew is None:
            return ws
        return replace(ws, last_step_t=grew, last_step="log growth", steps=(grew,), seeded=True)
    at = number(pace.get("step_at"))
    if at is None:
        return ws
    times = [at]
    gaps = pace.get("intervals")
    for gap in reversed([g for g in map(number, gaps if isinstance(gaps, list) else []) if g is not None][-MAX_STEPS:]):
        times.insert(0, times[0] - gap)
    phase = pace.get("phase") if pace.get("phase") in _PHASES else None
    since = number(pace.get("idle_since"))  # the host saw the run idle since then, after the load
    idle_since = since if phase in _AFTER_LOAD else None
    return replace(ws, phase=phase, steps=tuple(times), last_step_t=at,
                   last_step=str(pace.get("step") or "start"), seeded=True, idle_since=idle_since)


def assess(run: RunRecord, config: WatchConfig | None, now: float, procs: Sequence[ProcReading] = (),
           gpus: Sequence[GpuReading] = ()) -> WatchState | None:
    """One look at a live run from the host's pace alone (no log analysis, no history of
    our own): a ``WatchState`` whose ``condition``/``describe`` say whether it is
    stalled, or hung by the host's ``idle_since``; None for a run that is not live or
    has no pace."""
    pace = run.pace
    if run.state != "running" or not isinstance(pace, dict):
        return None
    if getattr(run, "restart_at", None) is not None:
        return None  # waiting for the host's restart: neither stalled nor hung
    ws = seed(WatchState(config=config or WatchConfig(), run_id=run.run_id), run)
    if not ws.seeded:
        return None
    return _host_hang(observe(ws, run, None, 0, procs, gpus, now), pace, now)


def _host_hang(ws: WatchState, pace: JSONObject, now: float) -> WatchState:
    """``ws`` hung when the host saw no CPU (and no GPU, where it can see them) activity
    for ``hang_s`` after the load (remote/run/pace.py's ``idle_since``)."""
    since = number(pace.get("idle_since"))
    hang_s = ws.config.hang_s
    if (ws.condition in ("ending", "ended") or since is None or hang_s <= 0
            or pace.get("phase") not in _AFTER_LOAD or now - since < hang_s):
        return ws
    what = "CPU" if str(pace.get("gpu") or "none").startswith("none") else "CPU or GPU"
    return replace(ws, condition="hung", idle_since=since, idle_what=what)


def judge(run: RunRecord, config: WatchConfig | None, now: float) -> JSONObject | None:
    """``assess`` for one run record of the agent, as JSON for ``status --json``:
    ``{"condition": "ok" | "stalled" | "hung" | "diverged", "message", "last_step", "last_step_at",
    "source"}`` (diverged also with ``cause``: the line it began at, ``id``, ``diverged_at``),
    or None for a run that is not live or has no pace."""
    ws = assess(run, config, now)
    if ws is None:
        return None
    div = diverged(run, None)
    if div is not None:  # the host's pace read it diverge: what matters most, whatever the pace
        return {"condition": "diverged", "message": f"diverged: {div.get('why')}", "cause": div.get("line"),
                "id": div.get("id"), "diverged_at": div.get("at"), "last_step": ws.last_step,
                "last_step_at": ws.last_step_t, "source": (run.pace or {}).get("source")}
    return {"condition": ws.condition, "message": ws.describe(now), "last_step": ws.last_step,
            "last_step_at": ws.last_step_t, "source": (run.pace or {}).get("source")}


def annotate(snapshot: Snapshot, config: WatchConfig | None, now: float) -> JSONObject:
    """The snapshot as the agent sent it (``status --json``), each live, paced run
    carrying its ``judge`` as ``watch``."""
    out = snapshot.as_dict()
    runs: list[JSONValue] = [r.wire if (seen := judge(r, config, now)) is None else dict(r.wire, watch=seen)
                             for r in snapshot.runs]
    out["runs"] = runs
    return out


def _stall_limit(ws: WatchState, phase: str) -> float | None:
    """factor × the median step interval, at least the phase's floor; None = off."""
    floor = ws.config.floor(phase)
    if floor <= 0:
        return None
    gaps = [b - a for a, b in zip(ws.steps, ws.steps[1:])]
    pace = statistics.median(gaps) if len(gaps) >= 2 else 0.0
    return max(ws.config.factor * pace, floor)


_INTERRUPT_CODES = (130, 143)  # 128 + SIGINT, 128 + SIGTERM
_INTERRUPT_SIGNALS = ("SIGINT", "SIGTERM")


def ending(run: RunRecord, analysis: LogAnalysis | None) -> str:
    """finished | failed | killed | lost for an ended run. A run the user interrupted
    (Ctrl-C's KeyboardInterrupt, exit 130/143, SIGINT/SIGTERM) is killed, not failed,
    unless the log shows a real failure first."""
    if run.state in ("killed", "lost"):
        return str(run.state)
    if getattr(analysis, "root_cause", None) is not None:
        return "failed"
    if run.state == "exited" and run.exit_code == 0:
        return "finished"
    if (run.exit_code in _INTERRUPT_CODES or run.signal in _INTERRUPT_SIGNALS
            or getattr(analysis, "interrupted_at", None) is not None):
        return "killed"
    return "failed"


def end_text(kind: str, run: RunRecord) -> str:
    """What an ended run's event says beyond its kind (the kind is its title: "run …
    finished"), e.g. "exit 0 after 00:16", "interrupted (exit 130) after 1:02:03"."""
    how = f"by {run.signal}" if run.signal else f"exit {run.exit_code}" if run.exit_code is not None else ""
    if kind == "killed" and run.state == "exited":
        how = f"interrupted ({how})" if how else "interrupted"
    elif kind == "lost":
        how = how or "its processes are gone and no exit status was recorded"
    took = (run.ended_at - run.launched_at) if run.ended_at and run.launched_at else None
    if took is not None and took >= 0:
        how = f"{how} after {duration(took)}".strip()
    return how or kind


def _emit(ws: WatchState, events: list[tuple[str, str, JSONObject]], run_id: str, now: float) -> WatchState:
    """Append the events not sent yet (one "failed" per run; a stall per episode)."""
    out = list(ws.events)
    once = set(ws.once)
    seq = ws.seq
    for kind, message, detail in events:
        key = kind if kind in ("stalled", "hung") else f"{kind}:{run_id}"
        kind = kind.split(":")[0]  # "restarting:2": once per attempt
        if kind != "resumed":
            if key in once or (kind in ("finished", "killed", "lost", "failed")
                               and f"diverged:{run_id}" in once) or (
                    kind in ("finished", "killed", "lost") and f"failed:{run_id}" in once):
                continue  # sent already; or the log said it failed, and its end is the same news
            once.add(key)
        seq += 1
        out.append(WatchEvent(seq=seq, kind=kind, run_id=run_id, at=now, message=message, detail=detail))
    if seq == ws.seq:
        return ws
    return replace(ws, events=tuple(out[-MAX_EVENTS:]), seq=seq, once=frozenset(once))


def update_state(state: AppState, now: float) -> AppState:
    """The reducer's hook: watch the run whose log the screen follows (AppState in, out).

    A state without a ``watch`` (None) is returned as it is, so watching is opt-in.
    """
    ws = state.watch
    if ws is None:
        return state
    log = state.log
    if log.backlog:
        return state  # the log's analysis is still catching up: look at the next snapshot
    run = next((r for r in state.runs if r.log and r.log == log.path), None) or state.run(ws.run_id)
    if run is None:
        return state
    seen = ws.mark[1] if ws.mark and ws.mark[0] == "lines" else None
    new = log.lines[-(log.total_lines - seen):] if isinstance(seen, int) and log.total_lines > seen else ()
    new_ws = observe(ws, run, log.analysis, log.total_lines, state.processes, state.gpus, now, new)
    return state if new_ws is ws else replace(state, watch=new_ws)
