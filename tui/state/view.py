"""The view model: pure functions from `AppState` to what is shown.

The dashboard's widgets and the CLI's `status`, `runs`, `kill` and `relaunch` both
read their rows, texts and verdicts from here, so the two never disagree. Nothing
here does I/O or imports Textual.

**The run-selection rule** (`select_run`, the only one): an explicit run id, else the
run under the Runs table's cursor (put there by the user), else the newest live run
of this config, else the newest run of this config. A run is "of this config" when it
was launched under `[run] name` (with no name configured, every managed run is). Runs
adopted through `[run] match` (external, started by hand) come only when this config
never launched a run here: the newest live one, then the newest. Another config's run
is chosen only by naming it (or putting the cursor on it after `a`). A run whose
`launched_at` lies more than `FUTURE_SKEW_S` after the host's time (a clock gone wrong,
or a record someone wrote) never wins by default: it is chosen only by naming it (or by
the cursor); when every run of the pool is such, none is chosen.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tui.protocol.ops import KillReport, LaunchReply
from tui.protocol.records import RunRecord
from tui.state import advice as advisor
from tui.state import watch as watcher
from tui.state.format import duration, gib, size
from tui.state.model import Action, AppState, PushResult

NO_LOG_NOTE = "no log file: stdout is a pipe/terminal"


# ---- selection ----------------------------------------------------------------------


def newest_first(runs: tuple[RunRecord, ...] | list[RunRecord]) -> list[RunRecord]:
    return sorted(runs, key=lambda r: (r.launched_at or 0.0, r.run_id), reverse=True)


def of_config(state: AppState) -> tuple[RunRecord, ...]:
    name = state.settings.name
    if not name:
        return state.runs
    return tuple(r for r in state.runs if r.name == name or r.external)


def visible_runs(state: AppState) -> tuple[RunRecord, ...]:
    """The Runs table: this config's runs and adopted ones, or every run after `a`."""
    return state.runs if state.show_all else of_config(state)


FUTURE_SKEW_S = 120.0  # how far a run's launch may lie past the host's time (clock skew)


def from_the_future(run: RunRecord, now: float | None) -> bool:
    """Launched more than FUTURE_SKEW_S after `now` (the host's time of the snapshot)."""
    return now is not None and run.launched_at is not None and run.launched_at > now + FUTURE_SKEW_S


def select_run(state: AppState, explicit: str | None = None) -> RunRecord | None:
    """The run an action or view applies to (see the module docstring).

    An explicit id that names no run gives None: never a substitute."""
    if explicit:
        return state.run(explicit)
    chosen = state.run(state.cursor)
    if chosen is not None:
        return chosen
    mine = [r for r in of_config(state) if not r.external]
    adopted = [r for r in of_config(state) if r.external]
    for pool in (mine, adopted):
        if pool:  # this config's runs, when it launched any (even from the future)
            pool = newest_first([r for r in pool if not from_the_future(r, state.snapshot_time)])
            live = [r for r in pool if r.alive]
            return (live or pool)[0] if pool else None
    return None


# ---- rows ---------------------------------------------------------------------------


def state_label(run: RunRecord) -> str:
    """As shown everywhere: an exit with a non-zero code is a failure; a run whose end
    could not be recorded because the host's disk is full is "disk full", not "lost"; a
    live run whose host supervisor waits to restart it is "waiting"."""
    if run.state == "lost" and run.disk_full:
        return "disk full"
    if run.alive and run.restart_at is not None:  # a Slurm run waits as its next job, pending
        return "waiting"
    return "failed" if run.state == "exited" and run.exit_code not in (0, None) else run.state


def restart_label(run: RunRecord, now: float) -> str:
    """What the host's restart policy did with a run: '' for a run that never needed it;
    "waiting to restart in 25s (restart 2 of 3) — last: NCCL collective timed out at
    batch 1,203/4,000", "restarted 2× — last: …", or why it was not restarted."""
    tried = [a for a in run.attempts if a.get("ended_at") is not None]
    failed = [a for a in tried if a.get("exit_code") != 0 or a.get("hung")]
    if not failed:
        return ""
    last = watcher.attempt_cause(failed[-1])
    if run.restart_at is not None and run.alive:
        of = f" of {run.max_restarts}" if run.max_restarts is not None else ""
        left = max(0, int(run.restart_at - now))
        return f"waiting to restart in {duration(left)} (restart {run.restarts}{of}) — last: {last}"
    said = f"restarted {run.restarts}× — last: {last}" if run.restarts else last
    note = run.restart_note or ""
    if not run.alive and note and note not in ("finished", "killed"):
        said += f"; {note}"
    return said


