"""Snapshot of the fleet screen at 120x40, fed replayed agent messages (tests/replay.py)
so every cell is deterministic: hosts with 8, 4 and 0 GPUs, a live run, a failed run,
and one host whose connect failed with an unknown host key (a stand-in client that
raises the transport's own error; the real refusals are in test_fleet_screen.py)."""

from __future__ import annotations

import time
from typing import Any

from tests.replay import ReplayClient, snapshot
from tui.services.config import parse_config
from tui.transport import HostKeyUnknown
from tui.views.app import make_fleet_app

CFG = parse_config('[run]\nname = "kimi"\ncommand = ["python", "02_extract.py"]\n')
T0 = 1764460000.0


def run(rid: str, state: str, exit_code: int | None = None) -> dict[str, Any]:
    return {"run_id": rid, "name": "kimi", "state": state, "exit_code": exit_code, "argv": ["python", "x.py"],
            "pid": 900, "launched_at": T0 - 3000, "ended_at": None if state == "running" else T0 - 100}


class Refused(ReplayClient):
    async def start(self) -> Any:
        raise HostKeyUnknown("unknown host key for 10.0.0.9:22: ssh-ed25519 SHA256:AbCdEf (--accept-new-host-key)")


def fleet_app() -> Any:
    clients = {
        "node1": ReplayClient([snapshot(8, runs=[run("20261130-015500-ab12", "running")])]),
        "node2": ReplayClient([snapshot(4, runs=[run("20261130-010000-0007", "exited", 1)])]),
        "node3": ReplayClient([snapshot(0)]),
        "node4": Refused([]),
    }
    return make_fleet_app(clients, CFG, limit=2)  # type: ignore[arg-type]


async def settle(pilot: Any) -> None:
    screen = pilot.app.screen
    deadline = time.monotonic() + 10
    while screen.first_full_frame is None:
        assert time.monotonic() < deadline
        await pilot.pause(0.02)
    await pilot.pause(0.2)


def test_fleet_120x40(snap_compare: Any) -> None:
    assert snap_compare(fleet_app(), terminal_size=(120, 40), run_before=settle)
