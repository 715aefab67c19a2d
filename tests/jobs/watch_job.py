"""A stand-in for a vLLM extraction job, for watch tests: a real process that writes a
real log in vLLM's shapes (a worker-prefixed shard bar, the load milestone, extractor
batches) and then does what its mode says.

    python watch_job.py MODE [STEP_S]
    finish  load 8 shards, 4 batches, exit 0
    fail    load, 2 batches, then raise RuntimeError (CUDA OOM wording): exit 1
    stall   load 4 of 8 shards, then sleep (no progress, asleep)
    hang    load all 8, then sleep forever (asleep, after the load)
    spin    load all 8, then burn CPU for 60 s writing nothing (busy, not hung)
    slow    load all 8, then one batch every STEP_S × 5 s, 1000 batches
"""

import os
import sys
import time

mode = sys.argv[1]
step = float(sys.argv[2]) if len(sys.argv) > 2 else 0.2
pid = os.getpid()
n = 8


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


for i in range(n + 1):
    if mode == "stall" and i == 5:
        time.sleep(3600)
    say(f"(Worker_TP0 pid={pid}) Loading safetensors checkpoint shards: {100 * i // n:3d}% Completed"
        f" | {i}/{n} [00:{i:02d}<00:{n - i:02d},  1.00it/s]")
    time.sleep(step)
say(f"(Worker_TP0 pid={pid}) INFO 12-01 04:00:00 [default_loader.py:262] Loading weights took {n * step:.2f} seconds")
if mode == "hang":
    time.sleep(3600)
if mode == "spin":
    end = time.monotonic() + 60
    while time.monotonic() < end:
        pass
    sys.exit(0)
batches = 1000 if mode == "slow" else 4
for b in range(1, batches + 1):
    say(f"[extract] batch {b}/{batches} | seqs {8 * b}/{8 * batches} | tokens {256 * b}/{256 * batches} |"
        f" 1000.0 tok/s | elapsed 0:00:0{min(b, 9)} | eta 0:00:01")
    time.sleep(step * (5 if mode == "slow" else 1))
    if mode == "fail" and b == 2:
        raise RuntimeError("CUDA out of memory occurred when warming up sampler with 256 dummy requests.")
say(f"[extract] done: {8 * batches} sequences, {256 * batches} tokens in 0:00:01 (1000.0 tok/s) -> /tmp/index.json")
