"""The client's view of one host, as frozen dataclasses. Pure: no I/O, no Textual.

`from_dict` helpers turn the agent's plain dicts into these types; a missing or
malformed reading becomes None (shown as N/A), never 0. This is where the host's
records enter the client's state, so every text in them passes the one sanitizer
(`tui.protocol.hosttext.clean`) here: a table cell, a banner or `eagle3-tui runs` never
meets an escape or a control. The exceptions are the values the client sends back to
the host byte for byte: a run's `spec` (argv, cwd, env, for relaunch) and its `log`
path (to follow it); whatever shows a log path cleans it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TypedDict

from tui.protocol import hostjson
from tui.protocol.hosttext import clean, clean_tree
from tui.protocol.jsontypes import JSONObject, JSONValue
from tui.protocol.ops import ActionReply, KillReport
from tui.state.advice import RunSummary
from tui.state.loganalysis.record import LogAnalysis
from tui.state.watchstate import WatchState

HISTORY = 300  # samples of GPU history kept per card (5 min at 1 Hz)
LOG_LINES = 1000  # lines of log tail kept in memory
PREVIEW_LINES = 400  # the newest lines of a first tail analysed at once (`LogTail.preview`)


def _num(value: object) -> float | None:
    """A host's number as it came, when it is finite and within ``hostjson.NUMBER_MAX``
    (a 400-digit ``launched_at`` made every float() after it raise); else None."""
    if hostjson.number(value) is None:
        return None
    return value  # type: ignore[return-value]


def _int(value: object) -> int | None:
    v = _num(value)
    return int(v) if v is not None else None


def _str(value: object) -> str | None:
    """A non-empty host string, sanitized; else None."""
    return clean(value, newline=False) if isinstance(value, str) and value else None


def _text(value: object) -> str | None:
    """A host string (possibly empty), sanitized; None when it is not a string."""
    return clean(value, newline=False) if isinstance(value, str) else None


def _texts(values: object) -> tuple[str, ...]:
    return tuple(clean(str(v), newline=False) for v in values) if isinstance(values, (list, tuple)) else ()


@dataclass(frozen=True)
class GpuProc:
    pid: int
    mem: int | None


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str | None
    uuid: str | None
    mem_used: int | None
    mem_total: int | None
    util: float | None
    temp: float | None
    power: float | None
    power_limit: float | None
    processes: tuple[GpuProc, ...] = ()
    node: str | None = None  # a followed Slurm job's node this GPU is on

    @property
    def key(self) -> int | tuple[str, int]:
        """The GPU among a snapshot's: its index, with its node on a job of several."""
        return self.index if self.node is None else (self.node, self.index)

    @property
    def mem_fraction(self) -> float | None:
        if self.mem_used is None or not self.mem_total:
            return None
        return self.mem_used / self.mem_total

    @classmethod
    def from_dict(cls, d: Mapping[str, object], fallback_index: int) -> Gpu:
        raw = d.get("processes")
        procs = tuple(
            GpuProc(pid=pid, mem=_int(p.get("mem")))
            for p in (raw if isinstance(raw, list) else ())
            if isinstance(p, dict) and (pid := _int(p.get("pid"))) is not None
        )
        index = _int(d.get("index"))
        return cls(
            index=index if index is not None else fallback_index,
            name=_text(d.get("name")),
            uuid=_text(d.get("uuid")),
            mem_used=_int(d.get("mem_used")),
            mem_total=_int(d.get("mem_total")),
            util=_num(d.get("util")),
            temp=_num(d.get("temp")),
            power=_num(d.get("power")),
            power_limit=_num(d.get("power_limit")),
            processes=procs,
            node=_text(d.get("node")),
        )


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int | None
    pgid: int | None
    sid: int | None
    user: str | None
    state: str | None
    cpu: float | None
    rss: int | None
    start_time: float | None
    elapsed: float | None
    cmdline: tuple[str, ...]
    why: tuple[str, ...]
    run_id: str | None
    gpu_mem: int | None = None  # summed over GPUs, filled by the reducer
    node: str | None = None  # a followed Slurm job's node this process runs on

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Proc:
        pid = _int(d.get("pid"))
        if pid is None:
            raise ValueError("a process record without a pid")
        return cls(
            pid=pid,
            ppid=_int(d.get("ppid")),
            pgid=_int(d.get("pgid")),
            sid=_int(d.get("sid")),
            user=_text(d.get("user")),
            state=_text(d.get("state")),
            cpu=_num(d.get("cpu")),
            rss=_int(d.get("rss")),
            start_time=_num(d.get("start_time")),
            elapsed=_num(d.get("elapsed")),
            cmdline=_texts(d.get("cmdline")),
            why=_texts(d.get("why")),
            run_id=_text(d.get("run_id")),
            node=_text(d.get("node")),
        )


