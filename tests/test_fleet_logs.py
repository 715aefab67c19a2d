"""The fleet holds its hosts' logs until every row has its first snapshot: the logs'
reading and analysis no longer compete with the connects (bench/bench_fleet.py
--fake-hosts 256). Each failure cause still comes, once the rows are filled, once the
rows stop filling (a host that hangs in its connect holds no other's log), or at once
for the host opened with enter. The frame that fills the last row is drawn at once.

The hosts are tests/fleet_fake.py's fake hosts (real asyncssh servers on loopback
replaying the real agent's recorded "failed" shape and its log); the host that hangs
is a plain socket that accepts and never answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from tests import fleet_fake
from tui import protocol as p
from tui.services.actions import new_client
from tui.services.config import parse_config
from tui.state import fleet
from tui.state.events import LedgerRead, LogFollowed
from tui.views.app import make_fleet_app
from tui.views.screens import fleet as fleet_screen
from tui.views.screens.dashboard import DashboardScreen
from tui.views.screens.fleet import FleetScreen

pytestmark = pytest.mark.ssh


async def until(pilot: Any, cond: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


def cause(screen: FleetScreen, host: str) -> str | None:
    """The root cause found in the host's run log, None before its analysis."""
    return getattr(getattr(screen.feeds[host].state.log.analysis, "root_cause", None), "title", None)


async def fake_hosts(tmp: Path, n: int) -> tuple[list[Any], list[str], str]:
    servers = await fleet_fake.start(n, tmp / "fake", fleet_fake.load_fixture(), shapes=["failed"] * n)
    return servers, (tmp / "fake" / "hosts").read_text().split(), str(tmp / "fake" / "ssh_config")


async def silent_host() -> tuple[asyncio.AbstractServer, str]:
    """A port that accepts and never says a word (its connect waits for the timeout)."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    return server, f"silent@127.0.0.1:{server.sockets[0].getsockname()[1]}"


@contextlib.asynccontextmanager
async def fleet_of(tmp: Path, n: int, limit: int, hung: bool = False,
                   timeout: int = 20) -> AsyncIterator[tuple[Any, Any, FleetScreen, list[str], str | None]]:
    """The fleet screen over `n` fake failed hosts (and first a host that hangs in its
    connect, with `hung`): (app, pilot, screen, the fake targets, the hung target)."""
    servers, targets, ssh_config = await fake_hosts(tmp, n)
    silent, stuck = await silent_host() if hung else (None, None)
    cfg = parse_config(f"[host]\nconnect_timeout = {timeout}\n")
    clients = {t: new_client(t, cfg, ssh_config=ssh_config) for t in ([stuck] if stuck else []) + targets}
    app = make_fleet_app(clients, cfg, limit=limit)
    try:
        async with app.run_test(size=(160, 20)) as pilot:
            assert isinstance(app.screen, FleetScreen)
            yield app, pilot, app.screen, targets, stuck
    finally:
        if silent is not None:
            silent.close()
        for s in servers:
            s.close()


async def test_logs_are_followed_after_every_row_has_its_snapshot(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    followed: dict[str, float] = {}
    ledger: dict[str, float] = {}  # past runs' summaries read: they wait too

    def heard(host: str, ev: Any) -> None:
        if isinstance(ev, LogFollowed) and ev.sub is not None:
            followed.setdefault(host, time.monotonic())
        if isinstance(ev, LedgerRead):
            ledger.setdefault(host, time.monotonic())

    # one connect at a time: the first host waits longest
    async with fleet_of(tmp_path, 3, limit=1) as (_app, pilot, screen, targets, _):
        for host, feed in screen.feeds.items():
            feed.listen(lambda ev, host=host: heard(host, ev))
        await until(pilot, lambda: all(cause(screen, t) for t in targets) and len(ledger) == len(targets),
                    "every host's failure cause and past runs")
        assert screen.first_full_frame is not None
        assert sorted(followed) == sorted(targets)
        assert min(followed.values()) >= screen.first_full_frame  # none before every row was filled
        assert min(ledger.values()) >= screen.first_full_frame
        assert all("out of memory" in str(cause(screen, t)).lower() for t in targets)
        await until(pilot, lambda: all(r.failures == 1 for r in screen.all_rows), "the rows' failures")


async def test_a_host_that_hangs_holds_no_other_hosts_log(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    async with fleet_of(tmp_path, 2, limit=3, hung=True, timeout=30) as (_app, pilot, screen, targets, hung):
        assert hung is not None
        t0 = time.monotonic()
        await until(pilot, lambda: all(cause(screen, t) for t in targets), "the good hosts' causes", timeout=20)
        assert screen.feeds[hung].state.seq < 0 and screen.feeds[hung].error is None  # still connecting
        assert screen.first_full_frame is None
        assert time.monotonic() - t0 < 20  # not the hung host's 30 s timeout


async def test_the_host_opened_follows_its_log_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setattr(fleet_screen, "LOG_STALL_S", 600.0)  # the others' logs wait for the hung host
    async with fleet_of(tmp_path, 2, limit=3, hung=True, timeout=30) as (app, pilot, screen, targets, _):
        await until(pilot, lambda: all(screen.feeds[t].started and screen.feeds[t].state.seq >= 0
                                       for t in targets), "the good hosts' first snapshots")
        await pilot.pause(1.0)
        assert all(screen.feeds[t].state.log.path is None for t in targets)  # held
        opened, other = targets
        screen.action_open_host(opened)
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen), "the dashboard")
        await until(pilot, lambda: cause(screen, opened) is not None, "the opened host's cause", timeout=15)
        assert screen.feeds[other].state.log.path is None  # still held


async def test_the_frame_that_fills_the_last_row_is_drawn_at_once(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setattr(fleet, "repaint_period", lambda hosts: 5.0)  # as a big fleet gathers its repaints
    first: dict[str, float] = {}
    async with fleet_of(tmp_path, 2, limit=2) as (_app, pilot, screen, targets, _):
        assert screen.repaint_s == 5.0
        for host, feed in screen.feeds.items():
            feed.listen(lambda ev, host=host: first.setdefault(host, time.monotonic())
                        if isinstance(ev, p.Snapshot) else None)
        await until(pilot, lambda: screen.first_full_frame is not None, "every row settled")
        assert sorted(first) == sorted(targets)
        assert screen.first_full_frame - max(first.values()) < 1.0  # not the 5 s gathering period
        assert all(r.gpus_total == 8 for r in screen.rows)
