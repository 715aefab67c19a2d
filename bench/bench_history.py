"""What the load from history costs a launch: the shim's `history.expected_load` over a
runs dir of N earlier runs (run dirs as the shim leaves them: a manifest and a timeline
of an 8-card run whose 20-minute load was sampled every 10 s, written by the host's own
Recorder on a fake clock). Every other run has the same argv; one in five of those
failed its load, so the search reads past them. Prints the time per launch (median of
5, warm page cache, as on a host that keeps its runs dir) and how many run dirs and
timeline bytes it read.

    python bench/bench_history.py [N]     (default 500; the search looks at 200 at most)
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from remote.run import history  # noqa: E402
from remote.run import timeline as hosttl  # noqa: E402

ARGV = ["python", "extract.py", "--model", "/models/kimi-k2"]


def make_run(runs: Path, i: int) -> None:
    run_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime(1_700_000_000 + i * 3600)) + "-%04x" % i
    d = runs / run_id
    d.mkdir(mode=0o700)
    argv = ARGV if i % 2 == 0 else [*ARGV[:-1], "/models/other"]
    (d / "manifest.json").write_text(json.dumps({"argv": argv, "host": "box"}))
    t0 = 1_700_000_000.0 + i * 3600
    rec = hosttl.Recorder(str(d), t0, run_id, launched_at=t0 - 1)
    failed = i % 10 == 0
    for k in range(0, 1300, 5):  # a 20-minute load at the shim's tick
        now = t0 + k
        phase = "loading" if k < 1200 else ("failed" if failed else "loaded")
        gpus = [{"index": g, "mem_used": (k // 15 + g) * 2 ** 30, "util": (k + g) % 100, "power": 300 + k % 50,
                 "processes": []} for g in range(8)]
        rec.look(now, phase, "shard %d" % (k // 20), ["shard", k // 20, 64], None,
                 gpus if rec.sample_due(now) else None, [], offset=k * 100)
    rec.close()


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        runs.mkdir(mode=0o700)
        for i in range(n):
            make_run(runs, i)
        new_id = "29991231-000000-beef"
        times = []
        for _ in range(5):
            t = time.perf_counter()
            got = history.expected_load(str(runs), new_id, ARGV, "box")
            times.append(time.perf_counter() - t)
        worst = []
        for _ in range(5):  # a command never run here: every run dir the search may look at
            t = time.perf_counter()
            history.expected_load(str(runs), new_id, ["python", "never-run.py"], "box")
            worst.append(time.perf_counter() - t)
        sizes = [os.path.getsize(runs / r / hosttl.TIMELINE_FILE) for r in got["expected_load_runs"]]
        print(f"{n} earlier runs: expected_load_s {got['expected_load_s']} from {len(got['expected_load_runs'])} "
              f"run(s); {statistics.median(times) * 1000:.1f} ms per launch (median of 5); "
              f"timelines of {min(sizes)}-{max(sizes)} bytes; a command never run here: "
              f"{statistics.median(worst) * 1000:.1f} ms ({min(n, history.SCAN_MAX)} manifests read)")


if __name__ == "__main__":
    main()
