"""The restart supervisor's record of a run's attempts (remote/run/restart.py writes it,
``rundir.record`` and ``slurm.record`` read it): ``attempts.json``, written atomically,
and ``attempts.reserve``, its space for a full disk.

A write of ``attempts.json`` that fails (ENOSPC, EDQUOT, any OSError) leaves the good
file it would have replaced as it was, and costs the run nothing: the supervisor carries
on and tries the file again at its next write (every ``RETRY_S`` while it waits). The
record it could not write goes over the reserve's blocks in place (`into_reserve`: no
new block needed), with ``write_error`` ("no space left on device writing
RUN_DIR/attempts.json") and ``disk_full``. Each record carries ``seq``, one more at
every write; `load` takes the newer of the two files, so the run's attempts so far are
listed, and the reason with them, until a later write finds room. The launch makes the
reserve with the exit record's (``reserve.make``). Stdlib only, Python 3.9+.
"""

from __future__ import annotations

import json
import os

from remote.base import trust

FILE = "attempts.json"
RESERVE = "attempts.reserve"
RESERVE_BYTES = 64 * 1024  # about 40 attempts; the oldest are left out beyond that
RETRY_S = 5.0  # how often the supervisor tries a record it could not write again


def _read(path: str) -> dict | None:
    try:
        rec = json.loads(trust.read_bytes(path, "run record").decode("utf-8"))
    except (OSError, ValueError):  # missing, half-written, or a reserve of blanks
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("attempts"), list) else None


def load(run_dir: str) -> dict | None:
    """The run's newest attempts record: ``attempts.json``, or the reserve when a later
    write went there; None without either (no policy, not started). A file that is not
    ours alone raises `trust.Untrusted`, as ``rundir.read_json`` does."""
    found = [r for r in (_read(os.path.join(run_dir, FILE)), _read(os.path.join(run_dir, RESERVE))) if r]
    return max(found, key=_seq, default=None)


def _seq(rec: dict) -> int:
    seq = rec.get("seq")
    return seq if isinstance(seq, int) else -1  # a record of an older supervisor: none


def into_reserve(fd: int, rec: dict) -> None:
    """Write `rec` over the reserve's blocks in place (blank-padded to its size), leaving
    out the oldest attempts until it fits (``left_out`` counts them; ``restarts`` stays
    the whole run's). OSError when even that fails."""
    rec = dict(rec, attempts=list(rec["attempts"]), left_out=0)
    data = json.dumps(rec, sort_keys=True).encode()
    while len(data) >= RESERVE_BYTES and rec["attempts"]:
        rec["attempts"].pop(0)
        rec["left_out"] += 1
        data = json.dumps(rec, sort_keys=True).encode()
    os.pwrite(fd, data.ljust(RESERVE_BYTES - 1) + b"\n", 0)
    os.fsync(fd)


def add_to(rec: dict, run_dir: str) -> None:
    """The run's attempts (`load`) in its run record: ``restarts``, ``attempts``,
    ``restart_note``, ``max_restarts``, ``restart_at`` while it runs, and, when the
    newest record is the reserve's, its ``write_error`` and ``disk_full``."""
    tried = load(run_dir)
    if tried is None:
        return
    rec.update(restarts=tried.get("restarts") or 0, attempts=tried["attempts"],
               restart_note=tried.get("note"), max_restarts=tried.get("max_restarts"),
               restart_at=tried.get("restart_at") if rec.get("state") == "running" else None)
    if isinstance(tried.get("write_error"), str):  # the reason the listing gives: this file's
        rec.update(write_error=tried["write_error"], disk_full=bool(tried.get("disk_full")))
