"""Log-line latency: append on the "host" -> LogData in AgentClient over SSH, vs `ssh tail -F`.

Starts a throw-away OpenSSH sshd on 127.0.0.1 (tests/sshd.py). One writer appends
numbered lines to a file at ~20 Hz; two readers follow it at the same time:
our AgentClient (SshLink to the real agent), OpenSSH `ssh -F cfg gpubox tail -F`,
and, for reference, AgentClient over LocalLink (the agent's own delay, no SSH).
Each line's latency is its arrival time minus its append time (same clock).

    python bench/bench_latency.py [--lines 200] [--rate 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.sshd import Sshd, sshd_missing
from tui.protocol import LogData
from tui.transport import AgentClient, LocalLink
from tui.transport.ssh import SshLink

WARMUP = b"warmup\n"


def numbered(buf: bytearray, arrivals: dict[int, float]) -> None:
    """Record the arrival time of every complete `line N` in buf; keep the partial tail."""
    now = time.perf_counter()
    *lines, rest = bytes(buf).split(b"\n")
    for line in lines:
        if line.startswith(b"line "):
            arrivals.setdefault(int(line.split()[1]), now)
    buf[:] = rest


async def follow_ours(
    client: AgentClient, arrivals: dict[int, float], ready: asyncio.Event
) -> None:
    buf = bytearray()
    async for ev in client.events():
        if isinstance(ev, LogData):
            buf += ev.data
            if WARMUP.strip() in buf:
                ready.set()
            numbered(buf, arrivals)


async def follow_tail(
    proc: asyncio.subprocess.Process, arrivals: dict[int, float], ready: asyncio.Event
) -> None:
    assert proc.stdout
    buf = bytearray()
    while line := await proc.stdout.readline():
        buf += line
        if line == WARMUP:
            ready.set()
        numbered(buf, arrivals)


def summary(name: str, sent: dict[int, float], arrivals: dict[int, float]) -> tuple[float, ...]:
    lat = sorted((arrivals[i] - sent[i]) * 1000 for i in sent if i in arrivals)
    lost = len(sent) - len(lat)
    p50 = statistics.median(lat)
    p95 = lat[min(len(lat) - 1, int(round(0.95 * (len(lat) - 1))))]
    print(
        f"| {name:<28} | {len(lat):>5} | {lost:>4} | {p50:>8.2f} | {p95:>8.2f} | {lat[-1]:>8.2f} |"
    )
    return p50, p95, lat[-1]


async def main(lines: int, rate: float) -> int:
    reason = sshd_missing()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    with Sshd() as sshd, tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "bench.log"
        log.write_bytes(b"")
        link = SshLink(
            sshd.alias,
            ssh_config=sshd.ssh_config,
            python=sys.executable,
            cache_dir=os.path.join(tmp, "cache"),
        )
        client = AgentClient(link)
        await client.start()
        await client.subscribe("bench", str(log), 0)
        # The same agent without SSH, to separate the agent's own delay from the link's.
        local = AgentClient(LocalLink())
        await local.start()
        await local.subscribe("bench", str(log), 0)
        tail = await asyncio.create_subprocess_exec(
            "ssh",
            "-F",
            str(sshd.ssh_config),
            sshd.alias,
            "tail",
            "-n",
            "+1",
            "-F",
            str(log),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        ours_at: dict[int, float] = {}
        tail_at: dict[int, float] = {}
        local_at: dict[int, float] = {}
        ours_ready, tail_ready, local_ready = asyncio.Event(), asyncio.Event(), asyncio.Event()
        readers = [
            asyncio.create_task(follow_ours(client, ours_at, ours_ready)),
            asyncio.create_task(follow_ours(local, local_at, local_ready)),
            asyncio.create_task(follow_tail(tail, tail_at, tail_ready)),
        ]
        with open(log, "ab", buffering=0) as f:
            f.write(WARMUP)
            await asyncio.wait_for(
                asyncio.gather(ours_ready.wait(), tail_ready.wait(), local_ready.wait()), 20
            )
            sent: dict[int, float] = {}
            start = time.perf_counter()
            for i in range(lines):
                # Keep a steady schedule; each line is one write() so readers never see half of it.
                await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
                sent[i] = time.perf_counter()
                f.write(f"line {i} {'x' * 60}\n".encode())
        deadline = time.monotonic() + 10
        while (
            min(len(ours_at), len(tail_at), len(local_at)) < lines and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.05)
        for task in readers:
            task.cancel()
        tail.kill()
        await tail.wait()
        await client.close()
        await local.close()
        print(f"{lines} lines at {rate:g} Hz, sshd on 127.0.0.1, latency append -> arrival (ms)\n")
        print(
            f"| {'reader':<28} | {'got':>5} | {'lost':>4} | {'p50':>8} | {'p95':>8} | {'max':>8} |"
        )
        print(f"|{'-' * 30}|{'-' * 7}|{'-' * 6}|{'-' * 10}|{'-' * 10}|{'-' * 10}|")
        ours = summary("AgentClient over SshLink", sent, ours_at)
        theirs = summary("ssh tail -F (OpenSSH)", sent, tail_at)
        summary("AgentClient over LocalLink", sent, local_at)
        print(f"\np50(ours) / p50(tail) = {ours[0] / theirs[0]:.2f}")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=200)
    ap.add_argument("--rate", type=float, default=20.0, help="lines per second")
    opts = ap.parse_args()
    sys.exit(asyncio.run(main(opts.lines, opts.rate)))
