"""The fleet screen with 300 hosts: summary line, grouping by state, sort by free GPUs,
the `/` filter, at 80x24 and 160x50.

The hosts are replay clients (tests/replay.py): this machine cannot run 300 real
agents in a test, and the screen's arrangement of rows is what is tested here; the
real SSH path of the fleet is tests/test_fleet_screen.py's.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from rich.text import Text

from tests.replay import ReplayClient, make_snapshot
from tui import protocol as p
from tui.services.config import parse_config
from tui.state import fleet
from tui.transport import HostUnreachable
from tui.views.app import make_fleet_app
from tui.views.screens.fleet import FleetScreen

GiB = 2**30
NOW = time.time()
N = 300
EVIL = "[bold red]evil[/]"  # host text: shown as written, never markup


class Down(ReplayClient):
    async def start(self) -> p.Hello:
        raise HostUnreachable("connect to host: Connection refused", permanent=True)


def snap(i: int) -> p.Snapshot:
    busy = i % 9  # 0..8 of 8 GPUs busy
    gpus = [{"index": g, "name": "H200", "mem_used": (70 if g < busy else 1) * GiB, "mem_total": 140 * GiB,
             "util": 97 if g < busy else 0, "processes": [{"pid": 100 + g, "mem": GiB}] if g < busy else []}
            for g in range(8)]
    runs = []
    if i % 37 == 0:
        runs.append({"run_id": f"20261130-000000-f{i:03d}", "name": "x", "state": "exited", "argv": ["python"],
                     "pid": 10, "launched_at": NOW - 900, "ended_at": NOW - 800, "exit_code": 1,
                     "signal": None, "patch_state": None, "external": False, "log": None})
    return make_snapshot(seq=1, time=NOW, host={"hostname": f"node{i}"}, gpus=gpus, processes=[], runs=runs,
                         gpu_source="nvml", gpu_error=None)


def hosts() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i in range(N - 1):
        name = f"h{i:03d}"
        out[name] = Down([]) if i % 50 == 7 else ReplayClient([snap(i)])
    out[EVIL] = ReplayClient([snap(1)])
    return out


async def until(pilot: Any, cond: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


def title(screen: FleetScreen) -> str:
    return str(screen.query_one("#fleet-title").render())


@pytest.mark.parametrize("size", [(80, 24), (160, 50)])
async def test_a_big_fleet_groups_sorts_filters_and_sums_up(size: tuple[int, int]) -> None:
    cfg = parse_config("[host]\ninterval = 1.0\n[run]\nname = \"x\"\n")
    app = make_fleet_app(hosts(), cfg, limit=16)
    async with app.run_test(size=size) as pilot:
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        await until(pilot, lambda: screen.first_full_frame is not None, "every row settled")
        await until(pilot, lambda: len(screen.query_one("#fleet").rows) == N, "every row in the table")
        down = [i for i in range(N - 1) if i % 50 == 7]
        failed = [i for i in range(N - 1) if i % 37 == 0 and i not in down]
        busy = sum(i % 9 for i in range(N - 1) if i not in down) + 1
        total = 8 * (N - len(down))
        want = f"{N} hosts · {busy}/{total} GPUs busy · {len(failed)} failures · {len(down)} unreachable"
        assert want in title(screen)
        # grouped by state by default: failed hosts first, then unreachable, running, idle
        states = [fleet.host_state(r) for r in screen.rows]
        assert states == sorted(states, key=fleet.STATES.index)
        assert states[0] == "failed" and states.count("unreachable") == len(down)
        # s cycles to free GPUs: most free first within each group
        while screen.sort_key != "free":
            await pilot.press("s")
        running = [fleet.free_gpus(r) for r in screen.rows if fleet.host_state(r) == "running"]
        assert running == sorted(running, reverse=True) and running[0] == 7
        await pilot.press("g")  # grouping off: free GPUs across the whole fleet
        assert not screen.group
        free = [fleet.free_gpus(r) for r in screen.rows]
        assert free == sorted(free, key=lambda f: (f is None, -(f or 0)))
        # / filters as you type; the keys typed are the filter's, not the screen's
        await pilot.press("slash")
        await pilot.press(*"unreachable")
        await until(pilot, lambda: screen.filter_text == "unreachable", "the filter applied")
        assert screen.sort_key == "free" and not screen.group  # its s and g were text
        assert [r.host for r in screen.rows] == [f"h{i:03d}" for i in down]
        assert len(screen.query_one("#fleet").rows) == len(down)
        assert f"{len(down)} shown of filter 'unreachable'" in title(screen) and want in title(screen)
        await pilot.press("enter")  # kept; the rows have the keys again
        assert screen.query_one("#fleet").has_focus and screen.filter_text == "unreachable"
        await pilot.press("escape")  # cleared: every host again
        await until(pilot, lambda: len(screen.rows) == N, "every host back")
        # a host name is host text: shown as written
        await pilot.press("slash", *"evil", "enter")
        await until(pilot, lambda: [r.host for r in screen.rows] == [EVIL], "the evil host alone")
        cell = screen.query_one("#fleet").get_row_at(0)[0]
        assert isinstance(cell, Text) and cell.plain == EVIL and not cell.spans
        await pilot.press("q")