def exit_label(run: RunRecord) -> str:
    return str(run.exit_code) if run.exit_code is not None else (run.signal or "")


def patch_label(run: RunRecord) -> str:
    ps = run.patch_state
    return str((ps.get("version") or ps.get("state") or "-") if isinstance(ps, dict) else "-")


def slurm_label(run: RunRecord) -> str:
    """A Slurm run's job and Slurm's state: `job 12 PENDING (Resources)`, `job 12 RUNNING
    on node3`, `job 12 FAILED exit 3`; '' for a run not launched through Slurm."""
    if run.job_id is None:
        return ""
    st = run.slurm_state or "state unknown"
    text = f"job {run.job_id} {st}"
    if run.slurm_reason and st == "PENDING":
        text += f" ({run.slurm_reason})"
    if run.nodes and st in ("RUNNING", "COMPLETING"):
        text += f" on {run.nodes}"
    if st not in ("PENDING", "RUNNING", "COMPLETING") and (run.exit_code or run.signal):
        text += f" exit {exit_label(run)}"
    return text


@dataclass(frozen=True)
class RunRow:
    run_id: str
    name: str
    state: str
    started: str
    duration: str
    exit: str
    patch: str
    note: str
    pid: str
    job: str = ""  # slurm_label(): the job id and Slurm's state, '' for a local run


def run_row(run: RunRecord, note: str, now: float) -> RunRow:
    started = "N/A"
    if run.launched_at:
        today = time.localtime(now)[:3] == time.localtime(run.launched_at)[:3]
        started = time.strftime("%H:%M:%S" if today else "%m-%d %H:%M", time.localtime(run.launched_at))
    end = run.ended_at or (now if run.alive else None)
    dur = duration(end - run.launched_at) if end and run.launched_at else "N/A"
    job = slurm_label(run)
    again = restart_label(run, now)
    if again and note.startswith(again.split(" — ")[-1]):
        note = ""
    note = "; ".join(x for x in (again, note) if x)
    return RunRow(
        run_id=run.run_id, name=run.name or "", state=state_label(run), started=started,
        duration=dur, exit=exit_label(run), patch=patch_label(run),
        note="; ".join(x for x in (job, note) if x),  # the table and `runs` show the job first
        pid=str(run.pid) if run.pid is not None else "N/A", job=job,
    )


def run_rows(state: AppState, now: float, runs: tuple[RunRecord, ...] | None = None) -> list[RunRow]:
    """Rows of the Runs table (or of `eagle3-tui runs`), newest first."""
    notes = run_notes(state)
    runs = visible_runs(state) if runs is None else runs
    return [run_row(r, notes.get(r.run_id, ""), now) for r in newest_first(runs)]


def run_notes(state: AppState) -> dict[str, str]:
    """The FAILURE / NOTE column: root causes, runs that did not start, live runs that
    stalled (the watched run's own watch, any other's pace as the host recorded it), and
    live runs made stale by a newer patch version applied since they were launched."""
    notes = {  # a killed run's KeyboardInterrupt traceback is not its failure
        rid: s.failure_title
        for rid, s in state.summaries.items()
        if s.failure_title and s.outcome != "killed"
    }
    run = select_run(state)
    root = getattr(state.log.analysis, "root_cause", None)
    if run is not None and root is not None and state.log.path is not None and state.log.path == wanted_log(state)[0]:
        notes[run.run_id] = root.title
    for r in state.runs:
        if r.error:
            notes[r.run_id] = f"did not start: {r.error}"
        elif r.write_error:  # the end was recorded in its reserved space, or not at all
            notes.setdefault(r.run_id, f"{'disk full' if r.disk_full else 'exit record'}: {r.write_error}")
        elif r.external and not r.log and r.alive:
            notes.setdefault(r.run_id, r.log_note or NO_LOG_NOTE)
    w = state.watch
    now = time.time()
    cfg = w.config if w is not None else None
    for r in state.live_runs():  # runs this client has not watched: the host's pace says
        if w is None or r.run_id != w.run_id:
            seen = watcher.assess(r, cfg, now)
            if seen is not None and (what := seen.describe(now)) is not None:
                notes.setdefault(r.run_id, f"{seen.condition.upper()}: {what}")
    if w is not None and w.run_id is not None and (what := w.describe(now)) is not None:
        notes[w.run_id] = f"{w.condition.upper()}: {what}"
    order = ["pristine", *state.version_order]
    if state.applied_patch in order:
        for r in state.live_runs():
            _, version = advisor.patch_key(r.patch_state)
            if version in order and order.index(version) < order.index(state.applied_patch):
                notes[r.run_id] = f"STALE: launched with {version}, {state.applied_patch} applied now"
    return notes


