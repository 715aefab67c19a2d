"""The client's view of one host, as frozen dataclasses. Pure: no I/O, no Textual.

The host's records (its GPUs, processes, runs, a job's nodes) come typed and sanitized
from the protocol (`tui.protocol.records`, parsed once where the agent's lines are); the
reducer folds them into `AppState` here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tui.protocol.ops import ActionReply, KillReport
from tui.protocol.records import GpuFreed, GpuReading, HostReading, JobNode, ProcReading, RunRecord
from tui.state.advice import RunSummary
from tui.state.loganalysis.record import LogAnalysis
from tui.state.watchstate import WatchState

HISTORY = 300  # samples of GPU history kept per card (5 min at 1 Hz)
LOG_LINES = 1000  # lines of log tail kept in memory
PREVIEW_LINES = 400  # the newest lines of a first tail analysed at once (`LogTail.preview`)


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
    gpus: tuple[GpuFreed, ...]
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
    host: HostReading = field(default_factory=HostReading)
    gpu_source: str | None = None
    gpu_error: str | None = None
    gpus: tuple[GpuReading, ...] = ()
    gpu_history: dict[int | tuple[str, int], tuple[tuple[float | None, float | None], ...]] = field(
        default_factory=dict
    )  # Gpu.key -> ((mem_fraction, util), ...) oldest first
    job_nodes: tuple[JobNode, ...] = ()  # a followed Slurm job's nodes, each shown or saying why not
    processes: tuple[ProcReading, ...] = ()
    runs: tuple[RunRecord, ...] = ()
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

    def live_runs(self) -> tuple[RunRecord, ...]:
        return tuple(r for r in self.runs if r.alive)

    def run(self, run_id: str | None) -> RunRecord | None:
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
