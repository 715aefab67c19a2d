"""Benchmark the full-screen log viewer on a big log, through the real local agent.

    python bench/bench_logviewer.py [--mb 1024] [--keep] [--path /tmp/x.log]

Writes a vLLM-style log (1 GiB by default) under /tmp, opens ``LogViewerScreen`` on it
headless (``App.run_test``) with ``AgentClient(LocalLink())`` serving ``read_range``,
and prints a markdown table: time to the first screen (at the end), jumps to the top
and to random middles, a regex search from the top that hits near the end, the
longest gap between ticks of a 50 ms ``set_interval`` during that search, and this
process's VmRSS before and after. The log is deleted afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from textual.app import App
from textual.widgets import Input

from tui.transport import AgentClient, LocalLink
from tui.views.screens.logviewer import LogViewerScreen

NEEDLE = "FATAL needle-0xC0FFEE: NCCL watchdog timeout"
_LINES = [
    b"(VllmWorker rank=0 pid=4242) INFO 11-30 01:55:00 [model_runner.py:1234] blk=@@@@@@@@ step=%04d"
    b" tokens=8192 ms=31.4\n",
    b"(VllmWorker rank=1 pid=4243) INFO 11-30 01:55:00 [gpu_model_runner.py:88] blk=@@@@@@@@ step=%04d"
    b" hidden_states saved\n",
    b"INFO 11-30 01:55:01 [extract.py:210] [extract] blk=@@@@@@@@ batch %04d/9999 seqs=64 tokens=131072\n",
]
_ERROR_LINE = b"ERROR 11-30 01:55:02 [engine.py:77] blk=@@@@@@@@ step=%04d RuntimeError: transient, retrying\n"


def template(size: int = 1 << 20) -> bytes:
    """One block of log lines; `@@@@@@@@` is replaced by the block number when written."""
    out = bytearray()
    i = 0
    while len(out) < size - 200:
        line = _ERROR_LINE if i % 5000 == 4999 else _LINES[i % len(_LINES)]
        out += line % (i % 10000)
        i += 1
    return bytes(out)


def write_log(path: Path, mb: int) -> int:
    """Write about ``mb`` MiB fast (one formatted block, renumbered); the needle is near the end."""
    block = template()
    with open(path, "wb") as f:
        for b in range(mb):
            f.write(block.replace(b"@@@@@@@@", b"%08d" % b))
            if b == mb - 3:
                f.write(f"(VllmWorker rank=3 pid=4245) {NEEDLE}\n".encode())
    return path.stat().st_size


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class BenchApp(App[None]):
    def __init__(self, screen: LogViewerScreen) -> None:
        super().__init__()
        self.viewer = screen
        self.ticks: list[float] = []

    def on_mount(self) -> None:
        self.set_interval(0.05, lambda: self.ticks.append(time.perf_counter()))
        self.push_screen(self.viewer)


async def until(pilot: object, cond: Callable[[], object], what: str, timeout: float = 600,
                t0: float | None = None) -> float:
    """Seconds from ``t0`` (default now) until ``cond()`` holds (polled every 10 ms)."""
    t0 = time.perf_counter() if t0 is None else t0
    while not cond():
        if time.perf_counter() - t0 > timeout:
            raise SystemExit(f"bench: timed out waiting for {what}")
        await pilot.pause(0.01)  # type: ignore[attr-defined]
    return time.perf_counter() - t0


async def bench(path: Path, size: int, mb: int) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    rss0 = rss_mib()
    client = AgentClient(LocalLink(runs_dir=tempfile.mkdtemp(prefix="bench-lv-runs-")))
    await client.start()
    screen = LogViewerScreen(client=client, path=str(path), follow=True)
    app = BenchApp(screen)
    t_open = time.perf_counter()
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            await until(pilot, lambda: screen.window and screen.window[-1].end >= size, "the first screen")
            rows.append(("open, first screen (at end)", f"{(time.perf_counter() - t_open) * 1000:.0f} ms"))
            t0 = time.perf_counter()
            await screen.run_action("top")  # not pilot.press: it also waits for an idle loop
            dt = await until(pilot, lambda: screen.window and screen.window[0].start == 0, "the top", t0=t0)
            rows.append(("jump to top (g)", f"{dt * 1000:.0f} ms"))
            times = []
            rnd = random.Random(1)
            for _ in range(5):
                d = rnd.randint(1, 9)
                want = size * d // 10
                t0 = time.perf_counter()
                await screen.run_action(f"jump({d / 10})")
                times.append(await until(
                    pilot, lambda w=want: screen.window and screen.window[0].start <= w < screen.window[0].end,
                    f"{d}0%", t0=t0))
                await screen.run_action("top")
                await until(pilot, lambda: screen.window and screen.window[0].start == 0, "the top")
            rows.append(("random jumps to 10–90% (5×)",
                         f"median {sorted(times)[2] * 1000:.0f} ms, max {max(times) * 1000:.0f} ms"))
            t0 = time.perf_counter()
            await screen.run_action("page(1)")
            dt = await until(pilot, lambda: screen.window and screen.window[0].start > 0, "page down", t0=t0)
            rows.append(("page down", f"{dt * 1000:.0f} ms"))
            await pilot.press("g")
            await until(pilot, lambda: screen.window and screen.window[0].start == 0, "the top")
            # search from the top for a line near the end
            await pilot.press("slash")
            box = screen.query_one("#lv-search", Input)
            await until(pilot, lambda: box.has_focus, "the search box")
            box.value = r"needle-0x[0-9A-F]+: NCCL"
            app.ticks.clear()
            t0 = time.perf_counter()
            await box.action_submit()
            await until(pilot, lambda: screen.match is not None, "the search hit")
            dt = time.perf_counter() - t0
            ticks = app.ticks
            gap = max((b - a for a, b in itertools.pairwise(ticks)), default=float("nan"))
            hit = screen.match
            assert hit is not None and NEEDLE in hit.text, hit
            where = f"regex search from top, hit at {100 * hit.start / size:.1f}%"
            rows.append((where, f"{dt:.2f} s ({size / dt / 1e6:.0f} MB/s)"))
            rows.append(("max gap of a 50 ms timer during search", f"{gap * 1000:.0f} ms ({len(ticks)} ticks)"))
            want_no = (mb - 2) * template().count(b"\n") + 1  # the needle follows block mb-3
            assert hit.line_no == want_no, (hit.line_no, want_no)
            rows.append(("line number of the hit (checked)", str(hit.line_no)))
            cache = screen.doc.cache
            held = f"{cache.held_blocks} blocks, {cache.held_bytes / 1048576:.0f} MiB"
            rows.append(("cache held after", f"{held}; index marks {len(screen.doc.index.marks)}"))
            rows.append(("VmRSS before open / after search", f"{rss0:.0f} MiB / {rss_mib():.0f} MiB"))
    finally:
        await client.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1024, help="log size in MiB (default 1024)")
    ap.add_argument("--keep", action="store_true", help="keep the generated log")
    ap.add_argument("--path", type=Path, default=None, help="where to write the log (default /tmp/…)")
    args = ap.parse_args()
    path = args.path or Path(tempfile.gettempdir()) / f"bench-logviewer-{os.getpid()}.log"
    t0 = time.perf_counter()
    size = write_log(path, args.mb)
    gen = time.perf_counter() - t0
    try:
        rows = asyncio.run(bench(path, size, args.mb))
    finally:
        if not args.keep:
            path.unlink(missing_ok=True)
    print(f"\nlog: {path} {size / 2**30:.2f} GiB (written in {gen:.1f} s)"
          + ("" if args.keep else ", deleted"))
    print("\n| measurement | value |\n| --- | --- |")
    for k, v in rows:
        print(f"| {k} | {v} |")


if __name__ == "__main__":
    main()
