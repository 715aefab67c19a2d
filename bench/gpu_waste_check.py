"""On a GPU host: the host stops waste with no client connected, on real GPUs (NVML).

Two runs, each launched with the real CLI (`eagle3-tui launch`, which exits at once):

- diverge: a PyTorch MLP trained on the GPU with SGD at lr 1e6, holding `--gib` GiB of
  GPU memory, logging HF-style metric dicts; `[watch] on_diverge = "kill"`;
- idle: a job that takes `--gib` GiB of GPU memory, trains three steps, then waits on
  nothing; `[watch] on_idle = "kill"`, `idle_s = --idle-s`.

For each it waits until the run ended and prints `runs show` (text) and the parts of
`runs show --json` that prove it: the outcome, the stop and its GPU-free proof (the
card's memory held by the run before and after), the GPU-hours wasted after the moment.
Exit 0 only when both were stopped by the host with their GPUs proved free.

    python bench/gpu_waste_check.py --gib 8 --idle-s 20
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

DIVERGE = """
import sys, time, torch
hold = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e6)
x = torch.randn(256, 16, device="cuda")
y = x.sum(dim=1, keepdim=True)
print("***** Running training *****", flush=True)
for step in range(1, 100000):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    opt.step()
    print({"loss": round(loss.item(), 4), "grad_norm": round(norm.item(), 4), "learning_rate": 1e6,
           "epoch": round(step / 100, 2)}, flush=True)
    time.sleep(0.2)
"""

IDLE = """
import sys, threading, time, torch
hold = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
print("Model loading took %.1f GiB and 1.0 seconds" % float(sys.argv[1]), flush=True)
for step in range(1, 4):
    print("step=%d loss=%.3f lr=1e-4" % (step, 2.0 / step), flush=True)
    time.sleep(0.2)
print("waiting for the all-reduce from rank 1 ...", flush=True)
threading.Event().wait()
"""


def e3(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])})


def one(name: str, job: str, watch: str, gib: float, timeout: float) -> bool:
    tmp = Path(tempfile.mkdtemp(prefix=f"e3-{name}-"))
    (tmp / "job.py").write_text(job)
    (tmp / "eagle3.toml").write_text(
        f'[host]\nruns_dir = "{tmp / "runs"}"\npython = "{sys.executable}"\n'
        f'[run]\nname = "{name}"\ncommand = {json.dumps([sys.executable, str(tmp / "job.py"), str(gib)])}\n'
        f'cwd = "{tmp}"\ngraces = [5.0, 5.0]\ngpu_wait = 30\nrestart = "on-failure"\n[watch]\n{watch}')
    t0 = time.monotonic()
    out = e3(tmp, "launch")
    print(f"== {name}: $ eagle3-tui launch\n{out.stdout.strip()}{out.stderr.strip()}", flush=True)
    if out.returncode != 0:
        return False
    shown: dict = {}
    while time.monotonic() - t0 < timeout:
        got = e3(tmp, "runs", "show", "--json")
        if got.returncode == 0:
            shown = json.loads(got.stdout)
            if shown.get("state") not in ("running", "pending", "waiting"):
                break
        time.sleep(2)
    print(f"== {name}: ended after {time.monotonic() - t0:.0f} s (no client attached)")
    print(e3(tmp, "runs", "show").stdout)
    keep = {k: shown.get(k) for k in ("state", "outcome", "attempts", "restarts", "gpu_hours", "stopped", "wasted")}
    print(json.dumps(keep, indent=1))
    stop = shown.get("stopped") or {}
    return bool(stop.get("gpus_free")) and stop.get("what") == name and shown.get("restarts") == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--idle-s", type=float, default=20.0)
    ap.add_argument("--timeout", type=float, default=180.0)
    a = ap.parse_args()
    ok = one("diverged", DIVERGE, 'on_diverge = "kill"\n', a.gib, a.timeout)
    ok = one("idle", IDLE, f'on_idle = "kill"\nidle_s = {a.idle_s}\n', a.gib, a.timeout) and ok
    print("both stopped by the host, GPUs proved free" if ok else "NOT both stopped with a proof")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
