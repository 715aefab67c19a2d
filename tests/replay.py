"""A replay client for UI tests: the same interface as `tui.transport.AgentClient`,
fed with recorded agent messages instead of a live agent.

Only the dashboard's tests use it, to render exact GPU counts (0, 2, 8) that this
machine cannot produce; every other test talks to the real agent.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from tui import protocol as p
from tui.transport import AgentApi

FIXTURES = Path(__file__).parent / "fixtures"


def hello(**over: Any) -> p.Hello:
    base = dict(protocol=1, agent_version="0.1.0", agent_sha="0" * 64, hostname="gpu-box",
                python="3.10.12", pid=4242, time=1764460000.0, gpu_source="nvml", gpu_error=None,
                capabilities=("snapshot", "logs"))
    base.update(over)
    return p.Hello(**base)


def gpu(i: int, used_gib: float = 81.0, util: int | None = 97) -> dict[str, Any]:
    return {"index": i, "name": "NVIDIA H200", "uuid": f"GPU-{i:08d}", "mem_used": int(used_gib * 2**30),
            "mem_total": 150_754_820_096, "util": util, "temp": 55 + i, "power": 400.0 + 10 * i,
            "power_limit": 700.0, "processes": [{"pid": 1000 + i, "mem": int(used_gib * 2**30) - 2**29}]}


def snapshot(n_gpus: int, seq: int = 0, runs: list[dict] | None = None, **over: Any) -> p.Snapshot:
    procs = [{"pid": 1000 + i, "ppid": 999, "pgid": 999, "sid": 999, "user": "root", "state": "R",
              "cpu": 99.0, "rss": 8 * 2**30, "start_time": 1764459000.0, "elapsed": 1000.0 + seq,
              "cmdline": ["python", "02_extract.py", "--tp", str(n_gpus)], "why": ["run", "gpu"],
              "run_id": "20261130-015500-ab12"} for i in range(n_gpus)]
    base = dict(seq=seq, time=1764460000.0 + seq,
                host={"hostname": "gpu-box", "load": [1.5, 1.2, 1.0], "cpu_count": 128,
                      "mem_total": 2 * 2**40, "mem_available": 2**40, "uptime": 86400.0},
                gpus=[gpu(i) for i in range(n_gpus)], processes=procs, runs=runs or [],
                gpu_source="nvml" if n_gpus else None,
                gpu_error=None if n_gpus else "pynvml not installed and nvidia-smi not found")
    base.update(over)
    return make_snapshot(**base)


def make_snapshot(**fields: Any) -> p.Snapshot:
    """A snapshot from the agent's object (its fields as the agent names them), parsed
    as the client parses one."""
    snap = p.parse_message({"type": "snapshot", **fields})
    assert isinstance(snap, p.Snapshot)
    return snap


def resnap(snap: p.Snapshot, **over: Any) -> p.Snapshot:
    """`snap` as the agent sent it, with some of its fields replaced."""
    return make_snapshot(**{**snap.wire, **over})


def recorded(name: str) -> list[p.Message]:
    """Messages recorded from a real agent, one JSON line each (tests/fixtures/NAME.jsonl)."""
    lines = (FIXTURES / name).read_text().splitlines()
    return [p.parse_message(json.loads(line)) for line in lines if line.strip()]


class ReplayClient(AgentApi):
    """Feeds queued events to the app; answers requests (op -> result dict, or a function
    of the args) from a table, through `AgentApi`'s typed methods."""

    def __init__(self, events: list[Any], answers: dict[str, Any] | None = None) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self._initial = list(events)
        self.answers = answers or {}
        self.requests: list[tuple[str, dict[str, Any]]] = []

    async def start(self) -> p.Hello:
        for ev in self._initial:
            self.queue.put_nowait(ev)
        return hello()

    async def call_with_progress(self, op: str, on_event: Callable[..., Any] | None, **args: Any) -> dict[str, Any]:
        self.requests.append((op, args))
        answer = self.answers.get(op, {})
        return answer(args) if callable(answer) else answer

    def push(self, event: Any) -> None:
        self.queue.put_nowait(event)

    async def events(self) -> AsyncIterator[Any]:
        while True:
            item = await self.queue.get()
            if item is None:
                return
            yield item

    async def close(self) -> None:
        self.queue.put_nowait(None)
