"""A tiny stand-in run for the timeline test: loads 8 shards, says the model is loaded,
then takes its cards (writes its pid to HELD, which the stand-in nvidia-smi reads),
prints extraction batches and ends. It notes when each stage happened in TIMES (JSON)."""

import json
import os
import sys
import time

held, times = sys.argv[1], sys.argv[2]
seen = {"start": time.time()}
time.sleep(0.5)
for n in range(1, 9):
    print("Loading safetensors checkpoint shards: %3d%% Completed | %d/8 [00:%02d<00:10, 1.0it/s]"
          % (n * 100 // 8, n, n), flush=True)
    time.sleep(0.25)
print("INFO Model loading took 3.1 GiB and 2.0 seconds", flush=True)
seen["loaded"] = time.time()
with open(held, "w") as f:
    f.write(str(os.getpid()))
time.sleep(1.0)
seen["first_batch"] = time.time()
for b in range(1, 21):
    print("[extract] batch %d/20 (4 samples)" % b, flush=True)
    time.sleep(0.2)
print("[extract] done: 80 samples", flush=True)
time.sleep(0.5)
os.unlink(held)  # the cards are free again
time.sleep(0.8)
seen["end"] = time.time()
with open(times, "w") as f:
    json.dump(seen, f)
