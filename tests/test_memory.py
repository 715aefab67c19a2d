"""The dashboard does not grow: 10,000 snapshots (processes coming and going, readings
changing, a log line with each) fed through the real app (Textual's Pilot, the replay
client of tests/replay.py), and tracemalloc compares the heap after the first 2,000
with the heap at the end. Before the fix the footer was rebuilt on every snapshot and
each rebuild left its widgets behind (~1.7 MB per 120 snapshots in tracemalloc).

tracemalloc starts after 2,000 snapshots (the bounded log and history are full by
then); the heap it traces at 6,000 and at 10,000 must be about the same: what the app
keeps replaces what it dropped. The libraries' bounded render caches (rich's cell
widths and style sums, Textual's truecolor filter, DataTable's rendered cells, the log's
rendered lines) fill slowly over many thousands of snapshots; they are emptied before
each reading so that only what the state and the widgets hold is compared. (A log row's
style carries its number since the tail began, so rows never repeat one: the two
1,024-entry style caches filled through the whole window, ~300-500 kB of the 400 kB.)"""

from __future__ import annotations

import gc
import time
import tracemalloc
from typing import Any

from rich import cells
from rich.style import Style
from textual.filter import ANSIToTruecolor
from textual.widgets import DataTable

from tests.replay import ReplayClient, resnap, snapshot
from tui import protocol as p
from tui.services.config import parse_config
from tui.views.app import make_app
from tui.views.widgets.logtail import TailLog

CFG = parse_config('[run]\nname = "kimi"\ncommand = ["python", "02_extract.py"]\nlog = "/srv/x.log"\n')
TOTAL, WARM, MID = 10_000, 2_000, 6_000
GROWTH_LIMIT = 400_000  # bytes over the last 4,000 snapshots: 100 B each (0.36 MB/hour at 1 Hz)


def _snap(i: int) -> p.Snapshot:
    base = snapshot(1, seq=i)
    procs = [dict(pr, cpu=float(i % 97), elapsed=1000.0 + i) for pr in base.wire["processes"]]  # type: ignore[union-attr]
    procs.append(dict(procs[0], pid=5000 + (i // 50) % 7, run_id=None, why=["gpu"]))  # one comes and goes
    gpus = [dict(g, util=(i * 7 + k) % 100, power=300.0 + i % 50)  # type: ignore[arg-type]
            for k, g in enumerate(base.wire["gpus"])]  # type: ignore[arg-type]
    runs = [{"run_id": "20261130-015500-ab12", "name": "kimi", "state": "running", "argv": ["python"],
             "pid": 999, "launched_at": 1764459000.0}]
    return resnap(base, processes=procs, gpus=gpus, runs=runs)


def _drop_render_caches(app: Any) -> None:
    cells.cached_cell_len.cache_clear()
    Style._add.cache_clear()
    ANSIToTruecolor.truecolor_style.cache_clear()
    for table in app.query(DataTable):
        table._clear_caches()
    app.query_one(TailLog).clear_render_cache()
    gc.collect()


async def test_state_and_widgets_do_not_grow_over_10000_snapshots() -> None:
    client = ReplayClient([])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        offset = 0
        measured: list[int] = []
        heaps: list[tracemalloc.Snapshot] = []
        t0 = time.monotonic()
        for i in range(TOTAL):
            client.push(_snap(i))
            line = f"INFO [extract] batch {i} | seqs {i * 32} | tokens {i * 16384} | {i % 90}.5 tok/s\n".encode()
            client.push(p.LogData("log1", "/srv/x.log", 7, offset, line))
            offset += len(line)
            if i % 100 == 99:
                while app.dashboard.state.seq != i:  # the app has applied and drawn everything so far
                    await pilot.pause(0.001)
                await pilot.pause()
            if i + 1 == WARM:
                _drop_render_caches(app)
                tracemalloc.start()
            if i + 1 in (MID, TOTAL):
                _drop_render_caches(app)
                measured.append(tracemalloc.get_traced_memory()[0])
                heaps.append(tracemalloc.take_snapshot())
        tracemalloc.stop()
        assert app.dashboard.state.seq == TOTAL - 1 and app.dashboard.state.log.total_lines == TOTAL
        grown = measured[1] - measured[0]
        print(f"\nheap traced since snapshot {WARM}: {measured[0] / 1e3:.0f} kB at {MID},"
              f" {measured[1] / 1e3:.0f} kB at {TOTAL}: {grown / (TOTAL - MID):+.1f} B per snapshot"
              f" ({time.monotonic() - t0:.0f} s)")
        top = heaps[1].compare_to(heaps[0], "lineno")[:5]
        assert grown < GROWTH_LIMIT, "\n".join(map(str, top))
