"""The timeline recorder's cost on the host: two real shims (remote/run/shim.py) supervise the
same job side by side, one with the recorder (the default) and one without
(EAGLE3_TUI_TIMELINE=0), with a stand-in nvidia-smi reporting 8 cards first on PATH
(no GPU here). Prints each shim's own CPU (utime+stime) and its children's (the
nvidia-smi calls: the stand-in is a Python script, so that column says little about the
real nvidia-smi; NVML, the agent's first choice, runs in-process and is in the first).

    python bench/bench_timeline.py [SECONDS]     (default 120; the shim's real 5 s tick)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMI = """#!{python}
import sys
arg = sys.argv[1]
u = "GPU-00000000-0000-0000-0000-00000000000%d"
if arg.startswith("--query-gpu="):
    for i in range(8):
        print("%d, NVIDIA H200, %s, 81920, 143771, 97, 60, 650.00, 700.00" % (i, u % i))
"""
# A run that works a little every second (so pace's idle check itself asks no GPU) and
# prints one batch line per second after its load.
JOB = """
import sys, time
print("INFO Model loading took 3.1 GiB and 0.4 seconds", flush=True)
end = time.time() + float(sys.argv[1])
b = 0
while time.time() < end:
    t = time.time() + 0.02
    while time.time() < t:
        pass
    b += 1
    print("[extract] batch %d/100000 (8 samples)" % b, flush=True)
    time.sleep(1.0)
"""


def _cpu(pid: int) -> tuple[float, float]:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    hz = os.sysconf("SC_CLK_TCK")
    return (int(f[11]) + int(f[12])) / hz, (int(f[13]) + int(f[14])) / hz


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 120.0
    tmp = Path(tempfile.mkdtemp(prefix="e3-tl-"))
    (tmp / "bin").mkdir()
    smi = tmp / "bin" / "nvidia-smi"
    smi.write_text(SMI.format(python=sys.executable))
    smi.chmod(0o755)
    (tmp / "job.py").write_text(JOB)
    env = dict(os.environ, PATH=f"{tmp / 'bin'}:{os.environ['PATH']}", EAGLE3_TUI_GPU_SOURCE="nvidia-smi")
    shims = {}
    for label, extra in (("with timeline", {}), ("without", {"EAGLE3_TUI_TIMELINE": "0"})):
        run_dir = tmp / label.replace(" ", "-")
        run_dir.mkdir(mode=0o700)
        (run_dir / "launch.json").write_text(json.dumps({
            "name": "bench", "argv": [sys.executable, str(tmp / "job.py"), str(seconds + 5)],
            "cwd": str(tmp), "env": {}, "launched_at": time.time()}))
        subprocess.run([sys.executable, str(ROOT / "remote" / "run" / "shim.py"), "supervise", str(run_dir)],
                       env=dict(env, **extra), check=True)
        while not (run_dir / "manifest.json").exists():
            time.sleep(0.05)
        shims[label] = (run_dir, json.loads((run_dir / "manifest.json").read_text())["shim_pid"])
    start = {k: _cpu(pid) for k, (_, pid) in shims.items()}
    time.sleep(seconds)
    print(f"{seconds:.0f} s, stand-in nvidia-smi with 8 cards, shim tick 5 s, timeline sample 10 s")
    for k, (run_dir, pid) in shims.items():
        own, kids = (b - a for a, b in zip(start[k], _cpu(pid)))
        size = (run_dir / "timeline.jsonl").stat().st_size if (run_dir / "timeline.jsonl").exists() else 0
        print(f"  {k:<14} shim {own:6.2f} s CPU = {100 * own / seconds:6.3f} % of a core; "
              f"nvidia-smi children {kids:6.2f} s = {100 * kids / seconds:6.3f} %; timeline {size} bytes")
    for run_dir, _ in shims.values():
        while not (run_dir / "exit.json").exists():
            time.sleep(0.5)


if __name__ == "__main__":
    main()
