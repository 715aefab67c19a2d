"""A recorded 8-card timeline for the timeline screen's tests: the host's own Recorder
(remote/run/timeline.py) fed a fake clock -- a 2-hour run that loads for 10 minutes, holds
four cards while it extracts, slows down in its second hour, and ends. With ``train``
the run trains instead: its loss falls from 9 towards 1, with a spike at 50 minutes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from remote.run import timeline as hosttl
from tui.services import timeline

T0 = 1_764_460_000.0


def record(run_dir: Path, cards: int = 8, train: bool = False) -> timeline.Timeline:
    rec = hosttl.Recorder(str(run_dir), T0, "20261130-015500-ab12", launched_at=T0 - 2)
    now, batch = T0, 0
    while now < T0 + 7200:
        el = now - T0
        work = "training" if train else "extracting"
        phase = "loading" if el < 600 else work if el < 7100 else "finished"
        if phase == work:
            batch += 3 if el < 3600 else 1
        held = phase == work
        gpus: list[dict[str, Any]] = [
            {"index": i, "mem_used": (int(min(70, 10 + el / 60)) if held and i < 4 else 1) * 2 ** 30,
             "util": (90 if el < 3600 else 55) if held and i < 4 else 0,
             "power": 600 if held and i < 4 else 70, "processes": [{"pid": 7}] if held and i < 4 else []}
            for i in range(cards)]
        step = "shard %d/64" % min(64, int(el / 600 * 64)) if phase == "loading" else "batch %d" % batch
        mark = ["shard", min(64, int(el / 600 * 64)), 64] if phase == "loading" else ["batch", batch]
        loss = None
        if train and phase != "loading":
            step, mark = "step %d/9000" % batch, ["train", batch]
            loss = round(1 + 8 * 0.9993 ** batch + (3.0 if 3000 <= el < 3100 else 0.0), 3)
        rec.look(now, phase, step, mark, None, gpus if rec.sample_due(now) else None, [7], loss=loss,
                 loss_step=batch if loss is not None else None)
        now += 5.0
    rec.event(now, "exit", code=0, signal=None)
    rec.close()
    return timeline.parse((run_dir / hosttl.TIMELINE_FILE).read_bytes())
