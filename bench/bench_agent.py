"""Measure what the host agent costs, and what its cheap /proc sampling saves.

    python bench/bench_agent.py [--procs 1000] [--seconds 20] [--snapshots 50]

Spawns --procs idle `sleep` processes (killed at the end), then measures, from the
agent's own /proc/PID/stat (utime+stime):
  (a) agent CPU time per `snapshot` request, versus one `nvidia-smi --query-gpu` call;
  (b) agent CPU share at 1 Hz over --seconds;
  (c) both again with EAGLE3_TUI_FULL_SCAN=1 (every process read every tick).
Prints a small markdown table.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.agent_driver import AgentProc

CLK_TCK = os.sysconf("SC_CLK_TCK")
SMI_QUERY = ("--query-gpu=index,name,uuid,memory.used,memory.total,utilization.gpu,"
             "temperature.gpu,power.draw,power.limit")


def cpu_seconds(pid: int) -> float:
    """utime+stime of a process, in seconds."""
    with open("/proc/%d/stat" % pid, "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def measure(full_scan: bool, snapshots: int, seconds: float) -> dict[str, float]:
    env = {"EAGLE3_TUI_FULL_SCAN": "1" if full_scan else "0"}
    with AgentProc(env=env) as agent:
        pid = agent.proc.pid
        c0 = cpu_seconds(pid)
        agent.call("snapshot")  # the first one discovers every PID
        first = cpu_seconds(pid) - c0
        agent.call("configure", {"interval": 3600, "match": "no-such-marker-bench"})
        c0 = cpu_seconds(pid)
        for _ in range(snapshots):
            agent.call("snapshot")
        per_snap = (cpu_seconds(pid) - c0) / snapshots
        mark = agent.mark()
        agent.call("configure", {"interval": 1.0})
        start = agent.wait_for(lambda m: m["type"] == "snapshot", since=mark)["seq"]
        c0, t0 = cpu_seconds(pid), time.monotonic()
        last = start + max(1, int(seconds))
        agent.wait_for(lambda m: m["type"] == "snapshot" and m["seq"] >= last, since=mark,
                       timeout=seconds + 10)
        share = (cpu_seconds(pid) - c0) / (time.monotonic() - t0) * 100
        n_procs = len(agent.call("snapshot")["processes"])
    return {"first_ms": first * 1000, "snap_ms": per_snap * 1000, "share": share,
            "listed": n_procs}


def nvidia_smi_ms() -> str:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return "n/a: no nvidia-smi"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([exe, SMI_QUERY, "--format=csv"], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return "%.1f" % (used * 1000)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=1000, help="idle processes to add")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the 1 Hz run")
    parser.add_argument("--snapshots", type=int, default=50, help="snapshot requests timed")
    opts = parser.parse_args()
    sleepers: list[subprocess.Popen] = []
    try:
        for _ in range(opts.procs):
            sleepers.append(subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL))
        total = len([p for p in os.listdir("/proc") if p.isdigit()])
        # The agent re-reads the cmdline of processes younger than 3 s (they may not have
        # exec'd yet when first seen); let the sleepers age so we time the steady state.
        time.sleep(3.5)
        cheap = measure(False, opts.snapshots, opts.seconds)
        full = measure(True, opts.snapshots, opts.seconds)
        smi = nvidia_smi_ms()
    finally:
        for p in sleepers:
            p.kill()
        for p in sleepers:
            p.wait()
    def ratio(a: float, b: float) -> str:
        return "%.1fx" % (b / a) if a > 0 else "n/a (below tick)"

    print("\n%d processes on the host (%d idle sleepers added); GPU: see nvidia-smi row\n"
          % (total, opts.procs))
    print("| measure | cheap scheme | full scan every tick | full / cheap |")
    print("| --- | ---: | ---: | ---: |")
    print("| first snapshot, CPU ms (discovers every PID) | %.1f | %.1f | %s |"
          % (cheap["first_ms"], full["first_ms"], ratio(cheap["first_ms"], full["first_ms"])))
    print("| CPU ms per snapshot (mean of %d) | %.2f | %.2f | %s |"
          % (opts.snapshots, cheap["snap_ms"], full["snap_ms"],
             ratio(cheap["snap_ms"], full["snap_ms"])))
    print("| CPU %% of one core at 1 Hz over %.0f s | %.2f | %.2f | %s |"
          % (opts.seconds, cheap["share"], full["share"], ratio(cheap["share"], full["share"])))
    print("| nvidia-smi --query-gpu, CPU ms per call | %s | | |" % smi)
    if smi[0].isdigit() and cheap["snap_ms"] > 0:
        print("\nagent snapshot / nvidia-smi call = %.3f" % (cheap["snap_ms"] / float(smi)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
