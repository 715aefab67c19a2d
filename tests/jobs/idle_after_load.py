"""A run that loads, trains a few steps, then waits forever on something that never
comes (a dead peer, a lost barrier): its GPU memory stays held (registered with
tests/jobs/standin_smi.py's card), its CPU and its log go quiet."""

import os
import threading
import time

folder = os.environ.get("EAGLE3_STANDIN_GPU_DIR")
if folder:
    with open(os.path.join(folder, str(os.getpid())), "w") as f:
        f.write("30720")
print("Model loading took 41.2 GiB and 12.5 seconds", flush=True)
for step in range(1, 4):
    print("step=%d loss=%.3f lr=1e-4" % (step, 2.0 / step), flush=True)
    time.sleep(0.2)
print("waiting for the all-reduce from rank 1 ...", flush=True)
threading.Event().wait()  # asleep: no CPU, no log, GPUs held at 0 %
