"""eagle3-tui host agent: JSON lines on stdin/stdout (protocol in docs/architecture.md).

Run as `python3 -u agent.py [--runs-dir DIR]`. Standard library only (Python 3.9+);
`pynvml` is used when importable. It samples the host (CPU, memory, GPUs, the
processes that matter), follows logs, reads/writes files atomically and hands run
lifecycle to its sibling `runner.py`. It never interprets logs.

Threads: a stdin reader queues requests and pokes a self-pipe; the main loop waits on
that pipe and an inotify fd, answers short requests, follows logs and sends
snapshots; long requests (launch, kill, resolve_module, py_compile) run in worker
threads. Every stdout line goes through `emit()`, which holds one lock.

Env: EAGLE3_TUI_GPU_SOURCE=none|nvml|nvidia-smi forces the GPU source;
EAGLE3_TUI_NO_INOTIFY=1 forces the 0.25 s poll; EAGLE3_TUI_FULL_SCAN=1 reads every
process every tick (only to measure what the cheap scheme saves).
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import ctypes.util
import hashlib
import json
import os
import queue
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procfs  # noqa: E402  (sibling module, shipped alongside)

AGENT_VERSION = "0.1.0"
PROTOCOL = 1
RUN_ENV_FALLBACK = "EAGLE3_TUI_RUN_ID"  # same value as runner.RUN_ENV, used if runner is broken
CHUNK = 256 * 1024
PUMP_BUDGET = 16 * CHUNK  # per subscription per wake, so one huge backlog cannot starve the loop
READ_RANGE_MAX = 4 * 1024 * 1024
FILE_READ_MAX = 16 * 1024 * 1024
RESCAN_S = 30.0
YOUNG_S = 3.0  # re-read cmdline of fresh PIDs this long: we may have caught them before exec()
SUBPROC_TIMEOUT = 30.0

_OUT_LOCK = threading.Lock()


class BadRequest(Exception):
    """A request the agent refuses; its message is the one-line error sent back."""


def emit(msg: Dict[str, Any]) -> None:
    """Write one JSON line to stdout under the lock; exit quietly if the client is gone."""
    data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
    with _OUT_LOCK:
        try:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except (BrokenPipeError, ValueError):
            os._exit(0)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return "%s: %s" % (type(exc).__name__, text[0]) if text else type(exc).__name__


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def arg(args: Dict[str, Any], name: str, kind: Any, default: Any = KeyError) -> Any:
    """Fetch and type-check one request argument; a missing required one is a BadRequest."""
    if name not in args or args[name] is None:
        if default is KeyError:
            raise BadRequest("missing argument %r" % name)
        return default
    value = args[name]
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise BadRequest("argument %r has the wrong type" % name)
    return value


# ---------------------------------------------------------------- host + GPUs


def host_info() -> Dict[str, Any]:
    """hostname, load, cpu_count, mem_total/mem_available (bytes), uptime (s)."""
    info: Dict[str, Any] = {"hostname": socket.gethostname(), "load": None,
                            "cpu_count": os.cpu_count(), "mem_total": None,
                            "mem_available": None, "uptime": None}
    try:
        with open("/proc/loadavg") as f:
            info["load"] = [float(x) for x in f.read().split()[:3]]
        with open("/proc/uptime") as f:
            info["uptime"] = float(f.read().split()[0])
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    info["mem_total" if key == "MemTotal" else "mem_available"] = \
                        int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return info


def _nvml_call(fn: Callable[..., Any], *args: Any) -> Any:
    """One NVML reading, or None if that reading fails (never 0, never a crash)."""
    try:
        return fn(*args)
    except Exception:  # NVMLError and its many subclasses, or AttributeError on old pynvml
        return None


def _smi_value(text: str, scale: float = 1.0, as_int: bool = False) -> Any:
    text = text.strip()
    if not text or text.startswith("[") or text.upper() in ("N/A", "NOT SUPPORTED"):
        return None
    try:
        value = float(text) * scale
    except ValueError:
        return None
    return int(round(value)) if as_int else value


class Gpus:
    """The GPU source: NVML (cached handles), else nvidia-smi, else none with a reason."""

    SMI_GPU = "index,name,uuid,memory.used,memory.total,utilization.gpu,temperature.gpu," \
              "power.draw,power.limit"

    def __init__(self) -> None:
        self.source: Optional[str] = None
        self.error: Optional[str] = None
        self.lock = threading.Lock()  # the kill worker reads GPUs too
        self._nv: Any = None
        self._handles: List[Any] = []
        self._static: List[Dict[str, Any]] = []
        self._smi: Optional[str] = None
        forced = os.environ.get("EAGLE3_TUI_GPU_SOURCE", "").strip().lower()
        if forced == "none":
            self.error = "GPU source disabled (EAGLE3_TUI_GPU_SOURCE=none)"
            return
        if forced not in ("", "nvml", "nvidia-smi"):
            self.error = "unknown EAGLE3_TUI_GPU_SOURCE %r (use none, nvml or nvidia-smi)" % forced
            return
        reasons = []
        if forced in ("", "nvml"):
            reason = self._init_nvml()
            if reason is None:
                self.source = "nvml"
                return
            reasons.append(reason)
        if forced in ("", "nvidia-smi"):
            self._smi = shutil.which("nvidia-smi")
            if self._smi:
                self.source = "nvidia-smi"
                return
            reasons.append("nvidia-smi not found")
        self.error = "; ".join(reasons)

    def _init_nvml(self) -> Optional[str]:
        try:
            import pynvml  # type: ignore
        except Exception:
            return "pynvml not installed"
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:
            return "pynvml: %s" % (str(exc) or type(exc).__name__)
        self._nv, self._handles = pynvml, handles
        for i, h in enumerate(handles):
            name = _nvml_call(pynvml.nvmlDeviceGetName, h)
            uuid = _nvml_call(pynvml.nvmlDeviceGetUUID, h)
            self._static.append({"index": i,
                                 "name": name.decode() if isinstance(name, bytes) else name,
                                 "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid})
        return None

    def read(self) -> Tuple[List[Dict[str, Any]], Optional[str]]:
        """(gpus, error) in protocol shape; gpus is [] when there is no source."""
        with self.lock:
            if self.source == "nvml":
                return [self._read_nvml(i, h) for i, h in enumerate(self._handles)], None
            if self.source == "nvidia-smi":
                try:
                    return self._read_smi(), None
                except Exception as exc:
                    return [], "nvidia-smi failed: %s" % one_line(exc)
            return [], self.error

    def _read_nvml(self, i: int, h: Any) -> Dict[str, Any]:
        nv = self._nv
        gpu = dict(self._static[i])
        mem = _nvml_call(nv.nvmlDeviceGetMemoryInfo, h)
        util = _nvml_call(nv.nvmlDeviceGetUtilizationRates, h)
        power = _nvml_call(nv.nvmlDeviceGetPowerUsage, h)
        limit = _nvml_call(nv.nvmlDeviceGetEnforcedPowerLimit, h)
        gpu.update({
            "mem_used": getattr(mem, "used", None), "mem_total": getattr(mem, "total", None),
            "util": getattr(util, "gpu", None),
            "temp": _nvml_call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
            "power": power / 1000.0 if power is not None else None,
            "power_limit": limit / 1000.0 if limit is not None else None,
        })
        procs: Dict[int, Optional[int]] = {}
        for fn_name in ("nvmlDeviceGetComputeRunningProcesses",
                        "nvmlDeviceGetGraphicsRunningProcesses"):
            for p in _nvml_call(getattr(nv, fn_name), h) or []:
                used = getattr(p, "usedGpuMemory", None)
                prev = procs.get(p.pid)
                procs[p.pid] = used if prev is None else max(prev, used or 0)
        gpu["processes"] = [{"pid": pid, "mem": mem_} for pid, mem_ in sorted(procs.items())]
        return gpu

    def _smi_run(self, query: str) -> List[List[str]]:
        out = subprocess.run([self._smi or "nvidia-smi", query, "--format=csv,noheader,nounits"],
                             capture_output=True, timeout=10, check=False)
        if out.returncode != 0:
            lines = (out.stderr or out.stdout).decode("utf-8", "replace").strip().splitlines()
            raise RuntimeError(lines[-1] if lines else "exit %d" % out.returncode)
        return [[f.strip() for f in line.split(",")]
                for line in out.stdout.decode("utf-8", "replace").splitlines() if line.strip()]

    def _read_smi(self) -> List[Dict[str, Any]]:
        mib = 1024.0 * 1024.0
        gpus, by_uuid = [], {}
        for f in self._smi_run("--query-gpu=" + self.SMI_GPU):
            if len(f) < 9:
                continue
            gpu = {"index": _smi_value(f[0], as_int=True), "name": f[1] or None,
                   "uuid": f[2] or None, "mem_used": _smi_value(f[3], mib, True),
                   "mem_total": _smi_value(f[4], mib, True), "util": _smi_value(f[5], as_int=True),
                   "temp": _smi_value(f[6], as_int=True), "power": _smi_value(f[7]),
                   "power_limit": _smi_value(f[8]), "processes": []}
            gpus.append(gpu)
            by_uuid[gpu["uuid"]] = gpu
        for f in self._smi_run("--query-compute-apps=gpu_uuid,pid,used_memory"):
            if len(f) >= 3 and f[0] in by_uuid and f[1].isdigit():
                by_uuid[f[0]]["processes"].append({"pid": int(f[1]),
                                                   "mem": _smi_value(f[2], mib, True)})
        return gpus


# ---------------------------------------------------------------- processes


class _Proc:
    """What the sampler remembers about one PID between ticks."""

    __slots__ = ("cmdline", "joined", "run_env", "stat", "uid", "born", "cpu_prev")

    def __init__(self) -> None:
        self.cmdline: Optional[List[str]] = None
        self.joined = ""
        self.run_env: Optional[str] = None
        self.stat: Optional[dict] = None
        self.uid: Optional[int] = None
        self.born = 0.0  # process start on the monotonic clock (young PIDs get re-read)
        self.cpu_prev: Optional[Tuple[int, float]] = None  # (utime+stime ticks, monotonic)


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
            p.run_env = procfs.read_environ_var(pid, self.run_env)
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
            if fresh is None or (p.stat and fresh["start_ticks"] != p.stat["start_ticks"]):
                del self.seen[pid]  # gone, or PID reused: rediscovered on the next listdir
                self._last_pid = None
                continue
            out.append(self._record(pid, p, fresh, why, run_id, mono, now))
        for pid in gpu_pids - set(self.seen):  # e.g. another PID namespace: NVML knows more
            out.append({"pid": pid, "ppid": None, "pgid": None, "sid": None, "user": None,
                        "state": None, "cpu": None, "rss": None, "start_time": None,
                        "elapsed": None, "cmdline": None, "why": ["gpu"], "run_id": None})
        out.sort(key=lambda r: r["pid"])
        return out

    def _record(self, pid: int, p: _Proc, st: dict, why: List[str], run_id: Optional[str],
                mono: float, now: float) -> Dict[str, Any]:
        p.stat = st
        ticks = st["utime"] + st["stime"]
        cpu = None
        if p.cpu_prev is not None and mono > p.cpu_prev[1]:
            cpu = round((ticks - p.cpu_prev[0]) / procfs.CLK_TCK / (mono - p.cpu_prev[1]) * 100, 1)
        p.cpu_prev = (ticks, mono)
        if p.uid is None:
            p.uid = procfs.read_uid(pid)
        start = procfs.start_time(st, self.btime)
        return {"pid": pid, "ppid": st["ppid"], "pgid": st["pgid"], "sid": st["sid"],
                "user": procfs.user_name(p.uid), "state": st["state"], "cpu": cpu,
                "rss": st["rss"], "start_time": start, "elapsed": round(now - start, 2),
                "cmdline": p.cmdline, "why": why, "run_id": run_id or None}


# ---------------------------------------------------------------- log following

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_IGNORED = 0x8000
IN_MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE \
    | IN_DELETE


class Inotify:
    """Directory watches through libc via ctypes; `fd` is None when unavailable."""

    def __init__(self) -> None:
        self.fd: Optional[int] = None
        self.watches: Dict[str, int] = {}
        if os.environ.get("EAGLE3_TUI_NO_INOTIFY") == "1":
            return
        try:
            self.libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd >= 0:
            self.fd = fd

    def sync(self, dirs: Set[str]) -> None:
        """Watch exactly `dirs` (missing directories are retried on later calls)."""
        if self.fd is None:
            return
        for d in set(self.watches) - dirs:
            self.libc.inotify_rm_watch(self.fd, self.watches.pop(d))
        for d in dirs - set(self.watches):
            wd = self.libc.inotify_add_watch(self.fd, os.fsencode(d), IN_MASK)
            if wd >= 0:
                self.watches[d] = wd

    def drain(self) -> None:
        """Swallow pending events: any event means 'look at every subscription'. Only
        IN_IGNORED matters: the kernel dropped a watch (directory deleted), so forget it
        and let `sync` add it again once the directory is back."""
        if self.fd is None:
            return
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except OSError:
                return
            if not buf:
                return
            pos = 0
            while pos + 16 <= len(buf):
                wd, mask, _cookie, length = struct.unpack_from("iIII", buf, pos)
                pos += 16 + length
                if mask & IN_IGNORED:
                    for d, w in list(self.watches.items()):
                        if w == wd:
                            del self.watches[d]


class Sub:
    """One log subscription: (path, inode, offset) plus the open fd of that inode."""

    def __init__(self, name: str, path: str) -> None:
        self.name, self.path = name, path
        self.fd: Optional[int] = None
        self.ident: Optional[Tuple[int, int]] = None  # (st_dev, st_ino) of fd
        self.offset = 0
        self.missing = False  # a `missing` reset was sent and no file has appeared since
        self.warned = False

    @property
    def inode(self) -> Optional[int]:
        return self.ident[1] if self.ident else None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        self.fd, self.ident = None, None

    def _reset(self, reason: str) -> None:
        self.offset = 0
        emit({"type": "log_reset", "sub": self.name, "path": self.path, "reason": reason,
              "inode": self.inode, "offset": 0})

    def _open(self) -> os.stat_result:
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        st = os.fstat(fd)
        self.close()
        self.fd, self.ident = fd, (st.st_dev, st.st_ino)
        return st

    def _send(self, limit: Optional[int]) -> bool:
        """Send [offset, size) of the open fd in chunks; True if more is left than `limit`."""
        assert self.fd is not None
        size = os.fstat(self.fd).st_size
        if size < self.offset:
            self._reset("truncated")
        sent = 0
        while self.offset < size and (limit is None or sent < limit):
            data = os.pread(self.fd, min(CHUNK, size - self.offset), self.offset)
            if not data:
                break
            emit({"type": "log", "sub": self.name, "path": self.path, "inode": self.inode,
                  "offset": self.offset, "b64": b64(data)})
            self.offset += len(data)
            sent += len(data)
        return self.offset < size

    def start(self, offset: int, inode: Optional[int]) -> Dict[str, Any]:
        """Open at subscribe time; resume at `offset` only if `inode` still matches."""
        try:
            st = self._open()
        except FileNotFoundError:
            self.missing = True
            return {"inode": None, "size": None}
        if offset < 0:
            offset = self._tail_start(st.st_size + offset)
        self.offset = offset
        return {"inode": st.st_ino, "size": st.st_size, "offset": offset, "_rotated": inode is not None
                and inode != st.st_ino}

    def _tail_start(self, pos: int) -> int:
        """A negative offset asks for the tail: start at the first line break after
        `pos` (so the first line is whole), or at 0 when the file is shorter."""
        if pos <= 0 or self.fd is None:
            return 0
        head = os.pread(self.fd, 65536, pos - 1)
        cut = head.find(b"\n")
        return pos + cut if cut >= 0 else pos

    def pump(self) -> bool:
        """Follow the file once: resets as needed, then new bytes. True if behind."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            self._warn(exc)
            return False
        if st is None:
            if self.fd is not None:
                self._send(None)  # the old inode's unread tail first
                self.close()
            if not self.missing:
                self.missing = True
                self._reset("missing")
            return False
        try:
            if self.fd is None or (st.st_dev, st.st_ino) != self.ident:
                if self.fd is not None:
                    self._send(None)
                reason = "rotated" if self.fd is not None else "appeared"
                self._open()
                self.missing = False
                self._reset(reason)
            return self._send(PUMP_BUDGET)
        except FileNotFoundError:
            return False  # vanished between stat and open: the next wake sees it missing
        except OSError as exc:
            self._warn(exc)
            return False

    def _warn(self, exc: OSError) -> None:
        if not self.warned:
            self.warned = True
            emit({"type": "error", "message": "log %s: %s" % (self.path, one_line(exc))})


