"""Follow one run to its end without a screen: progress lines on stdout, outcome as exit code.

Used by `eagle3-tui demo --headless` (scripts, CI). It talks to the agent the same way
the dashboard does: `launch` through the supervisor shim, `runs` for the run's state,
`read_range` for the new bytes of its log, which the same pure parser as the
dashboard's (`tui.state.loganalysis.fold`) turns into shard and extraction progress.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from tui.protocol.records import RunRecord
from tui.state.loganalysis import fold
from tui.transport import AgentApi

POLL_S = 0.5
CHUNK = 1 << 20


def describe_end(run: RunRecord) -> str:
    if run.state == "exited":
        return f"{run.state} with code {run.exit_code}"
    if run.signal:
        return f"{run.state} by signal {run.signal}"
    return run.state


def succeeded(run: RunRecord) -> bool:
    return run.state == "exited" and run.exit_code == 0


def train_line(tr: Any, phase: str) -> str:
    """ "[train] step 12/48  epoch 1/2  loss 0.0123  (training)" for the headless output."""
    of = f"/{tr.total}" if tr.total else ""
    parts = [f"[train] step {tr.step if tr.step is not None else '?'}{of}"]
    if tr.epoch is not None:
        parts.append(f"epoch {tr.epoch:g}" + (f"/{tr.epochs}" if tr.epochs else ""))
    if tr.loss is not None:
        parts.append(f"loss {tr.loss:.4g}")
    return "  ".join(parts) + f"  ({phase})"


async def follow(client: AgentApi, run_id: str, echo: Callable[[str], None],
                 timeout: float | None = None) -> RunRecord:
    """Print progress of `run_id` until it ends; return its final record.

    Prints the shard bar at each quarter and at the end, every extraction batch line,
    every training step (with its loss) and phase change, and on failure the root cause
    the log parser found.
    """
    analysis = fold.LogAnalysis()
    offset, line_no, partial = 0, 0, b""
    said_quarter = -1
    said_train: tuple[Any, ...] = ()
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        runs = (await client.runs()).runs
        run = next((r for r in runs if r.run_id == run_id), None)
        if run is None:
            raise ValueError(f"run {run_id} disappeared from the host")
        log = run.log
        while log:  # all new bytes, then look at the state again
            try:
                data = (await client.read_range(log, offset, CHUNK)).data
            except Exception:  # the log may not exist yet
                break
            if not data:
                break
            offset += len(data)
            *lines, partial = (partial + data).split(b"\n")
            for raw in lines:
                line_no += 1
                line = raw.decode("utf-8", "replace").rstrip("\r")
                analysis = fold.step(analysis, line, line_no, time.time())
                if line.startswith("[extract]"):
                    echo(line)
                shard = analysis.shard
                if shard is not None and shard.total:
                    quarter = 4 * shard.done // shard.total
                    if quarter > said_quarter:
                        said_quarter = quarter
                        echo(f"[load] shards {shard.done}/{shard.total}")
                tr = analysis.train
                if tr is not None and (tr.step, analysis.phase) != said_train[:2]:
                    said_train = (tr.step, analysis.phase)
                    echo(train_line(tr, analysis.phase))
        if run.state != "running":
            cause = analysis.root_cause
            if not succeeded(run) and cause is not None:
                echo(f"root cause (log line {cause.line_no}): {cause.title}: {cause.line.strip()}")
            return run
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still running after {timeout:g} s")
        await asyncio.sleep(POLL_S)
