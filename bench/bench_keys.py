"""CPU of a key that changes the screen: `?` (help on) and Escape (dashboard back).

    python bench/bench_keys.py [--n 30] [--size 160x50]

Runs the dashboard headless (Textual's pilot) on a replayed host with 8 GPUs, one run
and a full log tail, presses `?` and Escape `--n` times each and prints the process CPU
time from each key until the next frame is written, median and 90th percentile. The
peer, in the same run: the same help as a stock translucent `ModalScreen`, which
re-renders and blends the whole dashboard beneath it. CPU time, not wall time, so a
shared machine's load changes it less than it changes the tmux figures of
bench_client.py; the pilot's own polling is counted in both columns alike.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


async def toggle(n: int, size: tuple[int, int], translucent: bool) -> tuple[list[float], list[float]]:
    from textual.app import App

    from tests.replay import ReplayClient, snapshot
    from tests.test_app import CFG, RUN, log_event, until
    from tui.views.app import make_app
    from tui.views.screens import help as help_screen

    css = help_screen.HelpScreen.DEFAULT_CSS
    if translucent:  # Textual's ModalScreen default: the screen below shows through, dimmed
        help_screen.HelpScreen.DEFAULT_CSS = css.replace("background: $background;", "")
    frames = [0]
    display = App._display

    def counted(self: Any, screen: Any, renderable: Any) -> Any:
        frames[0] += 1
        return display(self, screen, renderable)

    App._display = counted  # type: ignore[method-assign]
    try:
        lines = b"".join(b"INFO 11-30 02:00:%02d [engine.py:1] line %d: Avg prompt throughput: "
                         b"1234.5 tokens/s, GPU KV cache usage: 3.4%%\n" % (i % 60, i) for i in range(3000))
        client = ReplayClient([snapshot(8, runs=[RUN]), log_event(lines)])
        app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
        on: list[float] = []
        off: list[float] = []
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: app.dashboard.state.log.offset == len(lines))
            await pilot.pause(0.5)
            for _ in range(n):
                for times, key, shown in ((on, "question_mark", True), (off, "escape", False)):
                    f0, c0 = frames[0], time.process_time()
                    await pilot.press(key)
                    await until(pilot, lambda: isinstance(app.screen, help_screen.HelpScreen) == shown
                                and frames[0] > f0)
                    times.append(1000 * (time.process_time() - c0))
                    await pilot.pause(0.05)
        return on, off
    finally:
        App._display = display  # type: ignore[method-assign]
        help_screen.HelpScreen.DEFAULT_CSS = css


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--size", default="160x50")
    args = ap.parse_args()
    w, h = (int(x) for x in args.size.split("x"))
    print("| help screen | `?` median ms | `?` p90 ms | Escape median ms | Escape p90 ms |")
    print("|---|---:|---:|---:|---:|")
    for name, translucent in (("eagle3-tui (opaque)", False), ("stock translucent ModalScreen (peer)", True)):
        on, off = asyncio.run(toggle(args.n, (w, h), translucent))
        p90 = int(0.9 * (len(on) - 1))
        print(f"| {name} | {statistics.median(on):.1f} | {sorted(on)[p90]:.1f} "
              f"| {statistics.median(off):.1f} | {sorted(off)[p90]:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