# ---- the log and the phase ----------------------------------------------------------


def wanted_log(state: AppState) -> tuple[str | None, str | None]:
    """(path to follow, note when there is none) for the selected run: its own log
    (an absolute path from its manifest, or the file its stdout goes to for an adopted
    run), never another run's; with no run, `[run] log`."""
    run = select_run(state)
    if run is None:
        return state.settings.log, None
    if run.log:
        return run.log, None
    if run.external:
        return None, f"run {run.run_id}: {run.log_note or NO_LOG_NOTE}"
    return state.settings.log, None


def analysis_of(state: AppState, run: RunRecord | None) -> Any:
    """The followed log's analysis, or None while the followed log is not ``run``'s own
    (a run just launched and selected, its log not followed yet: the analysis is still the
    previous run's, and its finished training must not show under the new run's name)."""
    if run is not None and run.log and state.log.path != run.log:
        return None
    return state.log.shown_analysis


def phase(state: AppState, run: RunRecord | None, now: float) -> str | None:
    a = analysis_of(state, run)
    ph = getattr(a, "phase", None)
    if run is not None and run.state == "killed":
        return "killed"
    if run is not None and run.alive and run.restart_at is not None:
        return "waiting to restart"  # the host's supervisor: the attempt failed, the next is due
    w = state.watch  # tui.state.watch: stalled / hung, from the run's own pace
    if run is not None and w is not None and w.run_id == run.run_id and w.condition in ("stalled", "hung"):
        return str(w.condition)
    div = watcher.diverged(run, a) if run is not None else None
    root = getattr(a, "root_cause", None)
    if div is not None and (root is None or root.id == div.get("id")):
        return "diverged"  # the log's (or the host's pace's) verdict: remote/run/diverge.py
    return ph


def progress_label(run: RunRecord | None, now: float | None = None) -> str:
    if run is None:
        return "no run"
    again = restart_label(run, time.time() if now is None else now)
    return f"run {run.run_id} ({run.state})" + (f" — {again}" if again else "")


# ---- liveness -----------------------------------------------------------------------


def stale_after(state: AppState) -> float:
    """Two missed snapshot intervals plus one second."""
    return 2 * state.settings.interval + 1.0


def link_text(state: AppState, now: float) -> tuple[str, str]:
    """(text, kind) of the connection: kind is ok | warn | error."""
    link = state.link
    age = None if link.last_data is None else max(0.0, now - link.last_data)
    if link.state == "connected":
        if age is not None and age > stale_after(state):
            return f"stale for {duration(round(age))}", "warn"
        return "connected", "ok"
    if link.state == "reconnecting":
        old = f", data {duration(round(age))} old" if age is not None else ""
        return f"lost: reconnecting (attempt {link.attempt}){old}", "warn"
    if link.state == "failed":
        return f"lost: {link.error or 'link failed'}", "error"
    return link.state, "warn"


# ---- actions ------------------------------------------------------------------------


def kill_verdict(report: KillReport) -> str:
    took = f"{report.elapsed:.1f} s"
    where = f" ({report.note})" if report.note else ""  # e.g. where the proof was read: a Slurm job's node
    return {
        True: f"GPUs free after {took}{where}",
        False: f"GPUs NOT free after {took}{where}",
        None: f"done in {took} (" + (report.note or "no GPU source to check memory") + ")",
    }[report.gpus_free]