# ---------------------------------------------------------------- file ops

RESOLVE_SCRIPT = r"""
import importlib.machinery, importlib.util, json, os, sys
name = sys.argv[1]
parts = name.split(".")
out = {"origin": None, "search_paths": [], "version": None}
spec = importlib.util.find_spec(parts[0])  # top level only: finding does not import
if spec is not None:
    locs = list(spec.submodule_search_locations or [])
    out["search_paths"] = locs
    if len(parts) == 1:
        out["origin"] = spec.origin
    else:
        rel = os.path.join(*parts[1:])
        for loc in locs:
            cands = [os.path.join(loc, rel, "__init__.py")]
            cands += [os.path.join(loc, rel + s) for s in importlib.machinery.all_suffixes()]
            hits = [c for c in cands if os.path.isfile(c)]
            if hits:
                out["origin"] = hits[0]
                break
    try:
        from importlib import metadata
        try:
            out["version"] = metadata.version(parts[0])
        except metadata.PackageNotFoundError:
            dists = getattr(metadata, "packages_distributions", dict)().get(parts[0]) or []
            out["version"] = metadata.version(dists[0]) if dists else None
    except Exception:
        pass
print(json.dumps(out))
"""

COMPILE_SCRIPT = r"""
import json, sys
src = sys.stdin.buffer.read()
try:
    compile(src, sys.argv[1], "exec", dont_inherit=True)
    res = {"ok": True, "error": None}
except SyntaxError as e:
    res = {"ok": False, "error": "%s:%s:%s: %s" % (e.filename, e.lineno, e.offset, e.msg)}
except (ValueError, TypeError) as e:
    res = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
print(json.dumps(res))
"""


