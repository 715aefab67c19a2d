"""Adopted (external) runs: process trees on the host that match ``[run] match`` and
belong to no managed run, as run records with ids ``ext-<pid>-<start_ticks>``, and
the log file a process writes to. Standard library only; Python 3.9+."""

from __future__ import annotations

import os
import re
import socket
import stat
import time

from remote.base import procfs
from remote.run import rundir

EXT_ID_RE = re.compile(r"ext-([1-9][0-9]*)-([0-9]+)")


def ext_id(pid: int, start_ticks: int) -> str:
    """The run id of an external run: its pid and start ticks, so a reused PID never
    passes for it."""
    return "ext-%d-%d" % (pid, start_ticks)


def start_ticks(p: dict) -> int | None:
    """Start ticks of a snapshot process: its own field when present, else read
    from /proc and checked against the snapshot's start_time (PID reuse)."""
    if isinstance(p.get("start_ticks"), int):
        return p["start_ticks"]
    st = procfs.read_stat(p["pid"])
    if st is None or st["state"] in ("Z", "X"):
        return None
    seen = p.get("start_time")
    if isinstance(seen, (int, float)):
        # btime in /proc/stat may wobble by a second between reads.
        if abs(procfs.start_time(st, procfs.boot_time()) - seen) > 1.5:
            return None
    return st["start_ticks"]


NO_LOG_NOTE = "no log file: stdout is a pipe/terminal"


def stdout_log(pid: int) -> tuple[str | None, str | None]:
    """The regular file process `pid` writes its stdout (fd 1), else stderr (fd 2), to:
    (path, None), or (None, why there is none). An adopted run's log is this file,
    never the config's `[run] log`, which may be another run's."""
    denied = False
    for fd in (1, 2):
        link = "/proc/%d/fd/%d" % (pid, fd)
        try:
            target = os.readlink(link)
            st = os.stat(link)
        except PermissionError:
            denied = True
            continue
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and target.startswith("/") and not target.endswith(" (deleted)"):
            return target, None
    if denied:
        return None, "no log file: cannot read /proc/%d/fd (another user's process)" % pid
    return None, NO_LOG_NOTE


def external_runs(match: str | None, procs: list[dict]) -> list[dict]:
    """Records for process trees whose command line contains `match` and that
    belong to no managed run; only the top-most matching process of a tree counts,
    and a process whose group leader matches is part of the leader's record
    (double-forked workers leave the tree but keep the group)."""
    if not match:
        return []
    by_pid = {p["pid"]: p for p in procs if isinstance(p, dict) and isinstance(p.get("pid"), int)}

    def matches(p: dict) -> bool:
        cmd = p.get("cmdline") or []
        return p.get("run_id") is None and match in " ".join(cmd)

    def parent(pid: int) -> int | None:
        p = by_pid.get(pid)
        if p is not None and isinstance(p.get("ppid"), int):
            return p["ppid"]
        st = procfs.read_stat(pid)  # an unlisted (non-matching) ancestor
        return st["ppid"] if st else None

    out = []
    host = socket.gethostname()
    for pid, p in by_pid.items():
        if not matches(p):
            continue
        leader = by_pid.get(p.get("pgid"))  # type: ignore[arg-type]
        top, anc, hops = True, parent(pid), 0
        if leader is not None and leader is not p and (matches(leader) or leader.get("run_id")):
            top, anc = False, None
        while anc and anc > 1 and hops < 64:
            a = by_pid.get(anc)
            if a is not None and (matches(a) or a.get("run_id") is not None):
                top = False  # part of an ancestor's record, or of a managed run
                break
            anc, hops = parent(anc), hops + 1
        if not top:
            continue
        ticks = start_ticks(p)
        if ticks is None:
            continue  # gone since the snapshot, or its pid names another process now
        try:
            cwd: str | None = os.readlink("/proc/%d/cwd" % pid)
        except OSError:
            cwd = None
        start = p.get("start_time")
        log, log_note = stdout_log(pid)
        out.append(
            {
                "run_id": ext_id(pid, ticks),
                "name": rundir.name_from_argv(p.get("cmdline") or []),
                "argv": p.get("cmdline") or [],
                "cwd": cwd,
                "env": {},
                "host": host,
                "user": p.get("user"),
                "pid": pid,
                "pgid": p.get("pgid"),
                "sid": p.get("sid"),
                "start_time": start,
                "launched_at": None,
                "patch_state": None,
                "log": log,
                "log_note": log_note,
                "state": "running",
                "exit_code": None,
                "signal": None,
                "ended_at": None,
                "duration": round(time.time() - start, 3)
                if isinstance(start, (int, float))
                else None,
                "external": True,
                "shim_pid": None,
            }
        )
    out.sort(key=lambda r: r["start_time"] or 0, reverse=True)
    return out
