"""Read process facts from Linux /proc. Standard library only; runs on the host's Python 3.9+.

Shipped to the GPU host with the agent (the package lands in one cache directory
keyed by the files' combined hash), so keep it dependency-free and small.

Every reader returns None when the process is gone or unreadable: processes
vanish between listdir() and open(), and that is normal, not an error.
"""

from __future__ import annotations

import os
import pwd
from typing import Dict, List, Optional

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_USERS: Dict[int, str] = {}


_BTIME: List[float] = []
_BOOT_ID: List[Optional[str]] = []


def boot_id() -> Optional[str]:
    """This boot's random id (/proc/sys/kernel/random/boot_id), or None where the
    kernel has none. Unlike btime it never moves when the wall clock is stepped."""
    if not _BOOT_ID:
        try:
            with open("/proc/sys/kernel/random/boot_id", "rb") as f:
                _BOOT_ID.append(f.read().decode("ascii", "replace").strip() or None)
        except OSError:
            _BOOT_ID.append(None)
    return _BOOT_ID[0]


def boot_time() -> float:
    """Seconds since the epoch at which the host booted (from /proc/stat btime; read
    once per process). The kernel derives btime from the wall clock, so it moves when
    the clock is stepped (NTP on a fresh machine): good for showing start times, not
    for telling boots apart — that is `boot_id`."""
    if not _BTIME:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    _BTIME.append(float(line.split()[1]))
                    break
            else:
                raise OSError("no btime in /proc/stat")
    return _BTIME[0]


def list_pids() -> List[int]:
    """All numeric entries of /proc: one listdir, no per-process reads."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def read_stat(pid: int) -> Optional[dict]:
    """Parse /proc/PID/stat. Fields per proc(5); `comm` may hold spaces and ')'."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    lpar, rpar = raw.find(b"("), raw.rfind(b")")
    if lpar < 0 or rpar < 0:
        return None
    rest = raw[rpar + 2 :].split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    return {
        "pid": pid,
        "comm": raw[lpar + 1 : rpar].decode("utf-8", "replace"),
        "state": rest[0].decode("ascii", "replace"),
        "ppid": int(rest[1]),
        "pgid": int(rest[2]),
        "sid": int(rest[3]),
        "utime": int(rest[11]),
        "stime": int(rest[12]),
        "start_ticks": int(rest[19]),
        "rss": int(rest[21]) * PAGE_SIZE,
    }


def start_time(stat: dict, btime: float) -> float:
    """Absolute start time (epoch seconds) of a process from its stat dict."""
    return btime + stat["start_ticks"] / CLK_TCK


CMDLINE_MAX = 32 * 1024  # bytes of a command line kept (the kernel allows 2 MB of argv)
CMDLINE_CUT = "…(command line cut at 32 KiB)"


def read_cmdline(pid: int) -> Optional[List[str]]:
    """argv of a process; [] for kernel threads and zombies, None when gone. At most its
    first CMDLINE_MAX bytes, then CMDLINE_CUT: another user's process with a 2 MB argv
    that matches, or holds a GPU, would otherwise ride every snapshot, twice."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            raw = f.read(CMDLINE_MAX + 1)
    except OSError:
        return None
    args = [a.decode("utf-8", "replace") for a in raw[:CMDLINE_MAX].split(b"\0") if a]
    return args + [CMDLINE_CUT] if len(raw) > CMDLINE_MAX else args


def read_environ_var(pid: int, name: str) -> Optional[str]:
    """One variable of a process's initial environment, None if absent or unreadable."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    key = name.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(key):
            return item[len(key) :].decode("utf-8", "replace")
    return None


def read_uid(pid: int) -> Optional[int]:
    try:
        return os.stat("/proc/%d" % pid).st_uid
    except OSError:
        return None


def read_real_uid(pid: int) -> Optional[int]:
    """The process's real uid (/proc/PID/status ``Uid:``, first field), None when gone.
    Not the owner of /proc/PID: that is the effective uid, root for a setuid-root
    program that any user may start (and for any process that is not dumpable)."""
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def run_marker(pid: int, name: str) -> Optional[str]:
    """A run's environment marker (`name`) in a process of this user only, by its real
    uid: anyone may set any run's id in the environ of their own processes (run ids show
    in ps), and a setuid program they start is owned by root in /proc but is still theirs."""
    value = read_environ_var(pid, name)
    if value is None or read_real_uid(pid) != os.getuid():
        return None
    return value


def user_name(uid: Optional[int]) -> Optional[str]:
    if uid is None:
        return None
    if uid not in _USERS:
        try:
            _USERS[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            _USERS[uid] = str(uid)
    return _USERS[uid]
