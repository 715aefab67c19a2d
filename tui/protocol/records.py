"""The host's records as the client reads them: frozen dataclasses, parsed once, here at
the protocol boundary, from the agent's JSON. Pure: no I/O.

Each record declares `KEYS`, the keys of the host's object it reads, and its parser reads
the object only through them (`_pick`): a key spelt wrong in a parser is a KeyError in
every test that parses one, not a silent N/A. tests/test_records.py runs the host's own
writers (its GPU readers, NVML and nvidia-smi, its process table, its run dirs, a kill)
and checks that every key they write is in `KEYS` or in `UNREAD` (written, left unread on
purpose), and that every key in `KEYS` is one the host writes.

A missing or malformed reading becomes None (shown as N/A), never 0, and every number
passes `hostjson.number` (finite, within bounds). Every text passes the one sanitizer
(`hosttext.clean`), so a table cell, a banner or `eagle3-tui runs` never meets an escape
or a control. The exceptions are the values the client sends back to the host byte for
byte: a run's `spec` (argv, cwd, env, for relaunch) and its `log` path (to follow it);
whatever shows a log path cleans it. `wire` (a run record's, a snapshot's) is the object
as the host sent it, kept only for `--json` output; nothing reads fields out of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, TypedDict

from tui.protocol import hostjson
from tui.protocol.hosttext import clean, clean_tree
from tui.protocol.jsontypes import JSONObject, JSONValue

__all__ = [
    "GpuFreed", "GpuProcReading", "GpuReading", "HostReading", "JobNode", "KillStage", "NodeProof",
    "ProcReading", "PruneEntry", "RunRecord", "RunSpec",
]


def _pick(d: object, keys: tuple[str, ...]) -> dict[str, JSONValue]:
    """The declared keys of a host object, None where absent (or when it is no object)."""
    src: Mapping[str, JSONValue] = d if isinstance(d, Mapping) else {}
    return {k: src.get(k) for k in keys}


def num(value: object) -> float | None:
    """A host's number as it came, when it is finite and within ``hostjson.NUMBER_MAX``
    (a 400-digit ``launched_at`` made every float() after it raise); else None."""
    if hostjson.number(value) is None:
        return None
    return value  # type: ignore[return-value]


def integer(value: object) -> int | None:
    v = num(value)
    return int(v) if v is not None else None


def _str(value: object) -> str | None:
    """A non-empty host string, sanitized; else None."""
    return clean(value, newline=False) if isinstance(value, str) and value else None


def _text(value: object) -> str | None:
    """A host string (possibly empty), sanitized; None when it is not a string."""
    return clean(value, newline=False) if isinstance(value, str) else None


def _texts(values: object) -> tuple[str, ...]:
    return tuple(clean(str(v), newline=False) for v in values) if isinstance(values, (list, tuple)) else ()


def _ints(values: object) -> tuple[int, ...]:
    return tuple(v for v in values if isinstance(v, int) and not isinstance(v, bool)) \
        if isinstance(values, (list, tuple)) else ()


def _objects(values: object) -> list[JSONObject]:
    return [v for v in values if isinstance(v, dict)] if isinstance(values, (list, tuple)) else []


# -- a snapshot's readings ---------------------------------------------------------------


@dataclass(frozen=True)
class GpuProcReading:
    """A process on a GPU and the memory it holds there (None: not readable)."""

    pid: int
    mem: int | None

    KEYS: ClassVar[tuple[str, ...]] = ("pid", "mem")

    @classmethod
    def parse(cls, d: object) -> GpuProcReading | None:
        """One {pid, mem}; a bare pid (an older agent's kill report) has no mem."""
        if isinstance(d, int) and not isinstance(d, bool):
            return cls(d, None)
        v = _pick(d, cls.KEYS)
        pid = integer(v["pid"])
        return None if pid is None else cls(pid, integer(v["mem"]))


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str | None
    uuid: str | None
    mem_used: int | None
    mem_total: int | None
    util: float | None
    temp: float | None
    power: float | None
    power_limit: float | None
    processes: tuple[GpuProcReading, ...] = ()
    node: str | None = None  # a followed Slurm job's node this GPU is on

    KEYS: ClassVar[tuple[str, ...]] = ("index", "name", "uuid", "mem_used", "mem_total", "util", "temp",
                                       "power", "power_limit", "processes", "node")

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
    def parse(cls, d: object, fallback_index: int) -> GpuReading:
        v = _pick(d, cls.KEYS)
        index = integer(v["index"])
        return cls(
            index=index if index is not None else fallback_index,
            name=_text(v["name"]),
            uuid=_text(v["uuid"]),
            mem_used=integer(v["mem_used"]),
            mem_total=integer(v["mem_total"]),
            util=num(v["util"]),
            temp=num(v["temp"]),
            power=num(v["power"]),
            power_limit=num(v["power_limit"]),
            processes=tuple(p for x in _objects(v["processes"]) if (p := GpuProcReading.parse(x)) is not None),
            node=_text(v["node"]),
        )


@dataclass(frozen=True)
class ProcReading:
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

    KEYS: ClassVar[tuple[str, ...]] = ("pid", "ppid", "pgid", "sid", "user", "state", "cpu", "rss",
                                       "start_time", "elapsed", "cmdline", "why", "run_id", "node")

    @classmethod
    def parse(cls, d: object) -> ProcReading | None:
        """None for a record without a pid (the reducer drops it)."""
        v = _pick(d, cls.KEYS)
        pid = v["pid"]
        if not isinstance(pid, int) or isinstance(pid, bool) or integer(pid) is None:
            return None
        return cls(
            pid=pid,
            ppid=integer(v["ppid"]),
            pgid=integer(v["pgid"]),
            sid=integer(v["sid"]),
            user=_text(v["user"]),
            state=_text(v["state"]),
            cpu=num(v["cpu"]),
            rss=integer(v["rss"]),
            start_time=num(v["start_time"]),
            elapsed=num(v["elapsed"]),
            cmdline=_texts(v["cmdline"]),
            why=_texts(v["why"]),
            run_id=_text(v["run_id"]),
            node=_text(v["node"]),
        )


@dataclass(frozen=True)
class JobNode:
    """One node of a followed Slurm job: where its view comes from, or why there is none."""

    node: str
    via: str | None = None  # "srun step 12.1 on gpu-node3"
    error: str | None = None  # its agent did not start or ended ("starting" while it starts)

    KEYS: ClassVar[tuple[str, ...]] = ("node", "via", "error")

    @classmethod
    def parse(cls, d: object) -> JobNode | None:
        v = _pick(d, cls.KEYS)
        node = _text(v["node"])
        return None if node is None else cls(node, _text(v["via"]), _text(v["error"]))


@dataclass(frozen=True)
class HostReading:
    hostname: str | None = None
    load: tuple[float, ...] | None = None
    cpu_count: int | None = None
    mem_total: int | None = None
    mem_available: int | None = None
    uptime: float | None = None

    KEYS: ClassVar[tuple[str, ...]] = ("hostname", "load", "cpu_count", "mem_total", "mem_available", "uptime")

    @classmethod
    def parse(cls, d: object) -> HostReading:
        v = _pick(d, cls.KEYS)
        load = [num(x) for x in v["load"]] if isinstance(v["load"], list) else [None]
        return cls(
            hostname=_text(v["hostname"]),
            load=tuple(float(x) for x in load if x is not None) if None not in load else None,
            cpu_count=integer(v["cpu_count"]),
            mem_total=integer(v["mem_total"]),
            mem_available=integer(v["mem_available"]),
            uptime=num(v["uptime"]),
        )


# -- a run -------------------------------------------------------------------------------


class RunSpec(TypedDict):
    """A run's argv, cwd and env exactly as the host sent them (a relaunch sends them back)."""

    argv: list[str]
    cwd: str | None
    env: dict[str, str]


@dataclass(frozen=True)
class RunRecord:
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
    pace: JSONObject | None = field(default=None, compare=False)  # the host's record (remote/run/pace.py)
    # a run with a restart policy (remote/run/restart.py): restarts so far, every attempt's
    # record, when the pending restart starts (None unless waiting), and the last decision
    restarts: int = 0
    attempts: tuple[JSONObject, ...] = field(default=(), compare=False)
    restart_at: float | None = None
    restart_note: str | None = None
    max_restarts: int | None = None
    # the host's history (remote/run/history.py): this argv's last loads there, median; how many
    expected_load_s: float | None = None
    expected_load_runs: tuple[str, ...] = ()  # the run ids that median is of
    duration: float | None = None  # seconds from start to end (or to now while it runs)
    wire: JSONObject = field(default_factory=dict, compare=False, repr=False)  # as sent: `--json` only

    KEYS: ClassVar[tuple[str, ...]] = (
        "run_id", "name", "state", "argv", "pid", "launched_at", "start_time", "ended_at", "exit_code",
        "signal", "patch_state", "external", "log", "cwd", "env", "error", "log_note", "disk_full",
        "write_error", "job_id", "slurm_state", "slurm_reason", "nodes", "pace", "restarts", "attempts",
        "restart_at", "restart_note", "max_restarts", "expected_load_s", "expected_load_runs", "duration")
    # written by the host, read by the client only through `wire` (`--json`) or not at all
    UNREAD: ClassVar[tuple[str, ...]] = (
        "pgid", "sid", "start_ticks", "shim_pid", "shim_start_ticks", "host", "user", "scheduler",
        "slurm_note", "node_gpus", "boot_id", "boot_time", "subreaper")

    @property
    def alive(self) -> bool:
        """Running, or queued in Slurm: it may yet hold GPUs, so it is killable."""
        return self.state in ("running", "pending")

    @classmethod
    def parse(cls, d: object) -> RunRecord:
        v = _pick(d, cls.KEYS)
        argv, env, cwd, log, runs = v["argv"], v["env"], v["cwd"], v["log"], v["expected_load_runs"]
        return cls(
            run_id=clean(str(v["run_id"] if v["run_id"] is not None else "?"), newline=False),
            name=clean(str(v["name"] or ""), newline=False),
            state=clean(str(v["state"] or "unknown"), newline=False),
            argv=_texts(argv),
            pid=integer(v["pid"]),
            launched_at=num(v["launched_at"]) or num(v["start_time"]),
            ended_at=num(v["ended_at"]),
            exit_code=integer(v["exit_code"]),
            signal=_text(v["signal"]),
            patch_state=clean_tree(v["patch_state"]),
            external=bool(v["external"]),
            log=log if isinstance(log, str) else None,
            cwd=_text(cwd),
            env={clean(str(k), newline=False): clean(str(x), newline=False) for k, x in env.items()}
            if isinstance(env, dict) else {},
            error=_text(v["error"]),
            log_note=_text(v["log_note"]),
            disk_full=v["disk_full"] is True,
            write_error=_text(v["write_error"]),
            job_id=_str(v["job_id"]),
            slurm_state=_str(v["slurm_state"]),
            slurm_reason=_str(v["slurm_reason"]),
            nodes=_str(v["nodes"]),
            pace=clean_tree(v["pace"]) if isinstance(v["pace"], dict) else None,
            spec=RunSpec(argv=[str(a) for a in argv] if isinstance(argv, list) else [],
                         cwd=cwd if isinstance(cwd, str) else None,
                         env={str(k): str(x) for k, x in env.items()} if isinstance(env, dict) else {}),
            restarts=integer(v["restarts"]) or 0,
            attempts=tuple(clean_tree(a) for a in _objects(v["attempts"])),
            restart_at=num(v["restart_at"]),
            restart_note=_str(v["restart_note"]),
            max_restarts=integer(v["max_restarts"]),
            expected_load_s=num(v["expected_load_s"]),
            expected_load_runs=tuple(clean(r, newline=False) for r in runs if isinstance(r, str))
            if isinstance(runs, list) else (),
            duration=num(v["duration"]),
            wire=dict(d) if isinstance(d, dict) else {},
        )


# -- a kill's report and a prune's -------------------------------------------------------


@dataclass(frozen=True)
class KillStage:
    """One step of a kill: a signal sent to processes, or scancel of a Slurm job."""

    signal: str
    at: float
    sent_to: tuple[int, ...] = ()
    job_id: str | None = None

    KEYS: ClassVar[tuple[str, ...]] = ("signal", "at", "sent_to", "job_id")

    @classmethod
    def parse(cls, d: object) -> KillStage:
        v = _pick(d, cls.KEYS)
        return cls(str(v["signal"]), num(v["at"]) or 0.0, _ints(v["sent_to"]),
                   None if v["job_id"] is None else str(v["job_id"]))


@dataclass(frozen=True)
class GpuFreed:
    """One GPU after a kill (a kill's progress: during it): memory freed, what the run
    still holds, who else uses it."""

    index: int | None
    freed: int | None
    run_pids: tuple[int, ...] = ()
    run_mem: int | None = None
    other_pids: tuple[GpuProcReading, ...] = ()  # older agents sent bare pids: mem None
    node: str | None = None  # a Slurm job's node where this GPU was read (several: each names its own)
    run_mem_before: int | None = None

    KEYS: ClassVar[tuple[str, ...]] = ("index", "freed", "run_pids", "run_mem", "other_pids", "node",
                                       "run_mem_before")

    @classmethod
    def parse(cls, d: object) -> GpuFreed:
        v = _pick(d, cls.KEYS)
        others = v["other_pids"] if isinstance(v["other_pids"], (list, tuple)) else ()
        return cls(integer(v["index"]), integer(v["freed"]), _ints(v["run_pids"]), integer(v["run_mem"]),
                   tuple(p for x in others if (p := GpuProcReading.parse(x)) is not None),
                   _text(v["node"]), integer(v["run_mem_before"]))


@dataclass(frozen=True)
class NodeProof:
    """A Slurm job on several nodes: one node's verdict after a kill."""

    node: str
    via: str | None
    gpus_free: bool | None
    error: str | None

    KEYS: ClassVar[tuple[str, ...]] = ("node", "via", "gpus_free", "error")

    @classmethod
    def parse(cls, d: object) -> NodeProof | None:
        v = _pick(d, cls.KEYS)
        free = v["gpus_free"]
        node = v["node"]
        return None if not isinstance(node, str) else cls(
            clean(node, newline=False), _text(v["via"]), free if isinstance(free, bool) else None, _text(v["error"]))


@dataclass(frozen=True)
class PruneEntry:
    """One ended run a prune removed (or would), or kept with its reason."""

    run_id: str
    name: str | None
    state: str | None
    ended_at: float | None
    reason: str | None = None  # why it was kept (skipped only)

    KEYS: ClassVar[tuple[str, ...]] = ("run_id", "name", "state", "ended_at", "reason")

    @classmethod
    def parse(cls, d: object) -> PruneEntry:
        v = _pick(d, cls.KEYS)
        return cls(clean(str(v["run_id"]), newline=False), _text(v["name"]), _text(v["state"]),
                   num(v["ended_at"]), _text(v["reason"]))