@dataclass(frozen=True)
class JobNode:
    """One node of a followed Slurm job: where its view comes from, or why there is none."""

    node: str
    via: str | None = None  # "srun step 12.1 on gpu-node3"
    error: str | None = None  # its agent did not start or ended ("starting" while it starts)

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> JobNode | None:
        node = _text(d.get("node"))
        return None if node is None else cls(node, _text(d.get("via")), _text(d.get("error")))


@dataclass(frozen=True)
class Host:
    hostname: str | None = None
    load: tuple[float, ...] | None = None
    cpu_count: int | None = None
    mem_total: int | None = None
    mem_available: int | None = None
    uptime: float | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Host:
        load = d.get("load")
        return cls(
            hostname=_text(d.get("hostname")),
            load=tuple(float(x) for x in load) if isinstance(load, list) and all(_num(x) is not None for x in load)
            else None,
            cpu_count=_int(d.get("cpu_count")),
            mem_total=_int(d.get("mem_total")),
            mem_available=_int(d.get("mem_available")),
            uptime=_num(d.get("uptime")),
        )


class RunSpec(TypedDict):
    """A run's argv, cwd and env exactly as the host sent them (a relaunch sends them back)."""

    argv: list[str]
    cwd: str | None
    env: dict[str, str]


@dataclass(frozen=True)
class Run:
    run_id: str
    name: str
    state: str
    argv: tuple[str, ...]
    pid: int | None
    launched_at: float | None
    ended_at: float | None
    exit_code: int | None
    signal: str | None
    patch_state: JSONValue  # the host's record of the patch applied at launch
    external: bool
    log: str | None  # raw: the path the client asks the host to follow; clean it to show it
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    # raw argv, cwd and env as the host sent them: a relaunch sends these back byte for byte
    spec: RunSpec | None = field(default=None, compare=False)  # None: not from a host record
    error: str | None = None  # why it failed to start (state "failed", no process)
    log_note: str | None = None  # why an adopted run has no log file ("stdout is a pipe")
    disk_full: bool = False  # the host's disk was full when the run's end was recorded
    write_error: str | None = None  # why the exit record went to its reserve ("no space … in DIR")
    job_id: str | None = None  # a Slurm run's job; the fields below are Slurm's word on it
    slurm_state: str | None = None  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT…
    slurm_reason: str | None = None  # why a job waits (Resources, Priority, JobHeldUser…)
    nodes: str | None = None  # the node list Slurm allocated
    pace: JSONObject | None = field(default=None, compare=False)  # the host's record (remote/pace.py)
    # a run with a restart policy (remote/restart.py): restarts so far, every attempt's
    # record, when the pending restart starts (None unless waiting), and the last decision
    restarts: int = 0
    attempts: tuple[JSONObject, ...] = field(default=(), compare=False)
    restart_at: float | None = None
    restart_note: str | None = None
    max_restarts: int | None = None
    # the host's history (remote/history.py): this argv's last loads there, median; how many
    expected_load_s: float | None = None
    expected_load_runs: int = 0

    @property
    def alive(self) -> bool:
        """Running, or queued in Slurm: it may yet hold GPUs, so it is killable."""
        return self.state in ("running", "pending")

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Run:
        argv, env, cwd, log, attempts = d.get("argv"), d.get("env"), d.get("cwd"), d.get("log"), d.get("attempts")
        return cls(
            run_id=clean(str(d.get("run_id", "?")), newline=False),
            name=clean(str(d.get("name") or ""), newline=False),
            state=clean(str(d.get("state") or "unknown"), newline=False),
            argv=_texts(argv),
            pid=_int(d.get("pid")),
            launched_at=_num(d.get("launched_at")) or _num(d.get("start_time")),
            ended_at=_num(d.get("ended_at")),
            exit_code=_int(d.get("exit_code")),
            signal=_text(d.get("signal")),
            patch_state=clean_tree(d.get("patch_state")),
            external=bool(d.get("external")),
            log=log if isinstance(log, str) else None,
            cwd=_text(d.get("cwd")),
            env={clean(str(k), newline=False): clean(str(v), newline=False) for k, v in env.items()}
            if isinstance(env, dict) else {},
            error=_text(d.get("error")),
            log_note=_text(d.get("log_note")),
            disk_full=d.get("disk_full") is True,
            write_error=_text(d.get("write_error")),
            job_id=_str(d.get("job_id")),
            slurm_state=_str(d.get("slurm_state")),
            slurm_reason=_str(d.get("slurm_reason")),
            nodes=_str(d.get("nodes")),
            pace=clean_tree(d.get("pace")) if isinstance(d.get("pace"), dict) else None,
            spec=RunSpec(argv=[str(a) for a in argv] if isinstance(argv, list) else [],
                         cwd=cwd if isinstance(cwd, str) else None,
                         env={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}),
            restarts=_int(d.get("restarts")) or 0,
            attempts=tuple(clean_tree(a) for a in attempts if isinstance(a, dict))
            if isinstance(attempts, list) else (),
            restart_at=_num(d.get("restart_at")),
            restart_note=_str(d.get("restart_note")),
            max_restarts=_int(d.get("max_restarts")),
            expected_load_s=_num(d.get("expected_load_s")),
            expected_load_runs=len(runs) if isinstance(runs := d.get("expected_load_runs"), list) else 0,
        )


