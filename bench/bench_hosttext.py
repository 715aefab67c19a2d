"""What the host-text sanitizer costs the log's line assembly, on 100k lines.

    python bench/bench_hosttext.py [--lines 100000] [--rounds 15]

Times `tui.state.logbytes.clean_line` (decode, `tui.protocol.hosttext.clean`, collapse ``\\r``)
against the 7-bit stripper it replaced (decode, one ESC regex, collapse ``\\r``), on the
same generated lines: 70 % plain vLLM lines, 15 % tqdm redraws with ``\\r`` and ``ESC [A``,
10 % coloured lines with a TAB, 5 % hostile ones (``ESC c``, ``ESC #8``, C1 CSI and OSC,
OSC 52, a bidi override). The two are timed in turns, best of ``--rounds`` each in CPU
time, so other load on the machine changes the ratio less.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tui.state import logbytes as L  # noqa: E402

_OLD = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def old_clean(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    return L.collapse_cr(_OLD.sub("", text) if "\x1b" in text else text)


def make(n: int) -> list[bytes]:
    rnd = random.Random(1)
    out = []
    for i in range(n):
        r = rnd.random()
        if r < 0.70:
            out.append(b"INFO 11-30 02:%02d:%02d [loader.py:%d] (Worker_TP%d pid=%d) loading layer %d took 0.%03d s"
                       % (i % 60, i % 60, i, i % 8, 1000 + i % 8, i, i % 1000))
        elif r < 0.85:
            out.append(b"(Worker_TP0 pid=1234) \rLoading safetensors checkpoint shards:  %d%% Completed | %d/64 "
                       b"[07:12<12:01, 18.0s/it]\r\x1b[A" % (i % 100, i % 64))
        elif r < 0.95:
            out.append(b"\x1b[32mINFO\x1b[0m 11-30 02:00:00 [core.py:1] step %d\tloss 0.5 \xe2\x9c\x93" % i)
        else:
            out.append(b"ERROR hostile \x1bc \x1b#8 \xc2\x9b2J \xc2\x9d52;c;aGk=\x07 \x1b]52;c;aGk=\x1b\\ "
                       b"\xe2\x80\xae done %d" % i)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    raws = make(args.lines)
    best = {"before": 9e9, "after": 9e9}
    for _ in range(args.rounds):
        for name, f in (("before", old_clean), ("after", L.clean_line)):
            t = time.process_time()
            for raw in raws:
                f(raw)
            best[name] = min(best[name], time.process_time() - t)
    for name, label in (("before", "7-bit stripper"), ("after", "hosttext.clean")):
        s = best[name]
        print(f"{name:<6} ({label}): {args.lines} lines in {s * 1000:.0f} ms CPU "
              f"({s / args.lines * 1e6:.2f} us/line; at 2,000 lines/s {s / args.lines * 2000 * 100:.2f} % of a core)")
    print(f"ratio after/before: {best['after'] / best['before']:.2f}")


if __name__ == "__main__":
    main()
