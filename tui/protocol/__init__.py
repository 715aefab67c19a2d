"""The agent protocol: message types and parsing of agent lines. Pure (no I/O).

One JSON object per line. See docs/architecture.md, "Agent protocol", for the
shapes. A snapshot's payloads become the records of `tui.protocol.records` here, once
(their text sanitized there); nothing above reads the agent's dicts. The texts that are
only ever shown (the hello's, errors, a log
reset's reason, a kill's stage) pass `hosttext.clean` here; paths and results stay as
the host sent them, since the client sends them back.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any, Union

from tui.protocol.hosttext import clean
from tui.protocol.jsontypes import JSONObject
from tui.protocol.records import GpuFreed, GpuReading, HostReading, JobNode, ProcReading, RunRecord

PROTOCOL_VERSION = 1


class ProtocolError(ValueError):
    """A line from the agent that is not a valid protocol message."""


@dataclass(frozen=True)
class Hello:
    protocol: int
    agent_version: str
    agent_sha: str
    hostname: str
    python: str
    pid: int
    time: float
    gpu_source: str | None
    gpu_error: str | None
    capabilities: tuple[str, ...] = ()
    # what this agent's start did to a patch push another agent left unfinished (one line
    # each: rolled back, and each file someone else changed since; remote/agent/journal.py)
    patch_recovery: tuple[str, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    seq: int
    time: float
    host: HostReading
    gpus: tuple[GpuReading, ...]
    processes: tuple[ProcReading, ...]
    runs: tuple[RunRecord, ...]
    gpu_source: str | None = None
    gpu_error: str | None = None
    # a followed Slurm job's nodes, each with where its view comes from or why there is none
    job_nodes: tuple[JobNode, ...] = ()
    # A periodic snapshot's every run id, in order, with `runs` only those that changed
    # since the last one (the others as they were: the reducer keeps them); None: `runs`
    # is all of them (remote/agent/rundelta.py)
    run_ids: tuple[str, ...] | None = None
    wire: JSONObject = field(default_factory=dict, compare=False, repr=False)  # as sent: `--json` only

    def as_dict(self) -> JSONObject:
        """The snapshot as the agent sent it (without `type`), for JSON output."""
        out: JSONObject = {k: self.wire.get(k) for k in ("seq", "time", "host", "gpu_source", "gpu_error",
                                                          "gpus", "processes", "runs")}
        out.update(seq=self.seq, time=self.time)
        if self.wire.get("job_nodes"):
            out["job_nodes"] = self.wire["job_nodes"]
        return out


@dataclass(frozen=True)
class LogData:
    sub: str
    path: str
    inode: int | None
    offset: int
    data: bytes

    @property
    def end(self) -> int:
        """The resume offset after this chunk."""
        return self.offset + len(self.data)


@dataclass(frozen=True)
class LogReset:
    sub: str
    path: str
    reason: str  # truncated | rotated | missing | appeared
    inode: int | None
    offset: int = 0


@dataclass(frozen=True)
class Result:
    id: int
    ok: bool
    result: JSONObject = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class KillProgress:
    id: int
    run_id: str
    stage: str
    alive: tuple[int, ...]
    gpus: tuple[GpuFreed, ...]  # index and run_mem each, so far
    elapsed: float


@dataclass(frozen=True)
class AgentError:
    message: str


Message = Union[Hello, Snapshot, LogData, LogReset, Result, KillProgress, AgentError]


def _req(obj: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in obj:
        raise ProtocolError(f"{obj.get('type', '?')} message lacks {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(f"{obj.get('type', '?')}.{key} has the wrong type")
    return value


def b64decode(value: Any, what: str) -> bytes:
    """The bytes of a base64 field of the agent's (a log chunk, a read_range or file_read
    result): the one place the client decodes base64. ProtocolError when it is not."""
    if not isinstance(value, str):
        raise ProtocolError(f"{what}: b64 is not a string")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise ProtocolError(f"bad base64 in {what}: {exc}") from None


def b64encode(data: bytes) -> str:
    """Bytes for a request's `b64` field (file_write, py_compile, patch_apply)."""
    return base64.b64encode(data).decode()


def _b64(obj: dict[str, Any]) -> bytes:
    return b64decode(_req(obj, "b64", str), str(obj.get("type")))


def _shown(value: Any) -> str:
    """A text of the host that is only shown: sanitized, on one line."""
    return clean(str(value), newline=False)


def _recovery_lines(rec: Any) -> tuple[str, ...]:
    """The hello's `patch_recovered` ({lines} or {error}, or null) as lines to show."""
    if not isinstance(rec, dict):
        return ()
    lines = rec.get("lines")
    if not isinstance(lines, list):
        lines = [rec.get("error") or ""]
    return tuple(_shown(line)[:500] for line in lines[:50] if line)


def _maybe(value: Any) -> str | None:
    return None if value is None else clean(str(value))