@dataclass(frozen=True)
class Link:
    """Connection state as the screen shows it."""

    state: str = "connecting"  # connecting | connected | reconnecting | failed | closed
    attempt: int = 0
    error: str | None = None
    last_data: float | None = None  # client clock time of the last agent message


@dataclass(frozen=True)
class LogTail:
    path: str | None = None
    sub: str | None = None  # the subscription feeding it; events of another are stale
    inode: int | None = None
    offset: int = 0  # resume point: bytes of this inode already received
    lines: tuple[str, ...] = ()
    first_line_no: int = 1  # line number of lines[0] in the file (since the last reset)
    partial: bytes = b""
    live: str = ""  # the current unterminated line's latest `\r` redraw
    analysis: LogAnalysis | None = None
    note: str | None = None  # "waiting for /x.log to appear", "log was truncated"
    generation: int = 0  # bumped each time the byte stream restarts (truncate/rotate)
    # With `defer`, a chunk of more than ANALYSE_SLICE lines (the first tail, a burst) is
    # shown at once and folded into `analysis` later, a slice per `AnalyseLog` event:
    # (number of the first line, arrival time, lines) not analysed yet, oldest first.
    defer: bool = False
    tail_end: int | None = None  # the file's size at subscribe: the first tail is in at this offset
    # `older`: the lines before the first tail are still being fetched (the analysis waits
    # for them, they come first); `prepended`: how many came (not drawn by the pane).
    older: bool = False
    prepended: int = 0
    backlog: tuple[tuple[int, float, tuple[str, ...]], ...] = ()
    # While the backlog is analysed (seconds on a long log), the newest lines' own
    # analysis: the first tail's last PREVIEW_LINES and every line since, so the progress
    # panel shows the log's latest step, loss and phase from the first frame, not the
    # older lines' being folded in. None once the backlog is in (`shown_analysis`).
    preview: LogAnalysis | None = None

    @property
    def catching_up(self) -> bool:
        """The analysis is behind the lines received (older bytes or a backlog to fold)."""
        return self.older or bool(self.backlog)

    @property
    def shown_analysis(self) -> LogAnalysis | None:
        """What the progress panel shows: the analysis, or while it catches up the preview."""
        return self.preview if self.catching_up and self.preview is not None else self.analysis

    @property
    def total_lines(self) -> int:
        return self.first_line_no - 1 + len(self.lines)


@dataclass(frozen=True)
class KillView:
    run_id: str
    stage: str
    alive: tuple[int, ...]
    gpus: tuple[JSONObject, ...]
    elapsed: float
    report: KillReport | None = None
    error: str | None = None


