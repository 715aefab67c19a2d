"""The first frame after `connect`: does the progress panel show the log's newest step
and loss (issue 36, item 6)? A tmux capture 1 s after the start, per checkout.

    python bench/bench_first_frame.py [--base CHECKOUT] [--wait 1] [--steps 32000]

Writes a long training log (Hugging Face Trainer shapes: a metrics dict and a step bar
per step; 32,000 steps is ~4 MB, the whole of what the client analyses), keeps it
growing by a step every 3 s as a slow training does, then captures the dashboard
(`eagle3-tui connect local` with `[run] log` set to it) in tmux at 160x50 `--wait`
seconds after the status bar first says "connected", and says whether the step and loss
on the capture are the log's last ones; and every step the panel showed in its first
`--watch` seconds (stale numbers climbing to the truth, or the truth at once). With
`--shot S`, also /work/shared/tools/tui-shot's capture S seconds after the command starts
(the start-up itself takes ~0.5-2 s on a loaded machine).
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench_client import Tmux  # noqa: E402

TOTAL = 40_000
SHOT = "/work/shared/tools/tui-shot"


def step_lines(n: int) -> str:
    loss = 2 / (1 + n / 500) + (n % 7) * 1e-4
    return (f"{{'loss': {loss:.4f}, 'grad_norm': 1.1, 'learning_rate': 2e-05, 'epoch': {n / TOTAL:.2f}}}\n"
            f"{100 * n // TOTAL:3d}%|{'#' * (20 * n // TOTAL):<20}| {n}/{TOTAL} [01:00<09:00,  0.33it/s]\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", type=Path, help="also capture a dashboard of this checkout (before)")
    ap.add_argument("--wait", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=32_000)
    ap.add_argument("--watch", type=float, default=6.0)
    ap.add_argument("--shot", type=float, default=0.0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-first-frame-"))
    log = work / "train.log"
    log.write_text("".join(step_lines(n) for n in range(1, args.steps + 1)))
    cfg = work / "eagle3.toml"
    cfg.write_text(f'[host]\nruns_dir = "{work / "runs"}"\n[run]\nname = "train"\nlog = "{log}"\n')
    stop = threading.Event()
    n = [args.steps]

    def grow() -> None:
        while not stop.wait(3.0):
            n[0] += 1
            with open(log, "a") as f:
                f.write(step_lines(n[0]))

    writer = threading.Thread(target=grow, daemon=True)
    writer.start()
    print(f"log {log}: {log.stat().st_size / 1e6:.1f} MB, {2 * args.steps:,} lines, a step every 3 s")
    ok = True
    try:
        for label, tree in [("this checkout", ROOT)] + ([("base", args.base.resolve())] if args.base else []):
            cmd = ["env", f"PYTHONPATH={tree}", sys.executable, "-m", "tui.cli", "--config", str(cfg), "connect",
                   "local"]
            dash = Tmux("ff", shlex.join(cmd), tree)
            try:
                took = dash.wait(["connected"], 30)
                t0, seen, shot, last = time.monotonic(), [], "", []
                while time.monotonic() - t0 < max(args.watch, args.wait):
                    screen = dash.screen()
                    if not shot and time.monotonic() - t0 >= args.wait:
                        shot, last = screen, log.read_text().splitlines()  # the log as it is now
                    shown = re.findall(r"step (\d+)/", screen)
                    if shown and (not seen or seen[-1][1] != shown[0]):
                        seen.append((time.monotonic() - t0, shown[0]))
                    time.sleep(0.05)
            finally:
                dash.kill()
            step = re.findall(r"\| (\d+)/", last[-1])[0]
            loss = re.findall(r"'loss': ([\d.]+)", last[-2])[0]
            shown_step = re.findall(r"step (\d+)/", shot)
            shown_loss = re.findall(r"loss +([\d.]+)", shot)
            same = shown_step[:1] == [step] and bool(shown_loss) and float(shown_loss[0]) == float(loss)
            ok = ok and (same or label == "base")
            print(f"\n== {label} ({tree}): `connect local`, \"connected\" on screen {took or float('nan'):.2f} s"
                  f" after the start; the screen {args.wait:g} s later:\n{shot}")
            print(f"log's last line: step {step}, loss {loss}; on the capture: step "
                  f"{shown_step[0] if shown_step else 'none'}, loss {shown_loss[0] if shown_loss else 'none'}"
                  f" -> {'SAME' if same else 'DIFFERENT'}")
            print(f"steps the panel showed in the first {args.watch:g} s after \"connected\" (s: step): "
                  + (", ".join(f"{t:.2f}: {v}" for t, v in seen) or "none"))
            if args.shot:
                out = subprocess.run([SHOT, "--size", "160x50", "--wait", str(args.shot), "--", *cmd],
                                     capture_output=True, text=True, timeout=60, cwd=tree).stdout
                got = re.findall(r"step (\d+)/", out)
                now = re.findall(r"[|] (\d+)/", log.read_text().splitlines()[-1])[0]
                print(f"`tui-shot --wait {args.shot:g}`: step {got[0] if got else 'none'} on the panel"
                      f" (log's last {now})")
    finally:
        stop.set()
        writer.join()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
