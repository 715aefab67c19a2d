"""What an idle dashboard's 1 Hz snapshots cost, apart from the machine's other processes.

    python bench/bench_idle_repaint.py [--seconds 30] [--base CHECKOUT]

The real dashboard runs headless (Textual's `run_test`, 160x50; the compositor renders
each frame as in a terminal, nothing is written to one), fed through the tests' replay
client one snapshot a second: one running run and its two processes, no GPU. Three
ways: young (the run 100 s old: its DURATION shows seconds and moves each second; the
processes show when they started, which never moves), old (an hour old: the clock shows
minutes), churn (old,
and every other snapshot has one more process, then not: on the shared build machine
other sessions' test runs come and go in the launched-run bench's process table about
once a second). Between snapshots the bench sleeps (Pilot.pause would wake every
widget, a cost the app never has). CPU is the process's own (time.process_time) over the steady part, in %
of one core; with --base, the same from another checkout, one after the other.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


MODES = {"young": 100.0, "old": 3600.0, "churn": 3600.0}  # mode -> the run's age at the start, s


async def measure(seconds: float, mode: str) -> float:
    from tests.replay import ReplayClient, snapshot
    from tests.test_app import CFG, RUN
    from tui.views.app import make_app

    age = MODES[mode]
    run = dict(RUN, launched_at=time.time() - age)
    churn = mode == "churn"

    def snap(i: int) -> object:
        procs = [dict(pr, elapsed=age + i) for pr in snapshot(2).wire["processes"]]  # the agent's objects
        if churn and i % 2:
            procs.append(dict(procs[0], pid=5000 + i, run_id="20261130-000000-zzzz"))
        return snapshot(2, seq=i, runs=[run], time=time.time(), processes=procs, gpus=[], gpu_source=None,
                        gpu_error="none here")

    client = ReplayClient([snap(0)])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)):  # no pilot.pause: its wait wakes every widget
        for i in range(1, 4):  # past the start-up
            client.push(snap(i))
            await asyncio.sleep(1.0)
        t0, w0, i = time.process_time(), time.monotonic(), 4
        while time.monotonic() - w0 < seconds:
            client.push(snap(i))
            i += 1
            await asyncio.sleep(1.0)
        return 100 * (time.process_time() - t0) / (time.monotonic() - w0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--base", type=Path, help="also the dashboard of this checkout, in its own process")
    ap.add_argument("--one", choices=tuple(MODES), help=argparse.SUPPRESS)  # a child's single figure
    args = ap.parse_args()
    if args.one:
        print(f"{asyncio.run(measure(args.seconds, args.one)):.2f}")
        return 0
    trees = {"this checkout": ROOT, **({f"base ({args.base})": args.base.resolve()} if args.base else {})}
    print(f"load {'/'.join(f'{x:.2f}' for x in os.getloadavg())} at start\n")
    print("| checkout | young: clocks in seconds | old: clocks in minutes | old, churn |\n|---|---:|---:|---:|"
          " (% of one core)")
    for label, tree in trees.items():
        got = []
        for mode in MODES:
            out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_idle_repaint.py"), "--one", mode,
                                  "--seconds", str(args.seconds)], cwd=tree, capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": str(tree)}, timeout=args.seconds + 120)
            got.append(out.stdout.strip().splitlines()[-1] if out.returncode == 0 else f"failed: {out.stderr[-200:]}")
        print(f"| {label} | {' | '.join(got)} |")
    print(f"\nload {'/'.join(f'{x:.2f}' for x in os.getloadavg())} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
