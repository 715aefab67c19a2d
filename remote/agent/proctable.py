"""The cheap process table behind snapshots (docs/architecture.md "Cheap sampling").
Standard library only."""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from remote.base import procfs

RESCAN_S = 30.0
YOUNG_S = 3.0  # re-read cmdline of fresh PIDs this long: we may have caught them before exec()
# CPU time moves in whole clock ticks (10 ms at CLK_TCK=100): over a window of a few ms one
# tick more or less reads as 0 % or 800 %. Windows shorter than this keep the last value.
MIN_CPU_WINDOW_S = 0.2

class _Proc:
    """What the sampler remembers about one PID between ticks."""

    __slots__ = ("cmdline", "joined", "run_env", "stat", "uid", "born", "cpu_base", "cpu")

    def __init__(self) -> None:
        self.cmdline: Optional[List[str]] = None
        self.joined = ""
        self.run_env: Optional[str] = None
        self.stat: Optional[dict] = None
        self.uid: Optional[int] = None
        self.born = 0.0  # process start on the monotonic clock (young PIDs get re-read)
        # (start_ticks, utime+stime ticks, monotonic time of that read): the base of the
        # next CPU reading; start_ticks so a reused PID never inherits another's base.
        self.cpu_base: Optional[Tuple[int, int, float]] = None
        self.cpu: Optional[float] = None  # the last CPU reading, reused for too-short windows


class ProcTable:
    """Cheap sampling (docs/architecture.md): gate listdir on /proc/loadavg's last PID."""

    def __init__(self, run_env: str, full_scan: bool = False) -> None:
        self.run_env = run_env
        self.full_scan = full_scan
        self.me = os.getpid()
        self.btime = procfs.boot_time()
        self.seen: Dict[int, _Proc] = {}
        self._last_pid: Optional[str] = None
        self._last_rescan = time.monotonic()
        self.sampled_at: Optional[float] = None  # monotonic end of the last sample()

    def _discover(self, pid: int) -> Optional[_Proc]:
        p = _Proc()
        p.stat = procfs.read_stat(pid)
        if p.stat is None or not self._read_cmd(pid, p):
            return None
        p.born = time.monotonic() - (time.time() - procfs.start_time(p.stat, self.btime))
        self.seen[pid] = p
        return p

    def _read_cmd(self, pid: int, p: _Proc) -> bool:
        """(Re)read cmdline; re-read the run variable too when the cmdline changed."""
        cmd = procfs.read_cmdline(pid)
        if cmd is None:
            return False
        if cmd != p.cmdline:
            first = p.cmdline is None
            p.cmdline, p.joined = cmd, " ".join(cmd)
            # a run's marker counts only in this user's processes (real uid): anyone may set it in theirs
            p.uid = procfs.read_uid(pid)
            p.run_env = procfs.run_marker(pid, self.run_env)
            if not first:  # exec, or a reused PID: session and group may differ now
                p.stat = procfs.read_stat(pid) or p.stat
        return True

    def _refresh_pids(self) -> None:
        try:
            with open("/proc/loadavg") as f:
                last = f.read().split()[-1]
        except (OSError, IndexError):
            last = None
        if last is not None and last == self._last_pid and not self.full_scan:
            return
        self._last_pid = last
        now = set(procfs.list_pids())
        for pid in list(self.seen):
            if pid not in now:
                del self.seen[pid]
        for pid in now:
            if pid not in self.seen:
                self._discover(pid)

    def cpu_ready_in(self) -> float:
        """Seconds until a new sample() would give fresh CPU readings (0 when now)."""
        if self.sampled_at is None:
            return 0.0
        return max(0.0, self.sampled_at + MIN_CPU_WINDOW_S - time.monotonic())

    def sample(self, match: Optional[str], live_runs: Dict[str, Dict[int, str]],
               gpu_pids: Set[int]) -> List[Dict[str, Any]]:
        """Processes of runs, matching `match`, or holding GPU memory, in protocol shape."""
        self._refresh_pids()
        mono = time.monotonic()
        rescan = self.full_scan or mono - self._last_rescan >= RESCAN_S
        if rescan:
            self._last_rescan = mono
        for pid, p in list(self.seen.items()):
            if rescan or mono - p.born < YOUNG_S:
                if self.full_scan:
                    p.cmdline = None  # force the environ re-read too: the naive scheme
                    p.stat = procfs.read_stat(pid)
                if not self._read_cmd(pid, p):
                    del self.seen[pid]
        for pid in gpu_pids:
            if pid not in self.seen:
                self._discover(pid)
        out = []
        now = time.time()
        for pid, p in list(self.seen.items()):
            st = p.stat or {}
            why = []
            run_id = p.run_env or live_runs["sid"].get(st.get("sid", -1)) \
                or live_runs["pgid"].get(st.get("pgid", -1))
            if run_id:
                why.append("run")
            if match and match in p.joined and pid != self.me and st.get("ppid") != self.me:
                why.append("match")
            if pid in gpu_pids:
                why.append("gpu")
            if not why:
                continue
            fresh = procfs.read_stat(pid)
            read_at = time.monotonic()  # this pid's own read time, not the tick's start
            if fresh is None or (p.stat and fresh["start_ticks"] != p.stat["start_ticks"]):
                del self.seen[pid]  # gone, or PID reused: rediscovered on the next listdir
                self._last_pid = None
                continue
            out.append(self._record(pid, p, fresh, why, run_id, read_at, now))
        for pid in gpu_pids - set(self.seen):  # e.g. another PID namespace: NVML knows more
            out.append({"pid": pid, "ppid": None, "pgid": None, "sid": None, "user": None,
                        "state": None, "cpu": None, "rss": None, "start_time": None,
                        "elapsed": None, "cmdline": None, "why": ["gpu"], "run_id": None})
        out.sort(key=lambda r: r["pid"])
        self.sampled_at = time.monotonic()
        return out

    def _record(self, pid: int, p: _Proc, st: dict, why: List[str], run_id: Optional[str],
                read_at: float, now: float) -> Dict[str, Any]:
        p.stat = st
        p.cpu = self._cpu(p, st, read_at)
        if p.uid is None:
            p.uid = procfs.read_uid(pid)
        start = procfs.start_time(st, self.btime)
        return {"pid": pid, "ppid": st["ppid"], "pgid": st["pgid"], "sid": st["sid"],
                "user": procfs.user_name(p.uid), "state": st["state"], "cpu": p.cpu,
                "rss": st["rss"], "start_time": start, "elapsed": round(now - start, 2),
                "cmdline": p.cmdline, "why": why, "run_id": run_id or None}

    @staticmethod
    def _cpu(p: _Proc, st: dict, read_at: float) -> Optional[float]:
        """Percent of one core used by this process itself (utime+stime, not its reaped
        children's) since the previous reading of the same process; None when there is
        none yet."""
        ticks = st["utime"] + st["stime"]
        base = p.cpu_base
        if base is None or base[0] != st["start_ticks"] or ticks < base[1]:
            p.cpu_base = (st["start_ticks"], ticks, read_at)  # new process: nothing to compare
            return None
        window = read_at - base[2]
        if window < MIN_CPU_WINDOW_S:
            return p.cpu  # keep the base, so the next reading spans a long enough window
        p.cpu_base = (st["start_ticks"], ticks, read_at)
        return round((ticks - base[1]) / procfs.CLK_TCK / window * 100, 1)