def parse_message(obj: Any) -> Message:
    """Turn one decoded JSON object into a message dataclass. Whatever the object holds
    (a broken or hostile agent's wrong types too), the only error is ProtocolError."""
    if not isinstance(obj, dict):
        raise ProtocolError("agent line is not a JSON object")
    try:
        return _parse_message(obj)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        raise ProtocolError(f"agent sent a malformed {clean(str(obj.get('type')), newline=False)[:40]!r} message: "
                            f"{type(exc).__name__}: {clean(str(exc), newline=False)[:120]}") from None


def _list(obj: dict[str, Any], key: str) -> list[Any]:
    value = obj.get(key) or []
    if not isinstance(value, list):
        raise ProtocolError(f"{obj.get('type', '?')}.{key} has the wrong type")
    return value


def _seq(value: Any) -> list[Any]:
    """A list the agent may leave out or get wrong: what is not a list is none."""
    return value if isinstance(value, list) else []


def _parse_message(obj: dict[str, Any]) -> Message:
    kind = obj.get("type")
    num = (int, float)
    if kind == "hello":
        return Hello(
            protocol=_req(obj, "protocol", int),
            agent_version=_shown(obj.get("agent_version", "?")),
            agent_sha=_shown(obj.get("agent_sha", "")),
            hostname=_shown(obj.get("hostname", "?")),
            python=_shown(obj.get("python", "?")),
            pid=int(obj.get("pid") or 0),
            time=float(obj.get("time") or 0.0),
            gpu_source=_maybe(obj.get("gpu_source")),
            gpu_error=_maybe(obj.get("gpu_error")),
            capabilities=tuple(obj.get("capabilities") or ()),
            patch_recovery=_recovery_lines(obj.get("patch_recovered")),
        )
    if kind == "snapshot":
        gpus = tuple(GpuReading.parse(g, i) for i, g in enumerate(_list(obj, "gpus")) if isinstance(g, dict))
        return Snapshot(
            seq=_req(obj, "seq", int),
            time=float(_req(obj, "time", num)),
            host=HostReading.parse(_req(obj, "host", dict) if "host" in obj else {}),
            gpus=gpus,
            processes=tuple(p for d in _list(obj, "processes") if (p := ProcReading.parse(d)) is not None),
            runs=tuple(RunRecord.parse(r) for r in _list(obj, "runs") if isinstance(r, dict)),
            gpu_source=_maybe(obj.get("gpu_source")),
            gpu_error=_maybe(obj.get("gpu_error")),
            job_nodes=tuple(n for d in _seq(obj.get("job_nodes")) if (n := JobNode.parse(d)) is not None),
            run_ids=tuple(_shown(i) for i in _list(obj, "run_ids")) if "run_ids" in obj else None,
            wire={k: v for k, v in obj.items() if k != "type"},
        )
    if kind == "log":
        return LogData(
            sub=_req(obj, "sub", str),
            path=str(obj.get("path", "")),
            inode=obj.get("inode"),
            offset=_req(obj, "offset", int),
            data=_b64(obj),
        )
    if kind == "log_reset":
        return LogReset(
            sub=_req(obj, "sub", str),
            path=str(obj.get("path", "")),
            reason=_shown(obj.get("reason", "?")),
            inode=obj.get("inode"),
            offset=int(obj.get("offset") or 0),
        )
    if kind == "result":
        return Result(
            id=_req(obj, "id", int),
            ok=bool(obj.get("ok")),
            result=obj.get("result") or {},  # the op's reply type parses it (tui/protocol/ops.py)
            error=None if obj.get("error") is None else clean(str(obj["error"])),
        )
    if kind == "kill_progress":
        return KillProgress(
            id=_req(obj, "id", int),
            run_id=_shown(obj.get("run_id", "")),
            stage=_shown(obj.get("stage", "")),
            alive=tuple(obj.get("alive") or ()),
            gpus=tuple(GpuFreed.parse(g) for g in _seq(obj.get("gpus")) if isinstance(g, dict)),
            elapsed=float(obj.get("elapsed") or 0.0),
        )
    if kind == "error":
        return AgentError(message=clean(str(obj.get("message", ""))))
    raise ProtocolError(f"unknown message type {kind!r}")


def parse_line(line: str | bytes) -> Message:
    """Parse one line from the agent's stdout."""
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        text = line[:80] if isinstance(line, str) else line[:80].decode("utf-8", "replace")
        raise ProtocolError(f"agent sent a line that is not JSON: {text!r} "
                            f"({exc.msg if hasattr(exc, 'msg') else exc})") from None
    return parse_message(obj)


def encode_request(req_id: int, op: str, args: dict[str, Any]) -> bytes:
    """One request line for the agent's stdin."""
    return (json.dumps({"id": req_id, "op": op, "args": args}, separators=(",", ":")) + "\n").encode()
