"""The job `bench_client.py` launches through `eagle3-tui launch`: a run's log as a
launched run writes it, paced by commands the bench sends down a FIFO.

    python bench/bench_job.py FIFO

Commands, one a line: `rate N` (lines per second, 0: quiet), `mode extract|train`,
`marker TEXT` (that line, at once), `end` (exit 0). It starts with a few shard-loading
lines. Extraction lines are vLLM-like, 120-145 characters, every tenth an `[extract]`
progress line; training lines are Hugging Face Trainer metrics dicts, every tenth a
tqdm step bar. Every line is one `write()` to stdout, as a Python logger's handler
writes it.
"""

from __future__ import annotations

import os
import random
import select
import sys
import time

TOTAL = 20_000  # training steps; extraction batches


class Lines:
    def __init__(self) -> None:
        self.n, self.step, self.mode = 0, 0, "extract"
        self.rng = random.Random(7)

    def next(self) -> str:
        self.n += 1
        n, rng = self.n, self.rng
        if self.mode == "train":
            if n % 10 == 0:
                self.step += 1
                pct = 100 * self.step // TOTAL
                return (f"{pct:3d}%|{'█' * (pct // 5):<20}| {self.step}/{TOTAL} "
                        f"[{self.step // 60:02d}:{self.step % 60:02d}<09:00,  2.00it/s]")
            loss = 2 / (1 + self.step / 500) + rng.uniform(0, 0.05)
            return (f"{{'loss': {loss:.4f}, 'grad_norm': {rng.uniform(0.5, 2):.3f}, "
                    f"'learning_rate': 2e-05, 'epoch': {self.step / TOTAL:.2f}}}")
        if n % 10 == 0:
            b = n // 10
            line = (f"[extract] batch {b}/{TOTAL} | seqs {8 * b}/{8 * TOTAL} | tokens {2048 * b}/{2048 * TOTAL} | "
                    f"{rng.uniform(1400, 1600):.1f} tok/s | elapsed 0:{b // 60 % 60:02d}:{b % 60:02d} | eta 2:10:00")
        else:
            line = (f"(VllmWorker TP{n % 8} pid={4100 + n % 8}) INFO 12-05 21:{n // 60 % 60:02d}:{n % 60:02d} "
                    f"[gpu_model_runner.py:{1000 + n % 900}] step {n}: Avg prompt throughput: "
                    f"{rng.uniform(0, 9e3):.1f} tokens/s, Running: {n % 64} reqs, KV cache {rng.uniform(0, 99):.1f}%")
        return line[:145].ljust(120)


def main() -> int:
    fifo = sys.argv[1]
    rd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    keep = os.open(fifo, os.O_WRONLY)  # a writer always open: no EOF between the bench's commands
    out = sys.stdout.fileno()
    for i in range(1, 9):
        os.write(out, f"Loading safetensors checkpoint shards: {100 * i // 8}% Completed | {i}/8 [00:0{i}<00:00]\n"
                 .encode())
    lines, rate, buf, due = Lines(), 0.0, b"", time.monotonic()
    while True:
        now = time.monotonic()
        wait = max(0.0, due - now) if rate else 1.0
        ready, _, _ = select.select([rd], [], [], wait)
        if ready:
            buf += os.read(rd, 4096)
            while b"\n" in buf:
                cmd, buf = buf.split(b"\n", 1)
                word, _, arg = cmd.decode().partition(" ")
                if word == "rate":
                    rate, due = float(arg), time.monotonic()
                elif word == "mode":
                    lines.mode = arg
                elif word == "marker":
                    os.write(out, (arg + "\n").encode())
                elif word == "end":
                    os.close(keep)
                    return 0
            continue
        if rate and time.monotonic() >= due:
            os.write(out, (lines.next() + "\n").encode())
            due += 1 / rate


if __name__ == "__main__":
    sys.exit(main())
