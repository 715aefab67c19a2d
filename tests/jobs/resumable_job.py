"""A resumable job for the restart tests: a real process that writes one file per
sample into OUT (skipping the samples already there, as remote/extract.py does), logs
the extractor's batch lines, and fails the way its mode says.

    python resumable_job.py OUT N MODE
    transient2  attempts 1 and 2 die after 3 new samples with an NCCL watchdog timeout
    transient1  attempt 1 dies that way, attempt 2 finishes
    module      dies at once: ModuleNotFoundError (deterministic)
    always      every attempt dies at once with an NCCL watchdog timeout
    sigkill     every attempt logs an NCCL watchdog timeout, then is killed by SIGKILL (the
                watchdog's teardown by a signal, not an exit code)
    hang1       attempt 1 writes 2 samples, then sleeps for ever (hung after the load)
    unknown     every attempt writes 1 new sample and dies with an unclassified error
    stuck       attempt 1 writes 1 sample; every attempt dies unclassified at its next one
    stray       attempt 1 leaves a double-forked sleeper behind (its pid in OUT/stray) and
                dies of an NCCL timeout; attempt 2 notes in OUT/stray_seen whether it lives
    nokernel    every attempt dies at once: CUDA error: no kernel image (vLLM issue 11485's lines)
    then_oom    attempt 1 dies after 3 new samples with an NCCL watchdog timeout; attempt 2
                logs an INFO line saying a step was retried after that timeout, then dies
                of CUDA out of memory (fail, then fail differently)

OUT/attempts counts the attempts; OUT/writes.log gets one line per sample written.
"""

import os
import sys
import time

out, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.makedirs(out, exist_ok=True)
count = os.path.join(out, "attempts")
attempt = int(open(count).read()) + 1 if os.path.exists(count) else 1
with open(count, "w") as f:
    f.write(str(attempt))


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def nccl_timeout() -> None:
    say("[rank0]:[E1201 03:00:00.000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.")
    sys.exit(1)


say("attempt %d of %s" % (attempt, mode))
if mode == "nokernel":  # https://github.com/vllm-project/vllm/issues/11485
    say("[rank0]:     output = torch.empty_like(query)")
    say("[rank0]: RuntimeError: CUDA error: no kernel image is available for execution on the device")
    say("[rank0]: Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
    sys.exit(1)
if mode == "module":
    import speculators_not_installed  # noqa: F401
if mode == "always":
    nccl_timeout()
if mode == "sigkill":
    import signal

    say("[rank0]:[E1201 03:00:00.000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.")
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "stray" and attempt == 1:
    if os.fork() == 0:
        if os.fork() == 0:
            with open(os.path.join(out, "stray"), "w") as f:
                f.write(str(os.getpid()))
            time.sleep(3600)
        os._exit(0)
    os.wait()
    while not os.path.exists(os.path.join(out, "stray")):
        time.sleep(0.01)
    nccl_timeout()
if mode == "stray":
    stray = int(open(os.path.join(out, "stray")).read())
    try:
        state = open("/proc/%d/stat" % stray).read().rsplit(")", 1)[1].split()[0]
    except OSError:
        state = "gone"
    with open(os.path.join(out, "stray_seen"), "w") as f:
        f.write("alive" if state not in ("gone", "Z", "X") else "gone")
say("Loading weights took 0.10 seconds")
new = 0
for i in range(1, n + 1):
    path = os.path.join(out, "sample_%d" % i)
    if os.path.exists(path):
        say("[extract] batch %d/%d skipped (already done)" % (i, n))
        continue
    if mode in ("transient1", "transient2") and attempt <= int(mode[-1]) and new == 3:
        nccl_timeout()
    if mode == "then_oom" and new == 3:
        if attempt == 1:
            nccl_timeout()
        say("INFO:torch.distributed.elastic.agent.server.api:[default] batch %d retried after: [Rank 0] "
            "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for "
            "600000 milliseconds before timing out." % i)
        say("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total "
            "capacity of 79.19 GiB of which 0 bytes is free.")  # the shape of carolchenyx/MGFN. issue 35's line
        sys.exit(1)
    if (mode == "unknown" and new == 1) or (mode == "stuck" and (new == 1 or attempt > 1)):
        raise RuntimeError("something nobody classified")
    if mode == "hang1" and attempt == 1 and new == 2:
        time.sleep(3600)
    with open(path + ".tmp", "w") as f:
        f.write("sample %d\n" % i)
    os.rename(path + ".tmp", path)
    with open(os.path.join(out, "writes.log"), "a") as f:
        f.write("%d\n" % i)
    new += 1
    say("[extract] batch %d/%d | seqs %d/%d | tokens %d/%d | 100.0 tok/s | elapsed 0:00:01 | eta 0:00:01"
        % (i, n, i, n, 10 * i, 10 * n))
    time.sleep(0.05)
say("[extract] done: %d sequences, %d tokens in 0:00:01 (100.0 tok/s) -> %s" % (n, 10 * n, out))
