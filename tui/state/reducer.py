"""`apply(state, event, now) -> state`: the one place agent events change the client state.

Pure: the caller passes the clock (`now`) so tests replay events deterministically.
Link status events come from the transport (`tui.transport.LinkStatus`); they are
matched by shape (`state`, `attempt`, `error`) so this module does not import it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tui import protocol as p
from tui.state import logparse, watch
from tui.state.model import (
    HISTORY,
    LOG_LINES,
    AppState,
    Gpu,
    Host,
    KillView,
    Link,
    LogTail,
    Proc,
    Run,
)


def apply(state: AppState, event: Any, now: float) -> AppState:
    """Return the state after `event`; unknown events leave it unchanged."""
    if isinstance(event, p.Snapshot):
        return watch.update_state(_snapshot(state, event, now), now)
    if isinstance(event, (p.LogData, p.LogReset)):
        if state.log.sub is not None and event.sub != state.log.sub:
            return state  # a chunk of the log followed before, still in flight
        log = feed_log(state.log, event, now) if isinstance(event, p.LogData) else reset_log(state.log, event)
        return replace(state, log=log, link=_seen(state.link, now))
    if isinstance(event, p.Hello):
        agent = f"agent {event.agent_version} ({event.agent_sha[:8]}) on Python {event.python}"
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
        return replace(state, kill=kill)
    if isinstance(event, p.AgentError):
        return replace(state, message=event.message)
    if hasattr(event, "state") and hasattr(event, "attempt"):  # transport LinkStatus
        link = Link(
            state=str(event.state),
            attempt=int(event.attempt),
            error=getattr(event, "error", None),
            last_data=state.link.last_data,
        )
        return replace(state, link=link)
    return state


def _seen(link: Link, now: float) -> Link:
    return replace(link, last_data=now) if link.state == "connected" else link


def _snapshot(state: AppState, snap: p.Snapshot, now: float) -> AppState:
    gpus = tuple(Gpu.from_dict(g, i) for i, g in enumerate(snap.gpus) if isinstance(g, dict))
    gpu_mem: dict[int, int] = {}
    for gpu in gpus:
        for gp in gpu.processes:
            if gp.mem is not None:
                gpu_mem[gp.pid] = gpu_mem.get(gp.pid, 0) + gp.mem
    procs = []
    for d in snap.processes:
        if isinstance(d, dict) and isinstance(d.get("pid"), int):
            proc = Proc.from_dict(d)
            procs.append(replace(proc, gpu_mem=gpu_mem.get(proc.pid)))
    history = dict(state.gpu_history)
    for gpu in gpus:
        past = history.get(gpu.index, ())
        history[gpu.index] = (past + ((gpu.mem_fraction, gpu.util),))[-HISTORY:]
    return replace(
        state,
        host=Host.from_dict(snap.host),
        hostname=snap.host.get("hostname") or state.hostname,
        gpus=gpus,
        gpu_source=snap.gpu_source,
        gpu_error=snap.gpu_error,
        gpu_history=history,
        processes=tuple(procs),
        runs=tuple(Run.from_dict(r) for r in snap.runs if isinstance(r, dict)),
        snapshot_time=snap.time,
        seq=snap.seq,
        link=_seen(state.link, now),
    )


def feed_log(log: LogTail, event: p.LogData, now: float) -> LogTail:
    """Append a chunk. A chunk that does not continue the stream is ignored (duplicate)."""
    data = event.data
    if log.inode is not None and event.inode == log.inode and event.offset < log.offset:
        if event.end <= log.offset:
            return log  # already have these bytes (replayed after a reconnect)
        data = data[log.offset - event.offset :]  # keep only the bytes not seen yet
    lines, partial = logparse.split_lines(log.partial, data)
    analysis = log.analysis if log.analysis is not None else logparse.LogAnalysis()
    line_no = log.total_lines
    for line in lines:
        line_no += 1
        analysis = logparse.step(analysis, line, line_no, now)
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
        live=logparse.live_segment(partial),
        analysis=analysis,
        note=None,
    )


def reset_log(log: LogTail, event: p.LogReset) -> LogTail:
    """The byte stream restarts: keep the old lines on screen, number new ones from 1."""
    notes = {
        "missing": f"waiting for {event.path} to appear",
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
        note=notes.get(event.reason),
        generation=log.generation + 1 if restart else log.generation,
    )
