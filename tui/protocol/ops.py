"""The agent's ops as types: what each request carries and what its reply holds. Pure.

`tui.transport.AgentApi` has one method per op; it builds the request's arguments
here (`*.args()`, base64 included) and turns the agent's result object into the
reply type here (`*.parse(...)`), so nothing above the transport sees an op name,
a result dict or base64. A result that lacks what its type needs raises
`ProtocolError` (a `ValueError`).

A reply's records (a run, a kill's stages and GPUs, a prune's entries) are the types of
`tui.protocol.records`, parsed here once, their text sanitized there; paths, argv and
env stay as the host sent them where the client sends them back (`RunRecord.spec`).
`record` (a launch's, kill's or prune's) is the whole reply, host text sanitized, for
`--json` output only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tui.protocol.hosttext import clean, clean_tree
from tui.protocol.jsontypes import JSONObject, JSONValue
from tui.protocol.records import GpuFreed, KillStage, NodeProof, PruneEntry, RunRecord, integer, num

from . import ProtocolError, b64decode, b64encode


def _obj(result: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(result, Mapping):
        raise ProtocolError(f"{what}: the result is not an object")
    return result


def _int(obj: Mapping[str, Any], key: str, what: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"{what}: {key} is not an integer")
    return value


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


# -- each op's reply type, declared with its op -----------------------------------------

REPLIES: dict[str, type[Reply]] = {}  # op -> its reply type, filled by the declarations below


class Reply:
    """An op's reply type, declared with its op's name: `class Chunk(Reply, op="read_range")`.
    `AgentApi` sends `Chunk.op` and parses the result with `Chunk.parse`; `REPLIES` holds
    them all (tests/test_architecture.py holds it to the host's ops)."""

    op: ClassVar[str]

    def __init_subclass__(cls, op: str = "", **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if op:
            cls.op = op
            REPLIES[op] = cls


@dataclass(frozen=True)
class ActionReply(Reply):
    """The reply of an action op (declared `action` on the host: it may carry an action id
    and its outcome is kept there): what the state keeps as an action's result."""

    run_id: str | None


# -- logs and files --------------------------------------------------------------------


@dataclass(frozen=True)
class Subscribed(Reply, op="subscribe"):
    """`subscribe`: where following starts (a negative offset asked for a tail)."""

    offset: int
    inode: int | None
    size: int | None

    @classmethod
    def parse(cls, result: Any) -> Subscribed:
        obj = _obj(result, "subscribe")
        return cls(_int_or_none(obj.get("offset")) or 0, _int_or_none(obj.get("inode")),
                   _int_or_none(obj.get("size")))


@dataclass(frozen=True)
class Chunk(Reply, op="read_range"):
    """`read_range`: bytes ``[offset, offset+len(data))`` of a file of `size` bytes."""

    offset: int
    data: bytes
    size: int
    inode: int | None = None

    @property
    def end(self) -> int:
        return self.offset + len(self.data)

    @classmethod
    def parse(cls, result: Any) -> Chunk:
        obj = _obj(result, "read_range")
        return cls(_int(obj, "offset", "read_range"), b64decode(obj.get("b64"), "read_range"),
                   _int(obj, "size", "read_range"), _int_or_none(obj.get("inode")))


@dataclass(frozen=True)
class FileContent(Reply, op="file_read"):
    """`file_read`: a whole (small) file; `data` and `sha256` are None when it is missing."""

    exists: bool
    data: bytes | None
    sha256: str | None

    @classmethod
    def parse(cls, result: Any) -> FileContent:
        obj = _obj(result, "file_read")
        if not obj.get("exists"):
            return cls(False, None, None)
        return cls(True, b64decode(obj.get("b64"), "file_read"), _str_or_none(obj.get("sha256")))


@dataclass(frozen=True)
class FileWritten(Reply, op="file_write"):
    """`file_write`: the file's sha256 after the write."""

    sha256: str | None

    @classmethod
    def parse(cls, result: Any) -> FileWritten:
        return cls(_str_or_none(_obj(result, "file_write").get("sha256")))


@dataclass(frozen=True)
class PatchFile:
    """One file of a `patch_apply`: written only if its sha256 is still `expect_sha256`;
    `backup` (a path) gets the current bytes first when given."""

    path: str
    data: bytes
    expect_sha256: str | None
    backup: str | None = None

    def args(self) -> dict[str, object]:
        return {"path": self.path, "expect_sha256": self.expect_sha256, "backup": self.backup,
                "b64": b64encode(self.data)}


@dataclass(frozen=True)
class PatchApplied(Reply, op="patch_apply"):
    """`patch_apply`: each written file's new sha256, by path."""

    files: dict[str, str | None]

    @classmethod
    def parse(cls, result: Any) -> PatchApplied:
        files = _obj(result, "patch_apply").get("files") or []
        return cls({str(f.get("path")): _str_or_none(f.get("sha256"))
                    for f in files if isinstance(f, Mapping)})


@dataclass(frozen=True)
class ModuleLocation(Reply, op="resolve_module"):
    """`resolve_module`: where the host's Python finds a module (without importing it)."""

    origin: str | None
    version: str | None  # the distribution's version, when known

    @classmethod
    def parse(cls, result: Any) -> ModuleLocation:
        obj = _obj(result, "resolve_module")
        return cls(_str_or_none(obj.get("origin")) or None, _str_or_none(obj.get("version")))


@dataclass(frozen=True)
class Compiled(Reply, op="py_compile"):
    """`py_compile`: whether the host's Python compiles a source, and its error if not."""

    ok: bool
    error: str | None

    @classmethod
    def parse(cls, result: Any) -> Compiled:
        obj = _obj(result, "py_compile")
        return cls(bool(obj.get("ok")), None if obj.get("error") is None else str(obj["error"]))


@dataclass(frozen=True)
class DiskUsage(Reply, op="disk_usage"):
    """`disk_usage`: the space of the filesystem holding `path` (host text, sanitized)."""

    path: str
    total: int
    free: int

    LOW_FREE = 10 * 2**30  # under this many bytes free (or 5 %), a run's next checkpoint may not fit

    @property
    def low(self) -> bool:
        return self.free < max(self.LOW_FREE, self.total // 20)

    def summary(self) -> str:
        """One line, for the `D` key and `eagle3-tui runs df`."""
        gib = 2**30
        used = 100 * (self.total - self.free) // self.total if self.total else 0
        return (f"{self.path}: {self.free / gib:,.1f} GiB free of {self.total / gib:,.1f} GiB ({used}% used)"
                + ("; low: a checkpoint may not fit" if self.low else ""))

    @classmethod
    def parse(cls, result: Any) -> DiskUsage:
        obj = _obj(result, "disk_usage")
        return cls(clean(str(obj.get("path") or "?"), newline=False), _int(obj, "total", "disk_usage"),
                   _int(obj, "free", "disk_usage"))


# -- runs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunList(Reply, op="runs"):
    """`runs`: every run record on the host and the agent's one-line warnings (run dirs
    it refused)."""

    runs: tuple[RunRecord, ...]
    warnings: tuple[str, ...] = ()

    @classmethod
    def parse(cls, result: Any) -> RunList:
        obj = _obj(result, "runs")
        return cls(tuple(RunRecord.parse(r) for r in obj.get("runs") or [] if isinstance(r, dict)),
                   tuple(str(w) for w in obj.get("warnings") or []))


@dataclass(frozen=True)
class LaunchRequest:
    """What `launch` starts: argv in cwd with env, under the run's name; `scheduler`
    (Slurm's options) and `restart` (the supervisor's policy) only when there are some,
    so an older agent sees the request it knows."""

    name: str | None
    argv: Sequence[str]
    cwd: str | None
    env: Mapping[str, str]
    patch_state: JSONValue = None
    log: str | None = None
    scheduler: Mapping[str, object] | None = None
    restart: Mapping[str, object] | None = None

    def args(self) -> dict[str, object]:
        extra: dict[str, object] = {}
        if self.scheduler is not None:
            extra["scheduler"] = dict(self.scheduler)
        if self.restart is not None:
            extra["restart"] = dict(self.restart)
        return {**extra, "name": self.name, "argv": list(self.argv), "cwd": self.cwd,
                "env": dict(self.env), "patch_state": self.patch_state, "log": self.log}


@dataclass(frozen=True)
class LaunchReply(ActionReply, op="launch"):
    """`launch`: the new run's record (`run`; `record`: the reply for `--json`)."""

    pid: int | None
    job_id: str | None
    log: str | None
    run: RunRecord | None = None
    record: JSONObject = field(default_factory=dict)

    @classmethod
    def parse(cls, result: Any) -> LaunchReply:
        rec = _cleaned(result, "launch")
        job = rec.get("job_id")
        return cls(_str_or_none(rec.get("run_id")), _int_or_none(rec.get("pid")),
                   None if job is None else str(job), _str_or_none(rec.get("log")), RunRecord.parse(rec), rec)


@dataclass(frozen=True)
class KillReport(ActionReply, op="kill"):
    """`kill`: what was sent, what is left, whether the run's GPU memory is free
    (None: no GPU source to tell). `record`: the whole report for `--json`."""

    ok: bool
    stages: tuple[KillStage, ...] = ()
    remaining: tuple[int, ...] = ()
    gpus: tuple[GpuFreed, ...] = ()
    gpus_free: bool | None = None
    elapsed: float = 0.0
    note: str | None = None
    record: JSONObject = field(default_factory=dict)
    # a Slurm job on several nodes: each node's verdict
    node_proofs: tuple[NodeProof, ...] = ()

    @classmethod
    def parse(cls, result: Any) -> KillReport:
        rec = _cleaned(result, "kill")
        free = rec.get("gpus_free")
        return cls(
            run_id=_str_or_none(rec.get("run_id")), ok=bool(rec.get("ok")),
            stages=tuple(KillStage.parse(s) for s in _list(rec.get("stages")) if isinstance(s, Mapping)),
            remaining=tuple(p for p in _list(rec.get("remaining")) if isinstance(p, int)),
            gpus=tuple(GpuFreed.parse(g) for g in _list(rec.get("gpus")) if isinstance(g, Mapping)),
            gpus_free=free if isinstance(free, bool) else None,
            elapsed=num(rec.get("elapsed")) or 0.0, note=_str_or_none(rec.get("note")), record=rec,
            node_proofs=tuple(p for d in _list(rec.get("node_proofs")) if (p := NodeProof.parse(d)) is not None))


@dataclass(frozen=True)
class PruneReport(Reply, op="prune"):
    """`prune`: the ended runs removed (or that would be, in a dry run), those kept for
    a reason, and how many ended runs are left. `record`: the reply for `--json`."""

    removed: tuple[PruneEntry, ...]
    skipped: tuple[PruneEntry, ...]
    kept: int
    dry_run: bool
    record: JSONObject = field(default_factory=dict)

    @classmethod
    def parse(cls, result: Any) -> PruneReport:
        rec = _cleaned(result, "prune")
        return cls(tuple(PruneEntry.parse(r) for r in _list(rec.get("removed")) if isinstance(r, Mapping)),
                   tuple(PruneEntry.parse(r) for r in _list(rec.get("skipped")) if isinstance(r, Mapping)),
                   integer(rec.get("kept")) or 0, bool(rec.get("dry_run")), rec)


@dataclass(frozen=True)
class Outcome:
    """`outcomes`, for one action id: its state (running | done), and when done whether
    it succeeded with its result object (JSON still: the op's own reply type parses it)
    or its error."""

    state: str
    ok: bool = False
    result: JSONValue = None
    error: str | None = None

    @classmethod
    def parse_all(cls, result: Any) -> dict[str, Outcome]:
        found = _obj(result, "outcomes").get("outcomes") or {}
        if not isinstance(found, Mapping):
            raise ProtocolError("outcomes: outcomes is not an object")
        return {str(aid): cls(str(rec.get("state")), bool(rec.get("ok")), rec.get("result"),
                              None if rec.get("error") is None else str(clean_tree(rec["error"])))
                for aid, rec in found.items() if isinstance(rec, Mapping)}


def _list(value: JSONValue) -> list[JSONValue]:
    return value if isinstance(value, list) else []


def _cleaned(result: Any, what: str) -> JSONObject:
    """A reply's whole object, host text sanitized: what `--json` prints."""
    cleaned: JSONObject = clean_tree(dict(_obj(result, what)))
    return cleaned