def describe_kill(report: KillReport) -> list[str]:
    """Human lines for a kill report (CLI output and the banner)."""
    lines = []
    for st in report.stages:
        if st.job_id is not None:  # a Slurm run: scancel, not signals to pids
            lines.append(f"{st.signal} {st.job_id} at {st.at:.1f} s")
            continue
        lines.append(f"{st.signal}: sent to {len(st.sent_to)} process(es) {list(st.sent_to)}")
    left = report.remaining
    lines.append("processes left: " + (", ".join(map(str, left)) if left else "none"))
    several = len(report.node_proofs) > 1
    for proof in report.node_proofs if several else ():  # a job on several nodes: each one's verdict
        free = proof.gpus_free
        verdict = "GPUs free" if free is True else "GPUs NOT free" if free is False else "no proof"
        why = proof.error or proof.via
        lines.append(f"{proof.node}: {verdict}" + (f" ({why})" if why else ""))
    for g in report.gpus:
        where = f"{g.node} " if g.node and several else ""
        before = f" (held {size(g.run_mem_before)} before, {size(g.run_mem)} after)" if where else ""
        text = f"{where}GPU {g.index}: freed {size(g.freed)}{before}"
        if g.run_pids:
            text += f"; the run still holds {size(g.run_mem)} in pid " + ", ".join(str(pid) for pid in g.run_pids)
        if g.other_pids:
            text += "; also in use by pid " + ", ".join(
                f"{o.pid} ({size(o.mem)})" for o in g.other_pids
            )
        lines.append(text)
    return [f"run {report.run_id} killed, {kill_verdict(report)}"] + lines


def launched_text(record: LaunchReply) -> str:
    """What `launch` / `relaunch` print for the new run's record."""
    if record.job_id:
        label = slurm_label(record.run) if record.run is not None else f"job {record.job_id}"
        return f"submitted run {record.run_id} as Slurm {label}, log {record.log}"
    return f"launched run {record.run_id} (pid {record.pid}), log {record.log}"


def whose(run: RunRecord) -> str:
    """`pid 123` or `Slurm job 12`: what a confirmation names the run by."""
    return f"Slurm job {run.job_id}" if run.job_id else f"pid {run.pid}"


def already_ended(run: RunRecord) -> str:
    """What `k` / `eagle3-tui kill` say for a run that is not running."""
    if run.state == "exited":
        return f"run {run.run_id} already exited ({exit_label(run) or '?'})"
    if run.state == "killed":
        return f"run {run.run_id} already killed" + (f" ({run.signal})" if run.signal else "")
    if run.state == "failed":
        return f"run {run.run_id} never started: {run.error or 'failed'}"
    if run.job_id is not None and run.state == "lost":
        return f"run {run.run_id} (Slurm job {run.job_id}) is gone from Slurm: nothing to cancel"
    return f"run {run.run_id} is {run.state}: no process to kill"


def action_text(act: Action) -> str:
    """One line for an action's state: the notification, the banner's first line, the CLI."""
    after = " (confirmed after reconnect)" if act.confirmed_after_reconnect else ""
    res = act.result
    if act.state == "running":
        return f"{act.kind} {act.run_id or ''}: in progress".replace("  ", " ")
    if act.state == "unconfirmed":
        return f"{act.kind} {act.run_id or ''}: link lost ({act.error}); asking the host after reconnect"
    version = res.version if isinstance(res, PushResult) else None
    if act.state == "failed" and isinstance(res, PushResult) and res.unknown:
        # A push is several file writes: after a lost link only the host's files can tell.
        return f"patch {version}: outcome unknown, the link was lost ({act.error}); press r to re-read the host"
    if act.state == "failed":
        what = f"patch {version}" if act.kind == "push" else f"{act.kind} {act.run_id or ''}".strip()
        return f"{what} failed: {act.error or 'unknown error'}{after}"
    if act.kind == "kill":
        report = res if isinstance(res, KillReport) else KillReport(run_id=None, ok=True)
        rid = report.run_id or act.run_id
        if not report.ok:
            left = ", ".join(map(str, report.remaining)) or "?"
            return f"run {rid} NOT killed: processes left {left}{after}"
        return f"run {rid} killed, {kill_verdict(report)}{after}"
    record = res if isinstance(res, LaunchReply) else LaunchReply(None, None, None, None)
    if act.kind in ("launch", "relaunch") and record.job_id:
        return f"submitted run {record.run_id} as Slurm job {record.job_id}{after}"
    if act.kind in ("launch", "relaunch"):
        return f"launched run {record.run_id} (pid {record.pid}){after}"
    if act.kind == "push":
        return f"patch {version} pushed, hashes verified{after}"
    return f"{act.kind} done{after}"


