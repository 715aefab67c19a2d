"""The first frame after a connect tells the log's latest truth (issue 36, item 6).

The subscription starts FIRST_TAIL from the end of the log, and the older bytes before
it come afterwards, analysed first, a slice per turn of the loop: seconds on a long log.
Meanwhile the progress panel shows the step, loss and phase of the newest lines (the
tail's own analysis), never an older line's numbers, and only one ETA at a time."""

from __future__ import annotations

import asyncio
import base64
import re
import time
from typing import Any

from tests.replay import ReplayClient, snapshot
from tests.test_app import CFG, RUN, log_event, until
from tui.services.hostfeed import FIRST_TAIL
from tui.views.app import make_app
from tui.views.widgets.logtail import TailLog
from tui.views.widgets.progress import RunProgress

TOTAL = 40_000


def training_log(steps: int) -> bytes:
    """A Trainer's log: a metrics dict, then the step bar, for every step (loss falling)."""
    out = []
    for n in range(1, steps + 1):
        out.append(b"{'loss': %.4f, 'grad_norm': 1.1, 'learning_rate': 2e-05, 'epoch': %.2f}\n"
                   % (2 / (1 + n / 500), n / TOTAL))
        out.append(b"%3d%%|%-20s| %d/%d [01:00<09:00,  2.00it/s]\n" % (100 * n // TOTAL, b"#" * (20 * n // TOTAL),
                                                                     n, TOTAL))
    return b"".join(out)


async def test_the_first_frame_shows_the_newest_step_and_loss_while_the_older_lines_are_read() -> None:
    whole = training_log(12_000)  # ~1.1 MB: the older bytes are four times the first tail
    tail = whole[len(whole) - FIRST_TAIL:]
    tail = tail[tail.index(b"\n") + 1:]
    older = whole[: len(whole) - len(tail)]
    size = len(whole)
    last_loss = 2 / (1 + 12_000 / 500)
    answers = {"subscribe": {"inode": 7, "size": size, "offset": len(older)},
               "read_range": {"offset": 0, "b64": base64.b64encode(older).decode(), "size": size, "inode": 7}}

    class SlowRead(ReplayClient):  # the older bytes take a while (a slow link, a big log)
        async def call_with_progress(self, op: str, on_event: Any, **args: Any) -> dict[str, Any]:
            if op == "read_range":
                await asyncio.sleep(3.0)
            return await super().call_with_progress(op, on_event, **args)

    client = SlowRead([snapshot(2, runs=[RUN]), log_event(tail, offset=len(older))], answers)
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        progress, pane = app.query_one(RunProgress), app.query_one(TailLog)
        await until(pilot, lambda: bool(pane.lines) and pane.lines[-1].startswith(" 30%|"))  # the tail is drawn
        drawn = time.monotonic()
        await until(pilot, lambda: "step 12000/40000" in str(progress.render()), timeout=1.0)
        assert time.monotonic() - drawn < 1.0
        shown = str(progress.render())
        assert app.dashboard.state.log.older, "the older bytes are still on their way"
        assert f"loss  {last_loss:.4g}" in shown and "Phase training" in shown, shown
        # once the older lines are in and analysed, the whole log's analysis agrees
        await until(pilot, lambda: not app.dashboard.state.log.catching_up, timeout=15)
        await pilot.pause(0.6)
        shown = str(progress.render())
        assert "step 12000/40000" in shown and f"loss  {last_loss:.4g}" in shown, shown
        assert app.dashboard.state.log.preview is None


async def test_one_eta_at_a_time_while_a_run_loads_with_a_history() -> None:
    """While a run loads and the host's history projects the load ("slower than last
    time (15s): ~20s"), that projection is the panel's one ETA: the shard bar beside
    it shows none of its own (it showed `ETA 00:08` too)."""
    run = {**RUN, "launched_at": time.time() - 9, "expected_load_s": 15.0, "expected_load_runs": ["r1"]}
    bar = b"Loading safetensors checkpoint shards:  38% Completed | 3/8 [00:09<00:08,  3.00s/it]\n"
    client = ReplayClient([snapshot(2, runs=[run]), log_event(bar)])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        progress = app.query_one(RunProgress)
        await until(pilot, lambda: "than last time" in str(progress.render()))
        shown = str(progress.render())
        assert "3/8" in shown and re.search(r": ~[\d.]+s\b", shown), shown
        assert "ETA" not in shown, shown


async def test_a_toast_leaves_the_last_log_lines_in_sight() -> None:
    """A notification (a run's "finished", 15 s) sits where it covers no line of the log."""
    lines = b"".join(b"INFO step %d: a long line that runs across the whole width of the pane " % i
                     + b"x" * 60 + b"\n" for i in range(60))
    client = ReplayClient([snapshot(2, runs=[RUN]), log_event(lines)])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50), notifications=True) as pilot:
        pane = app.query_one(TailLog)
        await until(pilot, lambda: bool(pane.lines) and pane.lines[-1].startswith("INFO step 59"))
        app.dashboard.notify("the run ended: exit 0", title="run 20261130-015500-ab12 finished", timeout=15)
        await pilot.pause(0.3)
        toasts = list(app.screen.query("Toast"))
        assert toasts, "the toast is up"
        for toast in toasts:
            assert not toast.region.overlaps(pane.region), (toast.region, pane.region)
