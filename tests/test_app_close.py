"""The app closes what it opens: when it ends, no host agent of it is left alive on the
host (real agents: a LocalLink child, and agents behind a real sshd). The process may go
on after the app (`demo` asks the host for the run's outcome next; the tests run many
apps in one process): an agent whose stdin stayed open would live until that process
ends. In the fleet, entering and leaving a host N times opens no second agent, and a host
whose first connect is tried again keeps no agent of the failed try."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.fleet_hosts import FleetHosts
from tests.sshd import Sshd
from tui.services.actions import new_client
from tui.services.config import parse_config
from tui.services.hostfeed import HostFeed
from tui.transport import AgentClient, LocalLink
from tui.views.app import make_app, make_fleet_app
from tui.views.screens.dashboard import DashboardScreen
from tui.views.screens.fleet import FleetScreen


def agents_of(root: Path) -> list[int]:
    """Pids of the host agents whose `--runs-dir` is under `root` (read from /proc)."""
    found = []
    for name in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, ValueError):
            continue
        if any(a.endswith("agent/main.py") for a in argv) and any(a.startswith(f"{root}/") for a in argv):
            found.append(int(name))
    return found


def settled(count: Callable[[], list[int]], want: int, timeout: float = 5.0) -> list[int]:
    """`count()` once it has `want` pids, or as it is after `timeout` (an agent whose
    link just closed takes a moment to see its stdin end)."""
    deadline = time.monotonic() + timeout
    while len(found := count()) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


async def until(pilot: Any, cond: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


def config(tmp: Path) -> Any:
    return parse_config(f'[host]\npython = "{sys.executable}"\nruns_dir = "{tmp / "runs"}"\n'
                        "connect_timeout = 10\ninterval = 0.5\n")


async def test_quitting_the_dashboard_stops_its_agent(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    app = make_app(new_client("local", cfg, reconnect=True), cfg, "local")
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq >= 0, "the first snapshot")
        assert len(agents_of(tmp_path)) == 1
        await pilot.press("q")
    # still in the process (and its loop) that ran the app
    assert settled(lambda: agents_of(tmp_path), 0) == []


@pytest.mark.ssh
async def test_entering_and_leaving_hosts_keeps_one_agent_each_and_quitting_stops_them(
        sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)  # only the test's own key is offered
    hosts = FleetHosts(tmp_path / "fleet")
    names = hosts.add_sshd(sshd, 2)
    hosts.write()
    cfg = config(tmp_path)
    clients = {h: new_client(h, cfg, ssh_config=str(hosts.ssh_config), reconnect=True) for h in names}
    app = make_fleet_app(clients, cfg, limit=2)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        await until(pilot, lambda: all(r.link == "ok" for r in screen.rows) and len(screen.rows) == 2, "both hosts")
        assert len(agents_of(tmp_path)) == 2  # one agent per host, on the sshd's side
        table = screen.query_one("#fleet")
        for i in range(6):  # each host opened and left three times
            table.move_cursor(row=i % 2)
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, DashboardScreen), "a host's dashboard")
            await pilot.press("escape")
            await until(pilot, lambda: app.screen is screen, "back to the fleet")
            assert len(settled(lambda: agents_of(tmp_path), 2, 0.5)) == 2, f"after enter/esc #{i + 1}"
        assert all(feed.client.connected for feed in screen.feeds.values())
        await pilot.press("q")
    assert settled(lambda: agents_of(tmp_path), 0) == []


# The first start of the agent says hello, then drops the link at the first request (the
# configure): a link lost between the hello and the configure, tried again. Later starts
# are the plain agent.
DROP_ONCE = """#!/bin/sh
if [ "$1" = -u ] && mkdir "{mark}" 2>/dev/null; then
  exec "{python}" -c '
import subprocess, sys
agent = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
sys.stdout.buffer.write(agent.stdout.readline()); sys.stdout.buffer.flush()
sys.stdin.buffer.readline()
agent.kill(); agent.wait(); sys.exit(1)' "{python}" "$@"
fi
exec "{python}" "$@"
"""


async def test_a_connect_tried_again_leaves_no_agent_of_the_failed_try(tmp_path: Path) -> None:
    python = tmp_path / "python3"
    python.write_text(DROP_ONCE.format(mark=tmp_path / "dropped", python=sys.executable))
    python.chmod(0o755)
    client = AgentClient(LocalLink(python=str(python), runs_dir=str(tmp_path / "runs")), backoff=(0.05,))
    feed = HostFeed(client, config(tmp_path), "local")
    task = asyncio.create_task(feed.run(None, retry=(0.2,)))
    try:
        deadline = time.monotonic() + 20
        while not feed.started:
            assert time.monotonic() < deadline and not task.done(), "the second try never connected"
            await asyncio.sleep(0.05)
        assert (tmp_path / "dropped").is_dir() and feed.client is not client  # the first try failed
        await asyncio.sleep(1.0)  # the failed try's client, had it been left, reconnects in 0.05 s
        assert len(agents_of(tmp_path)) == 1
    finally:
        task.cancel()
        await feed.close()
        await client.close()
