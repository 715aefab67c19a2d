"""What the host remembers of earlier runs of the same command: how long a new run's
load should take (launch → the target model loaded), from the timelines
(``timeline.jsonl``, ``timeline.py``) of the host's earlier runs of the same argv.

The shim asks once, as it writes the run's manifest (``expected_load_s`` and
``expected_load_runs`` there), so every snapshot, ``runs`` and ``runs show`` carry it
without another read. The run dirs live on the host, so that is where history is read:
a client connecting in the morning knows nothing the host did not keep.

Which earlier runs count: same argv (the model path is in it), written by a shim on
this host (the manifest's ``host``: a runs dir on a shared filesystem holds other
nodes' runs, whose disks and page caches differ), and a load that ended (a phase after
the load was reached). A load that failed, was killed, or needed a restart is left out:
it says nothing about how long a load takes. The estimate is the median of the last
``HISTORY_RUNS`` such loads: a single odd load (a cold page cache after a reboot, a
disk shared with another job) moves it not at all, while a lasting change (a new
model, a new disk) wins within two runs. With one or two loads known, the median of
those. Stdlib only, Python >= 3.9.
"""

import json
import os
import socket
from typing import Any, Dict, List, Optional

from remote.base import trust
from remote.run import rundir, timeline

HISTORY_RUNS = 3  # loads the median is taken over
SCAN_MAX = 200  # run dirs looked at, newest first: a launch never waits on a huge runs dir
HEAD_MAX = 1 << 20  # bytes of a timeline read for its load: phases come at once, early
LINE_MAX = 64 * 1024  # bytes of a timeline line worth parsing (the client's bound too)
AFTER_LOAD = ("loaded", "extracting", "training", "evaluating", "serving", "finished")


def load_seconds(path: str) -> Optional[float]:
    """Launch → the first phase after the load, from one timeline; None when the load
    never ended, or ended only after a failure or a restart."""
    try:
        fd = trust.open_file(path, os.O_RDONLY, "timeline")
    except (OSError, trust.Untrusted):
        return None
    try:
        data = os.read(fd, HEAD_MAX)
    except OSError:
        return None
    finally:
        os.close(fd)
    header: Optional[Dict[str, Any]] = None
    for raw in data.split(b"\n"):
        if len(raw) > LINE_MAX:
            continue  # no line of the recorder's is this long
        try:
            line = json.loads(raw)
        except (ValueError, RecursionError):
            continue  # a torn line, the end of what was read, or a line nested 100,000 deep
        if not isinstance(line, dict):
            continue
        if header is None:
            if "t0" not in line:
                return None
            header = line
            continue
        kind = line.get("e")
        if kind == "attempts" or (kind == "phase" and line.get("phase") == "failed"):
            return None
        if kind == "phase" and line.get("phase") in AFTER_LOAD:
            t, t0 = line.get("t"), header.get("t0")
            launched = header.get("launched_at") or t0
            nums = [float(v) for v in (t, t0, launched)
                    if isinstance(v, (int, float)) and timeline.sane(v)]
            if len(nums) < 3:
                return None  # a 400-digit t made float() raise and cost every run's history
            # the very sum `runs show` makes (t + (t0 - launched)): both round 13.95 alike
            return round(nums[0] + (nums[1] - nums[2]), 1)
    return None


def expected_load(runs_dir: str, run_id: str, argv: List[str],
                  host: Optional[str] = None) -> Dict[str, Any]:
    """``{"expected_load_s": seconds or None, "expected_load_runs": [run ids]}`` for a run
    of ``argv`` launched now as ``run_id`` (runs named after it are newer: skipped)."""
    host = host or socket.gethostname()
    loads: List[float] = []
    used: List[str] = []
    try:
        names = sorted((n for n in os.listdir(runs_dir) if not n.startswith(".") and n < run_id),
                       reverse=True)[:SCAN_MAX]  # run ids begin with their UTC launch time
    except OSError:
        names = []
    for name in names:
        path = os.path.join(runs_dir, name)
        try:
            manifest = rundir.read_json(os.path.join(path, "manifest.json"))
        except trust.Untrusted:
            continue
        if not isinstance(manifest, dict) or manifest.get("argv") != argv or manifest.get("host") != host:
            continue
        took = load_seconds(os.path.join(path, timeline.TIMELINE_FILE))
        if took is None:
            continue
        loads.append(took)
        used.append(name)
        if len(loads) == HISTORY_RUNS:
            break
    return {"expected_load_s": median(loads), "expected_load_runs": used}


def median(values: List[float]) -> Optional[float]:
    if not values:
        return None
    s = sorted(values)
    mid = len(s) // 2
    return round(s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2, 1)
