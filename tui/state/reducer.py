"""`apply(state, event, now) -> state`: the one place anything changes the client state.

Agent messages (snapshot, log bytes, kill progress, errors), link status, the user's
cursor, the config as (re)read, and actions started and ended all arrive here as
events; the app and the CLI hold no state of their own beside `AppState`.

Pure: the caller passes the clock (`now`) so tests replay events deterministically.
The events are one closed union (`tui.state.events.Event`): the dispatch below ends in
`assert_never`, so an event type nobody handles is a type error. The view model
(`tui.state.view`) gives the one text the reducer writes: an action's outcome, as its
notice.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from tui import protocol as p
from tui.protocol.hosttext import clean
from tui.protocol.ops import ActionReply, KillReport
from tui.protocol.records import RunRecord
from tui.protocol.stream import LinkStatus
from tui.state import view, watch
from tui.state.events import (
    ANALYSE_SLICE,
    ActionEnded,
    ActionStarted,
    ActionUnconfirmed,
    AnalyseLog,
    ConfigRead,
    CursorMoved,
    Event,
    LedgerRead,
    LogFollowed,
    LogOlder,
    Notice,
    ShowAll,
    TailSize,
)
from tui.state.loganalysis import fold
from tui.state.model import (
    HISTORY,
    LOG_LINES,
    PREVIEW_LINES,
    Action,
    AppState,
    KillView,
    Link,
    LogTail,
)

if sys.version_info >= (3, 11):
    from typing import assert_never
else:
    from typing_extensions import assert_never

ACTIONS_KEPT = 20  # ended actions kept in the state (the newest)
NOTICES_KEPT = 10


def apply(state: AppState, event: Event, now: float) -> AppState:
    """Return the state after `event`."""
    if isinstance(event, p.Snapshot):
        return watch.update_state(_snapshot(state, event, now), now)
    if isinstance(event, (p.LogData, p.LogReset)):
        if state.log.sub is not None and event.sub != state.log.sub:
            return state  # a chunk of the log followed before, still in flight
        log = feed_log(state.log, event, now) if isinstance(event, p.LogData) else reset_log(state.log, event)
        return replace(state, log=log, link=_seen(state.link, now))
    if isinstance(event, TailSize):
        return state if event.sub != state.log.sub else replace(state, log=replace(state.log, tail_end=event.size))
    if isinstance(event, LogOlder):
        if event.sub != state.log.sub or not state.log.older:
            return state
        return replace(state, log=older_log(state.log, event, now))
    if isinstance(event, AnalyseLog):
        if event.sub != state.log.sub or not state.log.backlog or state.log.older:
            return state
        return replace(state, log=analyse_log(state.log, event.lines or ANALYSE_SLICE))
    if isinstance(event, p.Hello):
        agent = f"agent {event.agent_version}" + (f" ({event.agent_sha[:8]})" if event.agent_sha else "") + (
            f" on Python {event.python}" if event.python else "")
        return replace(
            state,
            hostname=event.hostname,
            agent=agent,
            gpu_source=event.gpu_source,
            gpu_error=event.gpu_error,
            link=Link(state="connected", last_data=now),
        )
    if isinstance(event, p.KillProgress):
        kill = KillView(
            run_id=event.run_id,
            stage=event.stage,
            alive=event.alive,
            gpus=event.gpus,
            elapsed=event.elapsed,
        )
        act = next((a for a in reversed(state.actions) if a.kind == "kill" and not a.done
                    and a.run_id == event.run_id), None)
        if act is None:
            return replace(state, link=_seen(state.link, now))
        return replace(_put(state, replace(act, progress=kill)), link=_seen(state.link, now))
    if isinstance(event, p.AgentError):
        return _notice(replace(state, message=event.message), "warning", f"agent: {event.message}")
    if isinstance(event, (ConfigRead, CursorMoved, ShowAll, LedgerRead, LogFollowed, Notice)):
        return _client_event(state, event)
    if isinstance(event, (ActionStarted, ActionUnconfirmed, ActionEnded)):
        return _action_event(state, event, now)
    if isinstance(event, LinkStatus):
        link = Link(state=event.state, attempt=event.attempt, error=event.error, last_data=state.link.last_data)
        return replace(state, link=link)
    assert_never(event)


def _client_event(state: AppState,
                  event: ConfigRead | CursorMoved | ShowAll | LedgerRead | LogFollowed | Notice) -> AppState:
    if isinstance(event, ConfigRead):
        st = replace(state, settings=event.settings)
        if event.settings.error and event.settings.error != state.settings.error:
            st = _notice(st, "error", event.settings.error)
        return st
    if isinstance(event, CursorMoved):
        return replace(state, cursor=event.run_id)
    if isinstance(event, ShowAll):
        return replace(state, show_all=event.on)
    if isinstance(event, LedgerRead):
        return replace(state, summaries=dict(event.summaries), applied_patch=event.applied_patch,
                       version_order=tuple(event.version_order))
    if isinstance(event, LogFollowed):
        return replace(state, log=LogTail(path=event.path, sub=event.sub, note=event.note, defer=event.defer,
                                          older=event.older))
    return _notice(state, event.severity, event.text)


def _action_event(state: AppState, event: ActionStarted | ActionUnconfirmed | ActionEnded, now: float) -> AppState:
    if isinstance(event, ActionStarted):
        return _put(state, Action(action_id=event.action_id, kind=event.kind, run_id=event.run_id, started_at=now))
    act = state.action(event.action_id)
    if act is None or act.done:
        return state  # an outcome already recorded (a reply and a recheck both came back)
    if isinstance(event, ActionUnconfirmed):
        return _put(state, replace(act, state="unconfirmed", error=event.error))
    ended = replace(
        act, state="ok" if event.ok else "failed", ended_at=now, result=event.result,
        error=event.error, confirmed_after_reconnect=event.confirmed_after_reconnect,
        run_id=act.run_id or (event.result.run_id if isinstance(event.result, ActionReply) else None),
    )
    st = _put(state, ended)
    res = event.result
    good = event.ok and (not isinstance(res, KillReport) or (res.ok and res.gpus_free is not False))
    return _notice(st, "information" if good else "error", view.action_text(ended))


def _put(state: AppState, act: Action) -> AppState:
    """Insert or replace an action by id; keep the newest ACTIONS_KEPT ended ones."""
    ids = [a.action_id for a in state.actions]
    acts = list(state.actions)
    if act.action_id in ids:
        acts[ids.index(act.action_id)] = act
    else:
        acts.append(act)
    ended = [a.action_id for a in acts if a.done]
    drop = set(ended[: max(0, len(ended) - ACTIONS_KEPT)])
    return replace(state, actions=tuple(a for a in acts if a.action_id not in drop))


def _notice(state: AppState, severity: str, text: str) -> AppState:
    serial = state.notice_serial + 1
    notices = (state.notices + ((serial, severity, text),))[-NOTICES_KEPT:]
    return replace(state, notices=notices, notice_serial=serial)


def _seen(link: Link, now: float) -> Link:
    return replace(link, last_data=now) if link.state == "connected" else link


def _snapshot(state: AppState, snap: p.Snapshot, now: float) -> AppState:
    gpus = snap.gpus
    gpu_mem: dict[tuple[str | None, int], int] = {}  # (node, pid): a job's nodes each have their own pids
    for gpu in gpus:
        for gp in gpu.processes:
            if gp.mem is not None:
                gpu_mem[gpu.node, gp.pid] = gpu_mem.get((gpu.node, gp.pid), 0) + gp.mem
    procs = tuple(replace(proc, gpu_mem=gpu_mem.get((proc.node, proc.pid))) for proc in snap.processes)
    history = dict(state.gpu_history)
    for gpu in gpus:
        past = history.get(gpu.key, ())
        history[gpu.key] = (past + ((gpu.mem_fraction, gpu.util),))[-HISTORY:]
    host = snap.host
    return replace(
        state,
        host=host,
        hostname=host.hostname or state.hostname,
        gpus=gpus,
        gpu_source=snap.gpu_source,
        gpu_error=snap.gpu_error,
        gpu_history=history,
        job_nodes=snap.job_nodes,
        processes=procs,
        runs=snap.runs if snap.run_ids is None else _kept_runs(state.runs, snap),
        snapshot_time=snap.time,
        seq=snap.seq,
        link=_seen(state.link, now),
    )


def _kept_runs(runs: tuple[RunRecord, ...], snap: p.Snapshot) -> tuple[RunRecord, ...]:
    """A periodic snapshot's runs: those it sent, and the others as the last one had them
    (the same objects: what did not change is not parsed or drawn again)."""
    new = {r.run_id: r for r in snap.runs}
    old = {r.run_id: r for r in runs}
    return tuple(r for i in snap.run_ids or () if (r := new.get(i) or old.get(i)) is not None)


def feed_log(log: LogTail, event: p.LogData, now: float) -> LogTail:
    """Append a chunk. A chunk that does not continue the stream is ignored (duplicate)."""
    data = event.data
    if log.inode is not None and event.inode == log.inode and event.offset < log.offset:
        if event.end <= log.offset:
            return log  # already have these bytes (replayed after a reconnect)
        data = data[log.offset - event.offset :]  # keep only the bytes not seen yet
    lines, partial = fold.split_lines(log.partial, data)
    analysis = log.analysis if log.analysis is not None else fold.LogAnalysis()
    line_no, backlog, preview = log.total_lines, log.backlog, log.preview
    if lines and log.defer and (log.older or backlog or len(lines) > ANALYSE_SLICE):
        backlog += ((line_no + 1, now, tuple(lines)),)  # analysed later, in order
        # meanwhile the newest lines tell the latest step, loss and phase at once
        preview = preview if preview is not None else fold.LogAnalysis()
        newest = lines[-PREVIEW_LINES:]
        for i, line in enumerate(newest, line_no + len(lines) - len(newest) + 1):
            preview = fold.step(preview, line, i, now)
        line_no += len(lines)
    else:
        for line in lines:
            line_no += 1
            analysis = fold.step(analysis, line, line_no, now)
    kept = (log.lines + tuple(lines))[-LOG_LINES:]
    first = line_no - len(kept) + 1
    return replace(
        log,
        path=event.path,
        inode=event.inode,
        offset=event.end,
        lines=kept,
        first_line_no=first,
        partial=partial,
        live=fold.live_segment(partial),
        analysis=analysis,
        backlog=backlog,
        preview=preview if backlog or log.older else None,
        note=None,
    )


def older_log(log: LogTail, event: LogOlder, now: float) -> LogTail:
    """Put the lines before the first tail first: numbered from 1, analysed first."""
    data = event.data
    if event.cut:
        data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""
    older = tuple(fold.split_lines(b"", data)[0]) if data else ()
    n = len(older)
    kept = (older + log.lines)[-LOG_LINES:]
    shifted = tuple((first + n, t, lines) for first, t, lines in log.backlog)
    return replace(
        log,
        older=False,
        prepended=log.prepended + n,
        lines=kept,
        first_line_no=log.total_lines + n - len(kept) + 1,
        backlog=(((1, now, older),) if older else ()) + shifted,
    )


def analyse_log(log: LogTail, budget: int) -> LogTail:
    """Fold up to `budget` lines of the backlog into the analysis, oldest first."""
    analysis = log.analysis if log.analysis is not None else fold.LogAnalysis()
    backlog = list(log.backlog)
    while backlog and budget > 0:
        first, t, lines = backlog[0]
        take = lines[:budget]
        for i, line in enumerate(take):
            analysis = fold.step(analysis, line, first + i, t)
        budget -= len(take)
        if len(take) < len(lines):
            backlog[0] = (first + len(take), t, lines[len(take):])
        else:
            backlog.pop(0)
    return replace(log, analysis=analysis, backlog=tuple(backlog),
                   preview=log.preview if backlog or log.older else None)  # caught up: the whole log's


def reset_log(log: LogTail, event: p.LogReset) -> LogTail:
    """The byte stream restarts: keep the old lines on screen, number new ones from 1."""
    notes = {
        "missing": f"waiting for {clean(event.path, newline=False)} to appear",
        "truncated": "log was truncated; reading from the start",
        "rotated": "log was rotated; following the new file",
    }
    restart = event.reason != "missing"
    return replace(
        log,
        path=event.path,
        inode=event.inode,
        offset=event.offset,
        first_line_no=1 - len(log.lines) if restart else log.first_line_no,
        partial=b"",
        live="",
        analysis=None if restart else log.analysis,
        backlog=() if restart else log.backlog,  # the old stream's lines no longer count
        preview=None if restart else log.preview,
        older=False if restart else log.older,
        prepended=0 if restart else log.prepended,
        note=notes.get(event.reason),
        generation=log.generation + 1 if restart else log.generation,
    )
