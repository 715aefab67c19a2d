"""The fake fleet hosts of bench/bench_fleet.py --fake-hosts are faithful: the real client
fills a fake host's row the same way as a real agent's (over a real sshd) in the same
state, so the bench's figures are those of the real client's work.

The real agent runs on this machine with the stand-in nvidia-smi the fake's snapshots
were recorded with (8 idle H200 cards) and a run that failed (the recording's script);
the fake host replays its recorded "failed" shape, with the run's log.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests import fleet_fake
from tests.agent_driver import AgentProc
from tests.sshd import Sshd
from tui.services.actions import new_client
from tui.services.config import parse_config
from tui.state import fleet
from tui.views.app import make_fleet_app
from tui.views.screens.fleet import FleetScreen

pytestmark = pytest.mark.ssh
RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{4}|\d{6}-[0-9a-f]{4}")  # a run id, whole or its tail


def standin_gpus(tmp: Path) -> dict[str, str]:
    """The environment of an agent that sees the recording's 8 idle stand-in cards."""
    (tmp / "bin").mkdir()
    state = tmp / "smi.json"
    state.write_text("{}")
    smi = tmp / "bin" / "nvidia-smi"
    smi.write_text(fleet_fake.SMI.format(python=sys.executable, state=str(state)))
    smi.chmod(0o755)
    return {"EAGLE3_TUI_GPU_SOURCE": "nvidia-smi", "PATH": f"{tmp / 'bin'}:/usr/local/bin:/usr/bin:/bin"}


def failed_run(runs: Path, cwd: Path) -> None:
    """The recording's failing run, launched by the real agent into `runs`."""
    with AgentProc(args=["--runs-dir", str(runs)], env={"EAGLE3_TUI_GPU_SOURCE": "none"}) as agent:
        rec = agent.call("launch", {"name": "run", "argv": [sys.executable, "-c", fleet_fake.FAIL],
                                    "cwd": str(cwd), "env": {}, "log": None})
        deadline = time.monotonic() + 30
        while agent.call("runs")["runs"][0]["state"] == "running":
            assert time.monotonic() < deadline, "the failing run did not end"
            time.sleep(0.2)
    assert rec["run_id"]


def shown(row: fleet.HostRow) -> tuple[str, ...]:
    """The row's cells after the host's name, run ids masked (each host has its own)."""
    return tuple(RUN_ID.sub("<run>", c) for c in fleet.cells(row)[1:])


async def test_a_fake_host_fills_its_row_as_a_real_agent_does(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    runs = tmp_path / "runs"
    failed_run(runs, tmp_path)
    fixture = fleet_fake.load_fixture()
    servers = await fleet_fake.start(1, tmp_path / "fake", fixture, shapes=["failed"])
    fake_target = (tmp_path / "fake" / "hosts").read_text().split()[0]
    cfg = parse_config(f'[host]\npython = "{sys.executable}"\nruns_dir = "{runs}"\nconnect_timeout = 20\n')
    with Sshd(tmp_path / "sshd", env=standin_gpus(tmp_path)) as sshd:
        clients = {"real": new_client(sshd.alias, cfg, ssh_config=str(sshd.ssh_config)),
                   "fake": new_client(fake_target, cfg, ssh_config=str(tmp_path / "fake" / "ssh_config"))}
        app = make_fleet_app(clients, cfg, limit=2)
        try:
            async with app.run_test(size=(160, 20)) as pilot:
                screen = app.screen
                assert isinstance(screen, FleetScreen)

                def rows() -> dict[str, Any]:
                    return {r.host: r for r in screen.all_rows}

                def cause(host: str) -> str | None:  # the root cause in the run's log, as followed
                    root = getattr(screen.feeds[host].state.log.analysis, "root_cause", None)
                    return getattr(root, "title", None)

                def settled() -> bool:  # both causes found, and a repaint since (it is debounced)
                    r = rows()
                    return (screen.first_full_frame is not None and cause("real") is not None
                            and cause("fake") is not None and len(r) == 2
                            and all(x.failures for x in r.values()) and shown(r["fake"]) == shown(r["real"]))

                deadline = time.monotonic() + 60
                while not settled():
                    if time.monotonic() > deadline:
                        break  # the comparisons below say what differs
                    await pilot.pause(0.1)
                real, fake = rows()["real"], rows()["fake"]
                assert real.link == "ok" and fake.link == "ok"
                assert (real.gpus_busy, real.gpus_total, real.failures) == (0, 8, 1)
                assert shown(fake) == shown(real)
                assert fake.hostname == "fake-000" and real.hostname
                # the log came the same way: subscribed, replayed, analysed to the same cause
                assert cause("real") and "out of memory" in str(cause("real")).lower()
                assert cause("fake") == cause("real")
                logs = {h: screen.feeds[h].state.log for h in ("real", "fake")}
                assert logs["fake"].total_lines == logs["real"].total_lines > 0
        finally:
            await app.run_action("quit") if app.is_running else None
            for c in clients.values():
                await c.close()
            for s in servers:
                s.close()
