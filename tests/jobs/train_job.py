"""A training run for the timeline's loss test, printing a real trainer's log shapes with
no client connected: ``speculators LOG`` prints a real log of speculators' train.py
(tests/fixtures/logs/speculators030_train_cpu.log) line by line, pausing after each
step's metrics; ``hf`` prints what Hugging Face's Trainer prints -- a tqdm bar redrawn
with "\\r", a metrics dict every 4 steps, an evaluation dict after each epoch and the
closing summary (whose train_loss is the run's mean, not a step's loss). It writes the
training losses it printed, in order, to OUT (JSON)."""

import json
import sys
import time

kind, out = sys.argv[1], sys.argv[2]
printed = []
time.sleep(0.3)
if kind == "speculators":
    for line in open(sys.argv[3], encoding="utf-8"):
        sys.stdout.write(line)
        sys.stdout.flush()
        for word in line.split():
            if word.startswith("train/loss="):
                printed.append(float(word.split("=")[1].rstrip(",")))
                time.sleep(0.08)
else:
    total = 40
    for n in range(1, total + 1):
        sys.stdout.write("\r%3d%%|%-10s| %d/%d [00:%02d<00:%02d,  9.50it/s]"
                         % (n * 100 // total, "█" * (n * 10 // total), n, total, n // 10, (total - n) // 10))
        sys.stdout.flush()
        time.sleep(0.1)
        if n % 4 == 0:
            loss = round(3.0 - n * 0.05 + (0.4 if n == 24 else 0.0), 4)
            printed.append(loss)
            print("\n{'loss': %s, 'grad_norm': 1.31, 'learning_rate': 4.5e-05, 'epoch': %.2f}" % (loss, n / 20),
                  flush=True)
        if n % 20 == 0:
            print("{'eval_loss': 7.777, 'eval_runtime': 0.51, 'eval_samples_per_second': 98.0, "
                  "'epoch': %.1f}" % (n / 20), flush=True)
    print("\n{'train_runtime': 4.9, 'train_samples_per_second': 65.3, 'train_steps_per_second': 8.2, "
          "'train_loss': 8.888, 'epoch': 2.0}", flush=True)
json.dump(printed, open(out, "w"))
time.sleep(0.3)