def kill_confirm_lines(state: AppState, run: RunRecord, graces: tuple[float, float]) -> list[str]:
    """The kill confirmation: host, run, PIDs, GPU memory at stake, the signals."""
    pids = run_pids(state, run)
    per_gpu = []
    for g in state.gpus:
        mine = [gp.mem for gp in g.processes if gp.pid in pids]
        if mine:
            held = None if None in mine else sum(m or 0 for m in mine)
            per_gpu.append(f"GPU{g.index} {gib(held)} GiB")
    pending = ([f"Restart: the pending restart (in {max(0, int(run.restart_at - time.time()))} s) is cancelled;"
                " nothing starts later."] if run.restart_at is not None else [])
    return [
        f"host:   {state.hostname or state.target}",
        f"run:    {run.run_id}  {run.name}" + ("  (external, no manifest)" if run.external else ""),
        f"argv:   {clip(' '.join(run.argv), 70)}",
        f"PIDs:   {', '.join(map(str, pids[:16]))}" + (" …" if len(pids) > 16 else ""),
        "GPU memory at stake: " + (", ".join(per_gpu) if per_gpu else "none seen"),
        f"Signals: SIGINT, then SIGTERM after {graces[0]:.0f} s, then SIGKILL after {graces[1]:.0f} s more."
        if run.job_id is None else
        f"Slurm job {run.job_id}: scancel --signal=TERM, then plain scancel after {sum(graces):.0f} s.",
        *pending,
    ]


def run_pids(state: AppState, run: RunRecord) -> list[int]:
    pids = [pr.pid for pr in state.processes if pr.run_id == run.run_id]
    if run.pid is not None and run.pid not in pids:
        pids.insert(0, run.pid)
    return pids


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


# ---- the banner ---------------------------------------------------------------------


def advice(state: AppState, now: float, patch_set: str | None) -> advisor.Advice | None:
    run = select_run(state)
    if run is None or not run.alive:
        return None
    log = state.log
    analysis = log.analysis if log.path is not None and log.path in (run.log, state.settings.log) else None
    return advisor.advise(run, analysis, state.summaries, state.applied_patch, list(state.version_order),
                          now, patch_set=patch_set)


KILL_BANNER_S = 60.0  # how long a finished action's verdict stays in the banner


def _action_banner(state: AppState, act: Any, now: float) -> tuple[str, str] | None:
    """The banner of a kill in flight or just ended, or of an unconfirmed action."""
    if act is not None and act.kind == "kill" and (not act.done or now - (act.ended_at or now) < KILL_BANNER_S):
        kill = state.kill
        if act.state == "ok" and isinstance(act.result, KillReport):
            lines = describe_kill(act.result)
            lines[0] = action_text(act)
            ok = act.result.ok and act.result.gpus_free is not False
            return "  ·  ".join(lines), "ok" if ok else "error"
        if act.done or act.state == "unconfirmed":
            return action_text(act), "error" if act.done else ""
        if kill is not None and kill.stage:
            mems = [g.run_mem for g in kill.gpus]
            held = None if not mems or None in mems else sum(m or 0 for m in mems)
            return (f"Killing run {kill.run_id}: {kill.stage} · {len(kill.alive)} process(es) left"
                    f" · GPU memory held {size(held)} · {kill.elapsed:.1f} s"), ""
        return f"Killing run {act.run_id}…", ""
    if act is not None and act.state == "unconfirmed":
        return action_text(act), ""
    return None


def banner(state: AppState, now: float, patch_set: str | None = None) -> tuple[str | None, str]:
    """(text or None, kind: '' | 'ok' | 'error'), by priority: an action in flight or
    just ended, a broken config, a link in trouble, the advisor's warning. A link in
    trouble is never hidden: an action's banner carries it too ("stale for 12 s")."""
    act = state.actions[-1] if state.actions else None
    shown = _action_banner(state, act, now)
    if shown is not None:
        text, kind = shown
        link, link_kind = link_text(state, now)
        if link_kind != "ok":  # a kill asked of a frozen agent: both must be read
            return f"{text}  ·  ⚠ {link}", "error" if link_kind == "error" or kind == "error" else kind
        return text, kind
    if state.settings.error:
        return f"config: {state.settings.error} — nothing launches until it is fixed", "error"
    text, kind = link_text(state, now)
    if kind != "ok":
        return text, "error" if kind == "error" else ""
    adv = advice(state, now, patch_set)
    if adv is not None:
        return f"⚠ {adv.text}  — press k to kill", "error"
    w = state.watch
    if w is not None and (what := w.describe(now)) is not None:
        return f"⚠ run {w.run_id} {w.condition}: {what}", "error"
    return None, ""
