"""Snapshot tests of the dashboard at 160x50 (and 100x30 with 8 GPUs), fed fixed
replayed agent messages so every pixel is deterministic. Update after a deliberate
change with `pytest tests/test_snapshots.py --snapshot-update` and review the SVGs."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.replay import ReplayClient, snapshot
from tui import protocol as p
from tui.services.config import parse_config
from tui.views.app import make_app

CFG = parse_config('[run]\nname = "kimi"\ncommand = ["python", "02_extract.py"]\nlog = "/srv/x.log"\n')
T0 = 1764460000.0  # fixed times: an ended run renders the same on every run of the test
RUNS = [
    {"run_id": "20251130-000000-0007", "name": "kimi", "state": "exited", "exit_code": 1,
     "argv": ["python", "02_extract.py"], "pid": 900, "launched_at": T0 - 3000, "ended_at": T0 - 1740,
     "patch_state": {"set": "speculators-0.3.0-vllm-0.16", "state": "v4", "version": "v4"}},
    {"run_id": "20251129-230000-0006", "name": "kimi", "state": "killed", "signal": "SIGINT",
     "argv": ["python", "02_extract.py"], "pid": 800, "launched_at": T0 - 7000, "ended_at": T0 - 6000},
]
LOG = (
    b"INFO 11-30 02:00:00 [loader.py:1] Starting to load model /models/kimi-k2.5...\n"
    b"(Worker_TP0 pid=1000) \rLoading safetensors checkpoint shards:  37% Completed | 24/64 [07:12<12:01, 18.0s/it]\n"
    b"WARNING 11-30 02:07:13 [x.py:9] Reducing Torch parallelism from 64 threads to 1\n"
)


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


def app_with(n_gpus: int) -> Any:
    # "log1": the name of the app's first log subscription
    events = [snapshot(n_gpus, runs=RUNS), p.LogData("log1", "/srv/x.log", 7, 0, LOG)]
    return make_app(ReplayClient(events), CFG, "root@gpu-box")  # type: ignore[arg-type]


async def settle(pilot: Any) -> None:
    app = pilot.app
    deadline = time.monotonic() + 10
    while not (app.dashboard.state.seq == 0 and app.dashboard.state.log.offset == len(LOG)):
        assert time.monotonic() < deadline
        await pilot.pause(0.02)
    await pilot.pause()


@pytest.mark.parametrize("n", [0, 2, 8])
def test_dashboard_160x50(snap_compare: Any, n: int) -> None:
    assert snap_compare(app_with(n), terminal_size=(160, 50), run_before=settle)


def test_dashboard_8_gpus_100x30(snap_compare: Any) -> None:
    assert snap_compare(app_with(8), terminal_size=(100, 30), run_before=settle)


# ---- every size works ------------------------------------------------------------------
SIZES = [(80, 24), (120, 40), (160, 50), (250, 70)]
RUNS_SIZES = RUNS + [
    {"run_id": "20251130-010000-0008", "name": "kimi", "state": "failed", "argv": ["python9", "02_extract.py"],
     "launched_at": T0 - 600, "ended_at": T0 - 600, "error": "exec failed: No such file or directory: 'python9'"},
]


def sized_app() -> Any:
    events = [snapshot(2, runs=RUNS_SIZES), p.LogData("log1", "/srv/x.log", 7, 0, LOG)]
    return make_app(ReplayClient(events), CFG, "root@gpu-box")  # type: ignore[arg-type]


def screen_text(app: Any) -> str:
    """What the terminal shows, as plain text rows."""
    update = app.screen._compositor.render_full_update()
    return "\n".join("".join(strip.text for strip in row) for row in update.strips)


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_every_size_keeps_state_exit_failure_phase_and_keys(size: tuple[int, int]) -> None:
    """STATE, EXIT, FAILURE and the phase never disappear; the footer shows q and ?."""

    async def go() -> str:
        app = sized_app()
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            await pilot.pause(0.3)
            return screen_text(app)

    text = asyncio.run(go())
    rows = text.splitlines()
    assert len(rows) == size[1] and all(len(r) <= size[0] for r in rows)
    header = next(r for r in rows if "RUN" in r and "STATE" in r)
    assert "EXIT" in header and "FAILURE" in header, header
    assert "failed" in text and "killed" in text and "SIGINT" in text  # STATE and EXIT cells
    assert "did not" in text  # the failure note of the run that did not start, maybe clipped
    assert "Phase loading" in text
    assert "q Quit" in rows[-1] and "? Help" in rows[-1], rows[-1]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_dashboard_sizes(snap_compare: Any, size: tuple[int, int]) -> None:
    assert snap_compare(sized_app(), terminal_size=size, run_before=settle)
