"""CPU cost of watching the GPUs at 1 Hz: the eagle3-tui agent beside `nvidia-smi -l 1`
and nvitop (in a pseudo-terminal, 160x50), measured in one run on the same host.

    python bench/bench_gpu_monitors.py [--seconds 30]

Each monitor runs alone for the same wall time; its CPU time (user+system, with
reaped children) comes from /proc/PID/stat. Prints a markdown table with the share of
one core and the ratio to the agent. Monitors that are not installed are reported as n/a.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import shutil
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

AGENT = Path(__file__).resolve().parent.parent / "remote" / "agent" / "main.py"
TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime + cutime + cstime) / TCK


def drain(stream: object) -> None:
    def run() -> None:
        try:
            while os.read(stream if isinstance(stream, int) else stream.fileno(), 65536):  # type: ignore[union-attr]
                pass
        except OSError:
            pass

    threading.Thread(target=run, daemon=True).start()


def measure(proc: subprocess.Popen, seconds: float, warmup: float = 3.0) -> float:
    """Percent of one core used by `proc` over `seconds`, after a warm-up."""
    time.sleep(warmup)
    c0, t0 = cpu_seconds(proc.pid), time.monotonic()
    time.sleep(seconds)
    c1, t1 = cpu_seconds(proc.pid), time.monotonic()
    return 100.0 * (c1 - c0) / (t1 - t0)


def run_agent(seconds: float) -> float:
    proc = subprocess.Popen([sys.executable, "-u", str(AGENT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"id": 1, "op": "configure", "args": {"interval": 1.0}}).encode() + b"\n")
    proc.stdin.flush()
    drain(proc.stdout)
    try:
        return measure(proc, seconds)
    finally:
        proc.stdin.close()
        proc.wait(10)


def run_nvidia_smi(seconds: float) -> float | None:
    if not shutil.which("nvidia-smi"):
        return None
    q = "index,name,uuid,memory.used,memory.total,utilization.gpu,temperature.gpu,power.draw"
    proc = subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits", "-l", "1"],
        stdout=subprocess.PIPE,
    )
    drain(proc.stdout)
    try:
        return measure(proc, seconds)
    finally:
        proc.terminate()
        proc.wait(10)


def run_nvitop(seconds: float) -> float | None:
    try:
        import nvitop  # noqa: F401
    except ImportError:
        return None
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    env = dict(os.environ, TERM="xterm-256color")
    proc = subprocess.Popen(
        [sys.executable, "-m", "nvitop", "--interval", "1"],
        stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True,
    )
    os.close(slave)
    drain(master)
    try:
        return measure(proc, seconds)
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    gpus = (subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.count("GPU ")
            if shutil.which("nvidia-smi") else 0)
    agent = run_agent(args.seconds)
    rows = [("eagle3-tui agent (1 Hz snapshots)", agent),
            ("nvidia-smi --query-gpu -l 1", run_nvidia_smi(args.seconds)),
            ("nvitop --interval 1 (160x50 pty)", run_nvitop(args.seconds))]
    print(f"GPUs: {gpus}; {args.seconds:.0f} s per monitor; CPU share of one core\n")
    print("| monitor at 1 Hz | CPU % of one core | × the agent |")
    print("| --- | ---: | ---: |")
    for name, pct in rows:
        if pct is None:
            print(f"| {name} | n/a (not installed) | |")
        else:
            ratio = pct / agent if agent > 0 else float("inf")
            print(f"| {name} | {pct:.3f} | {ratio:.1f}× |")


if __name__ == "__main__":
    main()
