"""The typed agent API (tui/transport/api.py over tui/protocol/ops.py): each method sends
the op and args the agent reads (remote/agent/main.py), byte for byte the wire it always was,
and turns the result into its reply type; a result that lacks what its type needs is a
ProtocolError, never a KeyError deep in a caller."""

from __future__ import annotations

from typing import Any

import pytest

from tui.protocol import KillProgress, ProtocolError, Snapshot
from tui.protocol.ops import (
    Chunk,
    KillReport,
    LaunchReply,
    LaunchRequest,
    Outcome,
    PatchFile,
)
from tui.protocol.records import RunRecord
from tui.transport import AgentApi


class Wire(AgentApi):
    """Records (op, args) and answers from a table: the agent as the client sees it."""

    def __init__(self, answers: dict[str, Any] | None = None) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.answers = answers or {}

    async def call_with_progress(self, op: str, on_event: Any, **args: Any) -> dict[str, Any]:
        self.sent.append((op, args))
        if on_event is not None:
            on_event(KillProgress(1, "r1", "SIGINT", (5,), (), 0.1))
        return self.answers.get(op, {})


async def test_each_method_sends_the_args_the_agent_reads() -> None:
    w = Wire({"read_range": {"offset": 0, "b64": "", "size": 0, "inode": None},
              "file_read": {"exists": False}, "kill": {"run_id": "r1", "ok": True}})
    await w.configure(0.5, "x.py", None)
    await w.subscribe("log1", "/srv/x.log", -4096)
    await w.unsubscribe("log1")
    await w.read_range("/srv/x.log", 10, 20)
    await w.file_read("/a")
    await w.file_write("/a", b"\xff", "abc", "/a.bak")
    await w.patch_apply([PatchFile("/a", b"hi", None, "/a.p")], "v2")
    await w.resolve_module("pkg.mod", "python3")
    await w.py_compile(b"x = 1\n", "/a.py", None)
    await w.launch(LaunchRequest("job", ["python", "x.py"], "~", {"A": "1"}, None, None), "act1")
    await w.launch(LaunchRequest("job", ["python"], None, {}, {"set": "s"}, "/l", {"kind": "slurm"},
                                 {"restart": "never"}))
    seen: list[KillProgress] = []
    await w.kill("r1", (10, 10), 30, "act2", seen.append)
    await w.prune(None, 3, True, {"E": "1"})
    await w.outcomes(["act1"], None)
    await w.runs()
    assert w.sent == [
        ("configure", {"interval": 0.5, "match": "x.py", "runs_dir": None}),
        ("subscribe", {"sub": "log1", "path": "/srv/x.log", "offset": -4096, "inode": None}),
        ("unsubscribe", {"sub": "log1"}),
        ("read_range", {"path": "/srv/x.log", "offset": 10, "length": 20}),
        ("file_read", {"path": "/a"}),
        ("file_write", {"path": "/a", "b64": "/w==", "expect_sha256": "abc", "backup": "/a.bak"}),
        ("patch_apply", {"files": [{"path": "/a", "expect_sha256": None, "backup": "/a.p", "b64": "aGk="}],
                         "target": "v2"}),
        ("resolve_module", {"python": "python3", "module": "pkg.mod"}),
        ("py_compile", {"python": None, "filename": "/a.py", "b64": "eCA9IDEK"}),
        ("launch", {"action": "act1", "name": "job", "argv": ["python", "x.py"], "cwd": "~", "env": {"A": "1"},
                    "patch_state": None, "log": None}),  # no scheduler, no restart: what an older agent knows
        ("launch", {"scheduler": {"kind": "slurm"}, "restart": {"restart": "never"}, "name": "job",
                    "argv": ["python"], "cwd": None, "env": {}, "patch_state": {"set": "s"}, "log": "/l"}),
        ("kill", {"run_id": "r1", "graces": [10, 10], "gpu_wait": 30, "action": "act2"}),
        ("prune", {"older_than": None, "keep": 3, "dry_run": True, "env": {"E": "1"}}),
        ("outcomes", {"ids": ["act1"], "runs_dir": None}),
        ("runs", {}),
    ]
    assert [p.stage for p in seen] == ["SIGINT"]  # progress reaches the caller as typed events


async def test_replies_are_typed_and_host_text_in_reports_is_clean() -> None:
    w = Wire({
        "read_range": {"offset": 4, "b64": "aGVsbG8=", "size": 9, "inode": 7},
        "snapshot": {"seq": 3, "time": 1.0, "host": {}, "gpus": [], "processes": [], "runs": []},
        "kill": {"run_id": "r1", "ok": False, "remaining": [12], "gpus_free": False, "elapsed": 2.5,
                 "stages": [{"signal": "SIGINT", "at": 0.0, "sent_to": [12]}],
                 "gpus": [{"index": 0, "freed": 10, "run_pids": [12], "run_mem": 5, "other_pids": []}],
                 "note": "bad\x1b[31m"},
        "launch": {"run_id": "r2", "pid": 42, "log": "/l", "job_id": 17},
        "outcomes": {"outcomes": {"a": {"state": "done", "ok": True, "result": {"run_id": "r2"}}, "b": None}},
    })
    assert await w.read_range("/x", 4, 5) == Chunk(4, b"hello", 9, 7)
    snap = await w.snapshot()
    assert isinstance(snap, Snapshot) and snap.seq == 3 and "type" not in snap.as_dict()
    report = await w.kill("r1", (1, 1), 0)
    assert isinstance(report, KillReport) and not report.ok and report.remaining == (12,)
    assert report.stages[0].sent_to == (12,) and report.gpus[0].run_pids == (12,)
    assert report.note == "bad" and report.record["note"] == "bad"  # no escape reaches a screen
    launched = await w.launch(LaunchRequest("j", ["x"], None, {}))
    wire = {"run_id": "r2", "pid": 42, "log": "/l", "job_id": 17}
    assert launched == LaunchReply("r2", 42, "17", "/l", RunRecord.parse(wire), wire)
    assert launched.run is not None and (launched.run.run_id, launched.run.pid, launched.run.log) == ("r2", 42, "/l")
    assert await w.outcomes(["a", "b"]) == {"a": Outcome("done", True, {"run_id": "r2"}, None)}


@pytest.mark.parametrize("answer", [
    {"offset": 0, "b64": "not base64!", "size": 1},
    {"offset": 0, "b64": "aGk=", "inode": 1},  # no size
    {"b64": "aGk=", "size": 2},  # no offset
    ["not", "an", "object"],
])
async def test_a_result_that_lacks_what_its_type_needs_is_a_protocol_error(answer: Any) -> None:
    with pytest.raises(ProtocolError):
        await Wire({"read_range": answer}).read_range("/x", 0, 2)
