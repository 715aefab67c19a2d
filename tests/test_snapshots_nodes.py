"""Snapshot tests of a Slurm job on several nodes (the agent's `job_nodes`, README "Runs
through Slurm"): the GPU panel's block per node at 160x50, one line a node at 80x24
where 16 cards cannot fit, and a node that could not be reached as one line. Update
after a deliberate change with `pytest tests/test_snapshots_nodes.py --snapshot-update`."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.replay import ReplayClient, snapshot
from tests.test_snapshots import CFG, LOG, RUNS, screen_text
from tests.test_snapshots import settle as snapshots_settle
from tui import protocol as p
from tui.views.app import make_app

DOWN = "srun ended before it answered: srun: error: Application launch failed: Communication connection failure"


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


def on_nodes(per_node: int, nodes: tuple[str, ...], down: tuple[str, ...] = ()) -> p.Snapshot:
    """A snapshot as the login agent sends it while following a job on `nodes`: each
    node's GPUs and processes (pids may repeat across nodes), each naming its node."""
    one = snapshot(per_node, runs=RUNS)
    wire: Any = one.wire  # as the agent sends them
    gpus = [dict(g, node=node) for node in nodes for g in wire["gpus"]]
    procs = [dict(q, node=node) for node in nodes for q in wire["processes"]]
    job_nodes = [{"node": n, "via": f"srun step 12.{i + 1} on {n}", "error": None} for i, n in enumerate(nodes)]
    job_nodes += [{"node": n, "via": f"srun to {n}", "error": DOWN} for n in down]
    return snapshot(per_node, runs=RUNS, gpus=gpus, processes=procs, job_nodes=job_nodes,
                    gpu_source=f"nvml via srun on {len(nodes)} of {len(nodes) + len(down)} nodes")


def app_with(snap: p.Snapshot) -> Any:
    return make_app(ReplayClient([snap, p.LogData("log1", "/srv/x.log", 7, 0, LOG)]), CFG, "root@gpu-box")  # type: ignore[arg-type]


async def settle(pilot: Any) -> None:
    await snapshots_settle(pilot)
    await pilot.pause()  # the GPU panel's second layout, when the nodes' mode changed


CASES = {
    "2x8-160x50": (on_nodes(8, ("gpu-node3", "gpu-node4")), (160, 50)),
    "2x8-80x24": (on_nodes(8, ("gpu-node3", "gpu-node4")), (80, 24)),
    "2x4-160x50": (on_nodes(4, ("gpu-node3", "gpu-node4")), (160, 50)),
    "1of2-160x50": (on_nodes(8, ("gpu-node3",), down=("gpu-node4",)), (160, 50)),
    "1of2-80x24": (on_nodes(8, ("gpu-node3",), down=("gpu-node4",)), (80, 24)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_job_on_several_nodes(snap_compare: Any, case: str) -> None:
    snap, size = CASES[case]
    assert snap_compare(app_with(snap), terminal_size=size, run_before=settle)


@pytest.mark.parametrize("case", list(CASES))
async def test_every_node_is_named_and_a_node_not_reached_says_why(case: str) -> None:
    snap, size = CASES[case]
    app = app_with(snap)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        await pilot.pause(0.1)
        text = screen_text(app)
    for node in ("gpu-node3", "gpu-node4"):
        assert node in text, text
    if "1of2" in case:
        assert "gpu-node4 not shown: srun ended be" in text, text  # (cut at the panel's width)
    if case == "2x8-80x24":  # 16 cards do not fit: a line a node, a glyph a GPU
        assert "gpu-node3 ▅▅▅▅▅▅▅▅  97%" in text and "gpu-node4 ▅▅▅▅▅▅▅▅  97%" in text, text
    if case == "2x8-160x50":  # every card, each naming its node
        assert text.count("gpu-node3  0 H200") == 1 and text.count("gpu-node4  7 H200") == 1, text
