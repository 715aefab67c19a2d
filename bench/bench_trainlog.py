"""The terminal dashboard's CPU on a run that prints training lines, beside one that prints
extraction lines at the same rate; optionally against another checkout, alternately.

    python bench/bench_trainlog.py [--seconds 15] [--rounds 3] [--against DIR]

For each shape a real run on `local` prints 20 lines/s and `eagle3-tui connect local`
follows it in tmux at 160x50 (as bench/bench_serve.py's terminal phase); the client's
own CPU (utime+stime from /proc) over --seconds after a 4 s settle, in % of one core.
Shapes: `serve` (bench_serve's job: "step N: extracted 256 tokens, loss X", which reads
as training), `spec` (speculators-style `train/loss=…` metrics lines), `hf` (Hugging Face
Trainer `{'loss': …}` dicts) and `extract` (extraction lines, no step or loss).
--against DIR (another checkout, e.g. `git archive 571b733 | tar -x -C DIR`) measures
that checkout and this one alternately, each shape in turn, --rounds times; the 1-minute
load average is printed with every figure (the build machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench_client import Tmux, cpu_s  # noqa: E402

LINES = {
    "serve": 'f"INFO 12-01 21:00:00 [worker.py:{i % 400}] step {i}: extracted 256 tokens, loss {1 / (i + 1):.5f}"',
    "spec": 'f"train/loss_0={2 / (i + 1):.4f}, train/loss={2 / (i + 1):.4f}, epoch=0, lr=1e-4"',
    "hf": 'str({"loss": round(2 / (i + 1), 4), "grad_norm": 1.5, "learning_rate": 1e-4, "epoch": round(i / 1000, 2)})',
    "extract": 'f"INFO 12-01 21:00:00 [worker.py:{i % 400}] extracted 256 tokens for sample {i}"',
}


def measure(checkout: Path, shape: str, seconds: float) -> float:
    """% of one core the client of `checkout` used following a run that prints `shape`."""
    work = Path(tempfile.mkdtemp(prefix="bench-trainlog-"))
    (work / "job.py").write_text(f"import time\ni = 0\nwhile True:\n    print({LINES[shape]}, flush=True)\n"
                                 "    i += 1\n    time.sleep(0.05)\n")
    cfg = work / "eagle3.toml"
    cfg.write_text(f'[host]\nruns_dir = "{work / "runs"}"\npython = "{sys.executable}"\n'
                   f'[run]\nname = "bench"\ncommand = ["{sys.executable}", "{work / "job.py"}"]\n'
                   f'cwd = "{work}"\ngraces = [0.5, 0.5]\ngpu_wait = 0\n')
    env = dict(os.environ, PYTHONPATH=str(checkout))

    def e3(*args: str) -> str:
        return subprocess.run([sys.executable, "-m", "tui.cli", "--config", str(cfg), *args], cwd=checkout,
                              capture_output=True, text=True, check=True, env=env).stdout

    rid = json.loads(e3("launch", "local", "--json"))["run_id"]
    here = os.getcwd()
    os.chdir(checkout)  # tmux starts `python -m tui.cli` in this cwd, which comes first on sys.path
    try:
        dash = Tmux("trainlog", f"env PYTHONPATH={checkout} {sys.executable} -m tui.cli --config {cfg} connect local")
    finally:
        os.chdir(here)
    try:
        assert dash.wait([rid], 30) is not None, dash.screen()
        time.sleep(4)  # past the start-up
        c0, t0 = cpu_s(dash.pid), time.monotonic()
        time.sleep(seconds)
        return 100 * (cpu_s(dash.pid) - c0) / (time.monotonic() - t0)
    finally:
        dash.kill()
        e3("kill", "local", rid, "--yes")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--against", metavar="DIR", help="another checkout, measured alternately with this one")
    ap.add_argument("--shapes", default=",".join(LINES))
    args = ap.parse_args()
    checkouts = ([Path(args.against).resolve()] if args.against else []) + [ROOT]
    shapes = args.shapes.split(",")
    got: dict[tuple[Path, str], list[float]] = {}
    for _ in range(args.rounds):
        for shape in shapes:
            for checkout in checkouts:
                load = os.getloadavg()[0]
                cpu = measure(checkout, shape, args.seconds)
                got.setdefault((checkout, shape), []).append(cpu)
                print(f"{checkout}  {shape:8s} client {cpu:5.1f} %  (load {load:.2f} -> {os.getloadavg()[0]:.2f})",
                      flush=True)
    print("\n| shape | " + " | ".join(str(c) for c in checkouts) + " |")
    print("|---|" + "---:|" * len(checkouts))
    for shape in shapes:
        cells = []
        for c in checkouts:
            v = sorted(got[(c, shape)])
            cells.append(f"median {v[len(v) // 2]:.1f} ({', '.join(f'{x:.1f}' for x in got[(c, shape)])})")
        print(f"| {shape} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
