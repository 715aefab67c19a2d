"""A stand-in run for the history test: a load of 8 shards that starts after LOAD_S
seconds (env) and once the file GO exists, then extraction batches; the same argv each
launch, so the host's history matches the runs."""

import os
import sys
import time

go = sys.argv[1]
time.sleep(float(os.environ.get("LOAD_S") or 0))
while not os.path.exists(go):
    time.sleep(0.05)
for n in range(1, 9):
    print("Loading safetensors checkpoint shards: %3d%% Completed | %d/8 [00:%02d<00:%02d, 4.0it/s]"
          % (n * 100 // 8, n, n // 4, (8 - n) // 4), flush=True)
    time.sleep(0.25)
print("INFO Model loading took 3.1 GiB and 2.0 seconds", flush=True)
for b in range(1, 6):
    print("[extract] batch %d/5 (4 samples)" % b, flush=True)
    time.sleep(0.2)
print("[extract] done: 20 samples", flush=True)
