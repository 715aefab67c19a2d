#!/usr/bin/env python3
"""A stand-in ``nvidia-smi`` for the host's idle and kill-proof checks on a machine
without a GPU (tests/test_host_acts.py): one card, "GPU 0", held by every live process
that registered its pid in ``$EAGLE3_STANDIN_GPU_DIR`` (a file named for the pid, its
contents the MiB it holds), at 0 % utilisation. It answers the two queries remote/base/gpus.py
asks, in nvidia-smi's csv,noheader,nounits shape; a process that is gone (or a zombie)
holds nothing, as on a real card once the driver has reclaimed its memory."""

import os
import sys

UUID = "GPU-00000000-stand-in"


def holders() -> list:
    out = []
    folder = os.environ.get("EAGLE3_STANDIN_GPU_DIR", "")
    for name in sorted(os.listdir(folder)) if folder and os.path.isdir(folder) else []:
        try:
            with open("/proc/%s/stat" % name) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(os.path.join(folder, name)) as f:
                mib = int(f.read().strip() or 0)
        except (OSError, ValueError, IndexError):
            continue
        if state not in ("Z", "X"):
            out.append((int(name), mib))
    return out


def main(args: list) -> int:
    query = args[0] if args else ""
    held = holders()
    if query.startswith("--query-gpu="):
        used = sum(m for _, m in held)
        print("0, NVIDIA Stand-in, %s, %d, 81559, 0, 31, 70.00, 700.00" % (UUID, used))
        return 0
    if query.startswith("--query-compute-apps="):
        for pid, mib in held:
            print("%s, %d, %d" % (UUID, pid, mib))
        return 0
    sys.stderr.write("stand-in nvidia-smi: unexpected %r\n" % query)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