@dataclass(frozen=True)
class PushResult:
    """A patch push's (or rollback's) outcome: the version it moved to; `unknown` when
    the link was lost before the reply (only the host's files can tell)."""

    version: str
    unknown: bool = False


ActionResult = ActionReply | PushResult  # an action op's reply (tui/protocol/ops.py), or a push's


@dataclass(frozen=True)
class Action:
    """A kill, launch, relaunch or patch push: in flight, or ended, under its own id.

    `state`: running | unconfirmed (the link dropped before the reply; the client asks
    the agent for the outcome after the reconnect) | ok | failed."""

    action_id: str
    kind: str  # kill | launch | relaunch | push
    run_id: str | None
    state: str = "running"
    started_at: float = 0.0
    ended_at: float | None = None
    progress: KillView | None = None  # the latest kill_progress of a kill
    result: ActionResult | None = None  # the kill's report, the new run's record, the push's version
    error: str | None = None
    confirmed_after_reconnect: bool = False

    @property
    def done(self) -> bool:
        return self.state in ("ok", "failed")


@dataclass(frozen=True)
class Settings:
    """What the screen and the selection rule need from eagle3.toml (re-read on l/r)."""

    name: str | None = None  # `[run] name`: runs "of this config"
    log: str | None = None  # `[run] log`
    has_command: bool = False
    interval: float = 1.0  # the agent's snapshot interval: liveness is judged against it
    error: str | None = None  # the config as re-read is broken: one line for the banner
    config: str = "the config"  # the file read, or "no config file at PATH" (Config.source)


@dataclass(frozen=True)
class AppState:
    target: str = "local"
    link: Link = field(default_factory=Link)
    hostname: str | None = None
    agent: str | None = None  # "agent 0.1.0 (3f2a…) on Python 3.10"
    host: Host = field(default_factory=Host)
    gpu_source: str | None = None
    gpu_error: str | None = None
    gpus: tuple[Gpu, ...] = ()
    gpu_history: dict[int | tuple[str, int], tuple[tuple[float | None, float | None], ...]] = field(
        default_factory=dict
    )  # Gpu.key -> ((mem_fraction, util), ...) oldest first
    job_nodes: tuple[JobNode, ...] = ()  # a followed Slurm job's nodes, each shown or saying why not
    processes: tuple[Proc, ...] = ()
    runs: tuple[Run, ...] = ()
    snapshot_time: float | None = None
    seq: int = -1
    log: LogTail = field(default_factory=LogTail)
    message: str | None = None  # last agent error line
    settings: Settings = field(default_factory=Settings)
    cursor: str | None = None  # the run the user put the Runs table's cursor on
    show_all: bool = False  # `a`: every run on the host, not only this config's
    actions: tuple[Action, ...] = ()  # newest last; ended ones are kept a while
    summaries: dict[str, RunSummary] = field(default_factory=dict)  # by run_id
    applied_patch: str | None = None  # "v5", "pristine", … on the host now
    version_order: tuple[str, ...] = ()
    notices: tuple[tuple[int, str, str], ...] = ()  # (serial, severity, text) to notify once
    notice_serial: int = 0
    watch: WatchState | None = None  # stall/hang/end detection (tui/state/watch.py), when enabled

    def live_runs(self) -> tuple[Run, ...]:
        return tuple(r for r in self.runs if r.alive)

    def run(self, run_id: str | None) -> Run | None:
        return next((r for r in self.runs if r.run_id == run_id), None)

    def action(self, action_id: str | None) -> Action | None:
        return next((a for a in self.actions if a.action_id == action_id), None)

    @property
    def kill(self) -> KillView | None:
        """The newest kill as the banner shows it: its progress, then its report."""
        act = next((a for a in reversed(self.actions) if a.kind == "kill"), None)
        if act is None:
            return None
        view = act.progress or KillView(run_id=act.run_id or "?", stage="", alive=(), gpus=(), elapsed=0.0)
        report = act.result if isinstance(act.result, KillReport) else None
        if act.state == "ok" and report is not None:
            return replace(view, run_id=report.run_id or view.run_id, stage="done", report=report)
        if act.state == "failed":
            return replace(view, error=act.error or "failed", report=report)
        return view

    @property
    def busy(self) -> Action | None:
        """The kill or launch in flight (or unconfirmed): one at a time."""
        return next((a for a in self.actions if not a.done and a.kind != "push"), None)
