"""CPU cost of the agent's GPU readings at 1 Hz under a Python without nvidia-ml-py:
NVML through the pynvml the client uploads with the agent, against nvidia-smi.

    python bench/bench_nvml_upload.py [--seconds 60] [--python python3]

The agent directory is made as the client uploads it (`agent_files`: remote/*.py and
nvidia-ml-py's pynvml.py from the client's installed copy) and the agent runs from it
with `PYTHON -E -S` (no site-packages, no PYTHONPATH: no host pynvml, as on a login's python3). Each mode
runs alone for the same wall time; CPU time (user+system, reaped nvidia-smi children
included) comes from /proc/PID/stat. Prints the source each snapshot named and the share
of one core.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_gpu_monitors import cpu_seconds  # noqa: E402

from tui.transport.bundle import AGENT_MAIN, UPLOADED_PYNVML, agent_files, agent_sha  # noqa: E402


def run(python: str, agent_dir: Path, env: dict[str, str], seconds: float) -> tuple[str, int, float]:
    """(gpu_source or error, GPUs seen, % of one core) for one agent at 1 Hz."""
    import os

    proc = subprocess.Popen([python, "-E", "-S", "-u", str(agent_dir / AGENT_MAIN)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env={**os.environ, **env})
    assert proc.stdin is not None and proc.stdout is not None
    snaps: list[dict] = []

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            msg = json.loads(line)
            if msg.get("type") == "snapshot":
                snaps.append(msg)

    threading.Thread(target=read, daemon=True).start()
    proc.stdin.write(json.dumps({"id": 1, "op": "configure", "args": {"interval": 1.0}}).encode() + b"\n")
    proc.stdin.flush()
    try:
        time.sleep(3.0)  # start-up and the first snapshots
        c0, t0, n0 = cpu_seconds(proc.pid), time.monotonic(), len(snaps)
        time.sleep(seconds)
        c1, t1, n1 = cpu_seconds(proc.pid), time.monotonic(), len(snaps)
    finally:
        proc.stdin.close()
        proc.wait(10)
    last = snaps[-1] if snaps else {}
    source = last.get("gpu_source") or f"none: {last.get('gpu_error')}"
    print(f"  {source}: {n1 - n0} snapshots in {t1 - t0:.1f} s", file=sys.stderr)
    return source, len(last.get("gpus") or []), 100.0 * (c1 - c0) / (t1 - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--python", default="python3", help="the host's Python the agent runs on")
    args = ap.parse_args()
    files = agent_files(ROOT / "remote")
    if UPLOADED_PYNVML not in files:
        sys.exit("nvidia-ml-py is not installed for the client: nothing to upload")
    has = subprocess.run([args.python, "-E", "-S", "-c", "import pynvml"], capture_output=True).returncode == 0
    print(f"{args.python} -E -S imports a pynvml of its own: {has}; agent {agent_sha(files)[:12]}, "
          f"{len(files)} files")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for name, data in files.items():
            (d / name).parent.mkdir(exist_ok=True)
            (d / name).write_bytes(data)
        rows = [("uploaded pynvml (NVML)", *run(args.python, d, {}, args.seconds)),
                ("forced nvidia-smi", *run(args.python, d, {"EAGLE3_TUI_GPU_SOURCE": "nvidia-smi"}, args.seconds))]
    print(f"\n| agent at 1 Hz, {args.seconds:g} s | source | GPUs | % of one core |\n| --- | --- | ---: | ---: |")
    for what, source, n, pct in rows:
        print(f"| {what} | {source} | {n} | {pct:.3f} |")
    if rows[0][3] > 0:
        print(f"\nnvidia-smi / NVML = {rows[1][3] / rows[0][3]:.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
