"""The fleet screen at 8, 16, 32 and 64 hosts: first full frame, client CPU, agent CPU.

    python bench/bench_fleet.py [--sizes 8,16,32,64] [--seconds 30] [--sshds 2] [--limit 16]

Each host is an SSH config alias (`HostName 127.0.0.1`, its own port) onto one of
`--sshds` real OpenSSH servers on loopback (tests/sshd.py, tests/fleet_hosts.py), so
every host is its own SSH connection and its own agent process. For each size the
fleet app runs headless in this process (Textual's `run_test`, 160 columns, a row per
host) with `[host] interval = 1` (the fleet's own pace follows its size:
tui/state/fleet.py `snapshot_interval`) and prints:

1. first full frame: seconds from start until no row says "connecting" any more
   (every host connected, configured and shown with its first snapshot); the steady
   window starts 2 s after every host's log is read and analysed (its failure cause
   known: "every log read s" with --fake-hosts);
2. client CPU: this process's CPU time (user+sys, every thread: asyncssh, the reducer,
   Textual's compositor) over --seconds of steady snapshots, in % of one core;
3. agent CPU per host: the agents' own utime+stime from /proc over the same window,
   summed and divided by the number of hosts (sshd's own cost is left out);
4. growth 8 -> 64: each figure at the largest size over the smallest.

The load average is printed before and after (the machine is shared).

    python bench/bench_fleet.py --fake-hosts 256 [--seconds 30] [--limit 16] [--interval S]

`--fake-hosts N` measures the client alone: N fake hosts (tests/fleet_fake.py, a
separate process: one asyncssh server per host on loopback, the agent's start, upload
and protocol, replaying snapshots recorded from the real agent with 8 stand-in GPUs)
and the fleet app headless in this process at a 160x50 terminal, with the default
config (the fleet's pace by its size) unless --interval sets `[fleet] interval`. It prints the first full
frame, the client's CPU over --seconds of steady state, its peak RSS, the load average
with each figure, and as its last line
`fleet-fake: hosts N first_frame_s X cpu_pct Y rss_mb Z`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TICK = os.sysconf("SC_CLK_TCK")


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def agent_cpu(marker: str) -> tuple[int, float]:
    """(processes, utime+stime seconds) of the agents whose command line holds `marker`."""
    n, total = 0, 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        n += 1
        total += (int(fields[11]) + int(fields[12])) / TICK
    return n, total


def proc_cpu(pid: int | None) -> float:
    """utime+stime seconds of process `pid` (0.0 when None or gone)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb() -> tuple[float, float]:
    """(now, peak) resident memory of this process in MB."""
    with open("/proc/self/status") as f:
        now = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return now / 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def measure(n: int, aliases: list[str], ssh_config: Path, cache: Path, seconds: float,
                  limit: int, interval: float | None = 1.0, fake: bool = False,
                  server_pid: int | None = None) -> dict[str, float]:
    from tui.services.config import parse_config
    from tui.transport import AgentClient
    from tui.transport.ssh import SshLink
    from tui.views.app import make_fleet_app

    section = "fleet" if fake else "host"  # fake: --interval forces the fleet's pace
    cfg = parse_config(f"[{section}]\ninterval = {interval}\n" if interval else "")
    if fake:  # as `eagle3-tui connect` makes them: the host's own python3, its home's cache
        clients = {a: AgentClient(SshLink(a, ssh_config=ssh_config, connect_timeout=30)) for a in aliases[:n]}
    else:
        clients = {
            a: AgentClient(SshLink(a, ssh_config=ssh_config, python=sys.executable, cache_dir=str(cache),
                                   runs_dir=str(cache / "runs"), connect_timeout=30))
            for a in aliases[:n]
        }
    app = make_fleet_app(clients, cfg, limit)
    spy = profile(os.environ.get("FLEET_PROFILE_CONNECT"), 600) if n > 1 else None
    t0, cpu0, server0 = time.monotonic(), self_cpu(), proc_cpu(server_pid)
    async with app.run_test(size=(160, 50) if fake else (160, n + 8)) as pilot:
        screen = app.screen
        while getattr(screen, "first_full_frame", None) is None:
            if time.monotonic() - t0 > 300:
                raise SystemExit(f"{n} hosts: no full frame within 300 s")
            # not pilot.pause: it waits on every widget and forces a screen update, 50 times
            # a second (3 % of the client's CPU to the first frame), as no terminal does
            await asyncio.sleep(0.02)
        first = screen.first_full_frame - t0
        connect_cpu = self_cpu() - cpu0
        server_cpu = proc_cpu(server_pid) - server0
        if spy is not None:
            spy.send_signal(2)
            spy.wait()
        bad = [r.host for r in screen.rows if r.link != "ok"]
        if bad:
            raise SystemExit(f"{n} hosts: not ok: {bad}")
        while not logs_settled(screen.feeds.values()):  # every failure cause found
            if time.monotonic() - t0 > 300:
                raise SystemExit(f"{n} hosts: logs not followed within 300 s")
            await asyncio.sleep(0.05)
        logs = time.monotonic() - t0
        await pilot.pause(2.0)  # past the connect burst and the logs' first reads
        marker = str(cache / "agent-")
        _, a0 = agent_cpu(marker)
        spy = profile(os.environ.get("FLEET_PROFILE_STEADY"), seconds) if n > 1 else None
        seqs0 = sum(max(0, f.state.seq) for f in screen.feeds.values())
        c0, w0 = self_cpu(), time.monotonic()
        await pilot.pause(seconds)
        c1, w1 = self_cpu(), time.monotonic()
        seqs1 = sum(max(0, f.state.seq) for f in screen.feeds.values())
        interval = next(iter(screen.feeds.values())).cfg.host.interval
        agents, a1 = agent_cpu(marker)
        frames = screen.frames
        rss_now, rss_peak = rss_mb()
        await asyncio.gather(*(c.close() for c in clients.values()))
    wall = w1 - w0
    return {"first": first, "client": 100 * (c1 - c0) / wall, "agent": 100 * (a1 - a0) / wall / n,
            "agents": agents, "frames": frames, "rss": rss_now, "rss_peak": rss_peak,
            "snaps": (seqs1 - seqs0) / wall, "interval": interval, "connect_cpu": connect_cpu,
            "server_cpu": server_cpu, "logs": logs}