def run_python(python: str, script: str, argv: List[str], stdin: bytes = b"") -> Dict[str, Any]:
    """Run one of the fixed scripts with the host's python; its JSON output, or BadRequest."""
    try:
        out = subprocess.run([python, "-c", script] + argv, input=stdin, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, timeout=SUBPROC_TIMEOUT, check=False)
    except FileNotFoundError:
        raise BadRequest("%s not found on host" % python) from None
    except PermissionError:
        raise BadRequest("%s is not executable on host" % python) from None
    except subprocess.TimeoutExpired:
        raise BadRequest("%s timed out after %d s" % (python, SUBPROC_TIMEOUT)) from None
    lines = out.stdout.decode("utf-8", "replace").strip().splitlines()
    if out.returncode != 0 or not lines:
        err = out.stderr.decode("utf-8", "replace").strip().splitlines()
        raise BadRequest("%s failed: %s" % (python, err[-1] if err else "exit %d" % out.returncode))
    return json.loads(lines[-1])


def sha256_file(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except FileNotFoundError:
        return None


def file_read(path: str) -> Dict[str, Any]:
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_size > FILE_READ_MAX:
                raise BadRequest("%s is %d bytes, over the 16 MiB file_read limit"
                                 % (path, st.st_size))
            data = f.read(FILE_READ_MAX + 1)
    except FileNotFoundError:
        return {"exists": False, "sha256": None, "size": None, "mode": None, "b64": None}
    return {"exists": True, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
            "mode": st.st_mode & 0o7777, "b64": b64(data)}


def _atomic_write(path: str, data: bytes, like: Optional[os.stat_result]) -> None:
    """Temp file in the same dir, fsync, os.replace, fsync the dir; mode/owner of `like`."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if like is not None:
                os.fchmod(f.fileno(), like.st_mode & 0o7777)
                try:
                    os.fchown(f.fileno(), like.st_uid, like.st_gid)
                except OSError:
                    pass  # not root: the file becomes ours, the mode is still kept
            else:
                umask = os.umask(0)
                os.umask(umask)
                os.fchmod(f.fileno(), 0o666 & ~umask)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def file_write(path: str, data: bytes, expect: Optional[str], backup: Optional[str]) -> Dict:
    """Write `data` to `path` atomically if the file's hash is still `expect`."""
    try:
        st: Optional[os.stat_result] = os.stat(path)
        with open(path, "rb") as f:
            current: Optional[bytes] = f.read()
    except FileNotFoundError:
        st, current = None, None
    cur_sha = hashlib.sha256(current).hexdigest() if current is not None else None
    if cur_sha != expect:
        raise BadRequest("%s changed: current sha256 %s, expected %s" % (
            path, cur_sha[:12] if cur_sha else "none (missing)",
            expect[:12] if expect else "none (must not exist)"))
    if backup and current is not None and not os.path.exists(backup):
        _atomic_write(backup, current, st)
    _atomic_write(path, data, st)
    return {"sha256": sha256_file(path)}


# ---------------------------------------------------------------- the agent


def load_runner() -> Tuple[Any, Optional[str]]:
    """Import the sibling runner module; (module, None) or (None, reason)."""
    try:
        import runner  # type: ignore
        return runner, None
    except Exception as exc:  # SyntaxError, ImportError, anything: the agent must live on
        return None, "runner unavailable: %s" % one_line(exc)


class Agent:
    """Owns the state; the main loop in `run()` is the only thread that touches it,
    except workers, which only call runner/GPUs and `emit()`."""

    LONG_OPS = ("launch", "kill", "resolve_module", "py_compile")

    def __init__(self, runs_dir: Optional[str]) -> None:
        self.runner, self.runner_error = load_runner()
        self.run_env = getattr(self.runner, "RUN_ENV", RUN_ENV_FALLBACK)
        self.cli_runs_dir = runs_dir
        self.runs_dir = runs_dir
        self.interval = 1.0
        self.match: Optional[str] = None
        self.configured = False
        self.seq = 0
        self.gpus = Gpus()
        self.procs = ProcTable(self.run_env, os.environ.get("EAGLE3_TUI_FULL_SCAN") == "1")
        self.last_procs: Optional[List[Dict[str, Any]]] = None
        self.subs: Dict[str, Sub] = {}
        self.inotify = Inotify()
        self.requests: "queue.Queue[Optional[bytes]]" = queue.Queue()
        self.wake_r, self.wake_w = os.pipe()
        self.lock = threading.Lock()  # guards last_procs for workers
        self.runs_error: Optional[str] = None
        self.next_snap = time.monotonic()

    # -- helpers

    def _runs_dir(self) -> str:
        if self.runs_dir:
            return self.runs_dir
        if self.runner is not None:
            return self.runner.default_runs_dir()
        return os.path.expanduser("~/.cache/eagle3-tui/runs")

    def _need_runner(self) -> Any:
        if self.runner is None:
            raise BadRequest(self.runner_error or "runner unavailable")
        return self.runner

    def _runs(self, procs: Optional[List[Dict[str, Any]]]) -> List[Dict[str, Any]]:
        if self.runner is None:
            return []
        runs = list(self.runner.list_runs(self._runs_dir()))
        if self.match and procs is not None:
            runs += self.runner.external_runs(self.match, procs)
        return runs

    def hello(self) -> Dict[str, Any]:
        with open(os.path.abspath(__file__), "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        caps = ["snapshot", "logs", "files"] + (["runs", "kill"] if self.runner else [])
        return {"type": "hello", "protocol": PROTOCOL, "agent_version": AGENT_VERSION,
                "agent_sha": sha, "hostname": socket.gethostname(),
                "python": "%d.%d.%d" % sys.version_info[:3], "pid": os.getpid(),
                "time": time.time(), "gpu_source": self.gpus.source,
                "gpu_error": self.gpus.error, "capabilities": caps}

    def snapshot(self) -> Dict[str, Any]:
        """One snapshot object (without `type`)."""
        gpus, gpu_error = self.gpus.read()
        gpu_pids = {p["pid"] for g in gpus for p in g.get("processes") or []}
        live: Dict[str, Dict[int, str]] = {"sid": {}, "pgid": {}}
        runs_error = None
        try:
            runs = self._runs(None)
        except Exception as exc:
            runs, runs_error = [], one_line(exc)
        for r in runs:
            if r.get("state") == "running" and not r.get("external"):
                for key in ("sid", "pgid"):
                    if isinstance(r.get(key), int):
                        live[key][r[key]] = r["run_id"]
        procs = self.procs.sample(self.match, live, gpu_pids)
        if self.match and self.runner is not None and runs_error is None:
            try:
                runs += self.runner.external_runs(self.match, procs)
            except Exception as exc:
                runs_error = one_line(exc)
        if runs_error and runs_error != self.runs_error:  # once per distinct fault, not per tick
            emit({"type": "error", "message": "runs: %s" % runs_error})
        self.runs_error = runs_error
        with self.lock:
            self.last_procs = procs
        self.seq += 1
        return {"seq": self.seq, "time": time.time(), "host": host_info(),
                "gpu_source": self.gpus.source, "gpu_error": gpu_error, "gpus": gpus,
                "processes": procs, "runs": runs}

    def send_snapshot(self) -> None:
        msg: Dict[str, Any] = {"type": "snapshot"}
        msg.update(self.snapshot())
        emit(msg)

    # -- requests

    def handle_line(self, line: bytes) -> None:
        """Parse and dispatch one request line; never raises."""
        try:
            req = json.loads(line)
        except ValueError:
            text = line[:60].decode("utf-8", "replace").strip()
            emit({"type": "error", "message": "request is not JSON: %r" % text})
            return
        rid = req.get("id") if isinstance(req, dict) else None
        if not isinstance(rid, int) or isinstance(rid, bool):
            text = line[:60].decode("utf-8", "replace").strip()
            emit({"type": "error", "message": "request lacks an integer id: %s" % text})
            return
        op, args = req.get("op"), req.get("args", {})
        if args is None:
            args = {}
        if not isinstance(op, str) or not isinstance(args, dict):
            self.reply(rid, error="request needs a string op and an args object")
            return
        fn = getattr(self, "op_" + op, None)
        if fn is None:
            self.reply(rid, error="unknown op %r" % op)
            return
        if op in self.LONG_OPS:
            threading.Thread(target=self._call, args=(rid, fn, args), daemon=True).start()
        else:
            self._call(rid, fn, args)

    def _call(self, rid: int, fn: Callable[..., Any], args: Dict[str, Any]) -> None:
        try:
            result = fn(args, rid)
        except BadRequest as exc:
            self.reply(rid, error=str(exc))
            return
        except Exception as exc:  # the runner's own one-line errors pass through as they are
            runner_error = type(exc).__name__ == "RunnerError"
            self.reply(rid, error=str(exc) if runner_error else one_line(exc))
            return
        after = None
        if isinstance(result, tuple):  # (result, callback to run after the reply)
            result, after = result
        self.reply(rid, result=result)
        if after:
            try:
                after()
            except Exception as exc:
                emit({"type": "error", "message": "after %s: %s" % (fn.__name__, one_line(exc))})

    @staticmethod
    def reply(rid: int, result: Any = None, error: Optional[str] = None) -> None:
        if error is not None:
            emit({"type": "result", "id": rid, "ok": False, "error": error})
        else:
            emit({"type": "result", "id": rid, "ok": True, "result": result})

    def op_configure(self, args: Dict[str, Any], rid: int) -> Any:
        interval = float(arg(args, "interval", (int, float), self.interval))
        if not 0.05 <= interval <= 3600:
            raise BadRequest("interval must be between 0.05 and 3600 s")
        self.interval = interval
        if "match" in args:
            self.match = arg(args, "match", str, None) or None
        if "runs_dir" in args:
            self.runs_dir = arg(args, "runs_dir", str, None) or self.cli_runs_dir
        self.configured = True
        self.next_snap = time.monotonic() + self.interval
        return {}, self.send_snapshot

    def op_snapshot(self, args: Dict[str, Any], rid: int) -> Any:
        return self.snapshot()

    def op_subscribe(self, args: Dict[str, Any], rid: int) -> Any:
        name, path = arg(args, "sub", str), arg(args, "path", str)
        offset = arg(args, "offset", int, 0)
        inode = arg(args, "inode", int, None)
        old = self.subs.pop(name, None)
        if old:
            old.close()
        sub = Sub(name, os.path.abspath(path))
        info = sub.start(offset, inode)
        self.subs[name] = sub
        self._sync_watches()
        rotated = info.pop("_rotated", False)

        def after() -> None:
            if sub.fd is None:
                sub._reset("missing")
            elif rotated:
                sub._reset("rotated")
            sub.pump()
        return info, after

    def op_unsubscribe(self, args: Dict[str, Any], rid: int) -> Any:
        sub = self.subs.pop(arg(args, "sub", str), None)
        if sub:
            sub.close()
        self._sync_watches()
        return {}

    def _sync_watches(self) -> None:
        self.inotify.sync({os.path.dirname(s.path) for s in self.subs.values()})

    def op_read_range(self, args: Dict[str, Any], rid: int) -> Any:
        path, offset = arg(args, "path", str), arg(args, "offset", int)
        length = arg(args, "length", int)
        if offset < 0 or not 0 <= length <= READ_RANGE_MAX:
            raise BadRequest("read_range needs offset >= 0 and 0 <= length <= 4 MiB")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise BadRequest("%s does not exist" % path) from None
        try:
            st = os.fstat(fd)
            data = os.pread(fd, length, offset)
        finally:
            os.close(fd)
        return {"offset": offset, "b64": b64(data), "size": st.st_size, "inode": st.st_ino}

    def op_file_read(self, args: Dict[str, Any], rid: int) -> Any:
        return file_read(arg(args, "path", str))

    def op_file_write(self, args: Dict[str, Any], rid: int) -> Any:
        try:
            data = base64.b64decode(arg(args, "b64", str), validate=True)
        except ValueError:
            raise BadRequest("file_write: b64 is not valid base64") from None
        return file_write(arg(args, "path", str), data, arg(args, "expect_sha256", str, None),
                          arg(args, "backup", str, None))

    def op_resolve_module(self, args: Dict[str, Any], rid: int) -> Any:
        module = arg(args, "module", str)
        if not module or any(not p.isidentifier() for p in module.split(".")):
            raise BadRequest("not a dotted module name: %r" % module)
        return run_python(arg(args, "python", str, "python3"), RESOLVE_SCRIPT, [module])

    def op_py_compile(self, args: Dict[str, Any], rid: int) -> Any:
        try:
            src = base64.b64decode(arg(args, "b64", str), validate=True)
        except ValueError:
            raise BadRequest("py_compile: b64 is not valid base64") from None
        return run_python(arg(args, "python", str, "python3"), COMPILE_SCRIPT,
                          [arg(args, "filename", str, "<patch>")], src)

    def op_launch(self, args: Dict[str, Any], rid: int) -> Any:
        runner = self._need_runner()
        argv = arg(args, "argv", list)
        env = arg(args, "env", dict, {})
        if not argv or not all(isinstance(a, str) for a in argv):
            raise BadRequest("argv must be a non-empty list of strings")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise BadRequest("env must map strings to strings")
        return runner.launch(self._runs_dir(), arg(args, "name", str, None), argv,
                             arg(args, "cwd", str, os.path.expanduser("~")), env,
                             patch_state=args.get("patch_state"), log=arg(args, "log", str, None),
                             python=sys.executable)

    def op_runs(self, args: Dict[str, Any], rid: int) -> Any:
        self._need_runner()
        with self.lock:
            procs = self.last_procs
        return {"runs": self._runs(procs)}

    def op_kill(self, args: Dict[str, Any], rid: int) -> Any:
        runner = self._need_runner()
        graces = arg(args, "graces", list, [10, 10])
        if len(graces) != 2 or not all(isinstance(g, (int, float)) and g >= 0 for g in graces):
            raise BadRequest("graces must be [sigint_s, sigterm_s]")
        with self.lock:
            procs = self.last_procs

        def progress(payload: Dict[str, Any]) -> None:
            msg = dict(payload)
            msg.update({"type": "kill_progress", "id": rid})
            emit(msg)

        return runner.kill(self._runs_dir(), arg(args, "run_id", str), graces=tuple(graces),
                           gpu_wait=arg(args, "gpu_wait", (int, float), 30),
                           gpu_query=lambda: self.gpus.read()[0] if self.gpus.source else None,
                           progress=progress, procs=procs)

    # -- loop

    def _reader(self) -> None:
        """stdin → queue; None marks EOF. Pokes the self-pipe so select() wakes up."""
        stdin = sys.stdin.buffer
        while True:
            line = stdin.readline()
            self.requests.put(line if line else None)
            os.write(self.wake_w, b"x")
            if not line:
                return

    def run(self) -> int:
        emit(self.hello())
        threading.Thread(target=self._reader, daemon=True).start()
        self.next_snap = time.monotonic()
        behind = False
        last_wake = 0.0
        poll = 1.0 if self.inotify.fd is not None else 0.25
        fds = [self.wake_r] + ([self.inotify.fd] if self.inotify.fd is not None else [])
        while True:
            timeout = 0.0 if behind else poll
            if self.configured:
                timeout = max(0.0, min(timeout, self.next_snap - time.monotonic()))
            ready, _, _ = select.select(fds, [], [], timeout)
            if self.wake_r in ready:
                os.read(self.wake_r, 4096)
            if self.inotify.fd in ready:
                # A busy directory (shards written beside the log) can fire thousands of
                # events a second: let them gather for a moment, cap wake-ups near 50 Hz.
                # Sleep only when the last wake-up was recent, so a quiet log is not delayed.
                since = time.monotonic() - last_wake
                if self.wake_r not in ready and since < 0.02:
                    time.sleep(0.02 - since)
                last_wake = time.monotonic()
                self.inotify.drain()
            while True:
                try:
                    line = self.requests.get_nowait()
                except queue.Empty:
                    break
                if line is None:
                    return 0
                if line.strip():
                    self.handle_line(line)
            behind = False
            for sub in list(self.subs.values()):
                behind = sub.pump() or behind
            if self.subs and self.inotify.fd is not None:
                self._sync_watches()  # a directory that did not exist may exist now
            if self.configured and time.monotonic() >= self.next_snap:
                self.next_snap += self.interval
                if self.next_snap < time.monotonic():
                    self.next_snap = time.monotonic() + self.interval
                try:
                    self.send_snapshot()
                except Exception as exc:
                    emit({"type": "error", "message": "snapshot failed: %s" % one_line(exc)})


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="eagle3-tui host agent (JSON lines on stdio)")
    parser.add_argument("--runs-dir", default=None, help="runs directory (default: runner's)")
    opts = parser.parse_args(argv)
    try:
        agent = Agent(opts.runs_dir)
    except Exception as exc:
        emit({"type": "error", "message": "agent failed to start: %s" % one_line(exc)})
        return 1
    try:
        return agent.run()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
