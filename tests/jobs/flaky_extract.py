"""A real extraction (remote/extract.py) that dies of a transient cause twice: for the
restart tests. On attempts 1 and 2 (counted in OUT.attempts) it SIGKILLs the extractor
once it has written one more data file than were there at the start, prints an NCCL
watchdog timeout as a dying rank would, and exits 1; attempt 3 runs to the end.

    python flaky_extract.py EXTRACT_PY OUT ARGS...   (ARGS: extract.py's, without --out)
"""

import os
import signal
import subprocess
import sys
import time

extract, out, args = sys.argv[1], sys.argv[2], sys.argv[3:]
count = out.rstrip("/") + ".attempts"
attempt = int(open(count).read()) + 1 if os.path.exists(count) else 1
with open(count, "w") as f:
    f.write(str(attempt))


def files() -> int:
    try:
        return sum(1 for n in os.listdir(out) if n.startswith("data_") and n.endswith(".pt"))
    except OSError:
        return 0


before = files()
child = subprocess.Popen([sys.executable, extract, *args, "--out", out])
while child.poll() is None:
    if attempt <= 2 and files() > before:
        child.send_signal(signal.SIGKILL)
        child.wait()
        sys.stdout.write("[rank0]:[E1201 03:00:00.000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught "
                         "collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600000 "
                         "milliseconds before timing out.\n")
        sys.stdout.flush()
        sys.exit(1)
    time.sleep(0.005)
sys.exit(child.returncode)
