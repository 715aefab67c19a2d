"""The fleet gathers its hosts' events into one repaint per period however often it is
drawn directly (a key: sort, group, filter; the full frame): a direct repaint takes the
place of the gathered one on its way, it does not start a second gathering beside it.

The hosts are tests/fleet_fake.py's fake hosts (real asyncssh servers on loopback),
sending a snapshot every 0.2 s so that events never stop.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests import fleet_fake
from tui.services.actions import new_client
from tui.services.config import parse_config
from tui.state import fleet
from tui.views.app import make_fleet_app
from tui.views.screens.fleet import FleetScreen

pytestmark = pytest.mark.ssh


async def test_keys_do_not_multiply_the_repaints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setattr(fleet, "repaint_period", lambda hosts: 1.0)
    servers = await fleet_fake.start(2, tmp_path / "fake", fleet_fake.load_fixture(), shapes=["training", "half"])
    targets = (tmp_path / "fake" / "hosts").read_text().split()
    cfg = parse_config("[host]\nconnect_timeout = 20\n[fleet]\ninterval = 0.2\n")
    clients = {t: new_client(t, cfg, ssh_config=str(tmp_path / "fake" / "ssh_config")) for t in targets}
    app = make_fleet_app(clients, cfg, limit=2)
    try:
        async with app.run_test(size=(160, 20)) as pilot:
            screen = app.screen
            assert isinstance(screen, FleetScreen) and screen.repaint_s == 1.0
            deadline = time.monotonic() + 30
            while screen.first_full_frame is None:
                assert time.monotonic() < deadline, "no full frame"
                await pilot.pause(0.05)
            for _ in range(6):  # each sorts and repaints at once
                await pilot.press("s")
                await pilot.pause(0.3)
            seqs = sum(f.state.seq for f in screen.feeds.values())
            frames, t0 = screen.frames, time.monotonic()
            await pilot.pause(4.0)
            took = time.monotonic() - t0
            assert sum(f.state.seq for f in screen.feeds.values()) - seqs >= 20  # events all along
            # one gathered repaint a second (and the 1 s tick's when none is on its way)
            assert screen.frames - frames <= took + 2, f"{screen.frames - frames} repaints in {took:.1f} s"
    finally:
        for s in servers:
            s.close()