def logs_settled(feeds: Any) -> bool:
    """Every host's wanted log followed, its first tail in and analysed (the failure
    cause known), or no log to follow."""
    from tui.state import view

    for feed in feeds:
        path, _ = view.wanted_log(feed.state)
        log = feed.state.log
        if path is not None and not (log.path == path and log.sub is not None and log.tail_end is not None
                                     and log.offset >= log.tail_end and not log.older and not log.backlog):
            return False
    return True


def profile(out: str | None, seconds: float) -> subprocess.Popen[bytes] | None:
    """py-spy sampling this process into `out` (raw stacks) for `seconds`, when asked
    (FLEET_PROFILE_CONNECT / FLEET_PROFILE_STEADY=FILE; PY_SPY names the binary)."""
    if not out:
        return None
    spy = os.environ.get("PY_SPY", "py-spy")
    return subprocess.Popen([spy, "record", "--pid", str(os.getpid()), "--rate", "50", "--format", "raw",
                             "--duration", str(int(seconds)), "-o", out], stdout=subprocess.DEVNULL)


def fake_main(n: int, seconds: float, limit: int, interval: float | None) -> None:
    """The client alone against N fake hosts in a separate process (tests/fleet_fake.py)."""
    root = Path(tempfile.mkdtemp(prefix="eagle3-fleet-fake-"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    server = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fleet_fake.py"), "serve", "--hosts", str(n),
                               "--dir", str(root), "--stdin-eof-stops"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert server.stdout is not None
        line = server.stdout.readline().decode()
        if not line.startswith("ready"):
            raise SystemExit(f"fake hosts did not start: {line!r}")
        aliases = (root / "hosts").read_text().split()
        ssh_config = root / "ssh_config"
        print(f"{n} fake hosts (tests/fleet_fake.py, pid {server.pid}), one asyncssh server each on 127.0.0.1; "
              f"snapshot interval {interval or 'of the default config'}; at most {limit} connecting at once; "
              f"{seconds:g} s steady; cpus {os.cpu_count()}")
        asyncio.run(measure(1, aliases, ssh_config, root, 1.0, limit, interval, fake=True))  # the one upload
        load0 = loadavg()
        r = asyncio.run(measure(n, aliases, ssh_config, root, seconds, limit, interval, fake=True,
                                server_pid=server.pid))
        load1 = loadavg()
        print(f"{'hosts':>5}  {'first full frame s':>18}  {'client CPU %':>12}  {'RSS MB (peak)':>13}  "
              f"{'interval s':>10}  {'snapshots/s':>11}  {'repaints':>8}  {'CPU s to first frame':>20}  "
              f"{'every log read s':>16}  load average before / after")
        print(f"{n:>5}  {r['first']:>18.2f}  {r['client']:>12.1f}  {r['rss']:>6.0f} ({r['rss_peak']:.0f})  "
              f"{r['interval']:>10g}  {r['snaps']:>11.1f}  {r['frames']:>8}  {r['connect_cpu']:>20.1f}  "
              f"{r['logs']:>16.2f}  {load0} / {load1}")
        print(f"to the first frame the client used {r['connect_cpu']:.1f} CPU s and the fake hosts' process "
              f"{r['server_cpu']:.1f} CPU s, on {os.cpu_count()} cores")
        print(f"fleet-fake: hosts {n} first_frame_s {r['first']:.2f} cpu_pct {r['client']:.1f} "
              f"rss_mb {r['rss_peak']:.0f}", flush=True)
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="8,16,32,64")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--sshds", type=int, default=2)
    ap.add_argument("--limit", type=int, default=16, help="connections in flight at once")
    ap.add_argument("--fake-hosts", type=int, metavar="N", help="the client alone, against N fake hosts")
    ap.add_argument("--interval", type=float, help="with --fake-hosts: [fleet] interval (default: by the fleet's size)")
    args = ap.parse_args()
    if args.fake_hosts:
        fake_main(args.fake_hosts, args.seconds, args.limit, args.interval)
        return
    sizes = [int(s) for s in args.sizes.split(",")]

    from tests.fleet_hosts import FleetHosts
    from tests.sshd import Sshd

    os.environ.pop("SSH_AUTH_SOCK", None)
    root = Path(tempfile.mkdtemp(prefix="eagle3-fleet-bench-"))
    servers = [Sshd(root / f"sshd{i}").start() for i in range(args.sshds)]
    try:
        hosts = FleetHosts(root / "fleet")
        for i in range(max(sizes)):
            hosts.add_sshd(servers[i % len(servers)])
        ssh_config = hosts.write()
        cache = root / "cache"
        print(f"load average before: {loadavg()}  (cpus: {os.cpu_count()})")
        from tui.state.fleet import snapshot_interval

        paces = ", ".join(f"{snapshot_interval(n, 1.0):g} s at {n}" for n in sizes)
        print(f"{max(sizes)} aliases onto {len(servers)} sshd(s) on 127.0.0.1; {args.seconds:g} s per size; "
              f"[host] interval 1 s, the fleet's pace by its size ({paces}); at most {args.limit} connecting at once")
        asyncio.run(measure(1, hosts.aliases, ssh_config, cache, 1.0, args.limit))  # uploads the agent once
        print(f"{'hosts':>5}  {'first full frame s':>18}  {'client CPU %':>12}  {'agent CPU %/host':>16}"
              f"  {'frames':>6}")
        results: dict[int, dict[str, float]] = {}
        for n in sizes:
            r = asyncio.run(measure(n, hosts.aliases, ssh_config, cache, args.seconds, args.limit))
            results[n] = r
            print(f"{n:>5}  {r['first']:>18.2f}  {r['client']:>12.1f}  {r['agent']:>16.2f}  {r['frames']:>6}",
                  flush=True)
        lo, hi = min(sizes), max(sizes)
        if lo != hi:
            a, b = results[lo], results[hi]
            def ratio(key: str) -> str:  # CPU moves in 10 ms ticks: a zero is below resolution
                return f"x{b[key] / a[key]:.2f}" if a[key] > 0 else "n/a (below the tick resolution)"

            print(f"growth {lo} -> {hi} hosts (x{hi / lo:g}): first frame {ratio('first')}, "
                  f"client CPU {ratio('client')}, agent CPU per host {ratio('agent')}")
        print(f"load average after: {loadavg()}")
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
