"""Run lifecycle on the GPU host: launch under a supervisor shim, list; kill is in
the sibling kill.py.

Standard library only; runs on the host's Python 3.9+. Imported by agent.py and
also executed as the supervisor shim: ``python runner.py supervise RUN_DIR``.

A run lives in ``RUNS_DIR/<run_id>/``: ``launch.json`` (the request),
``manifest.json`` (written by the shim once the run's process exists),
``output.log``, ``exit.json`` (written by the shim when every process of the run
is gone), ``killed.json`` (written by ``kill``) and ``error.json`` (the run could not
be started; listed as state ``failed`` from ``launch.json`` and the error). Every
process of the run inherits ``EAGLE3_TUI_RUN_ID=<run_id>`` so workers that escape the
process tree can still be found.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import re
import secrets
import signal
import socket
import stat
import subprocess
import sys
import time
from typing import Any, Iterator

try:  # imported as remote.runner (tests, client) or as a top-level module (host)
    from . import procfs
except ImportError:
    import procfs  # type: ignore[no-redef]

RUN_ENV = "EAGLE3_TUI_RUN_ID"
LAUNCH_WAIT = 10.0  # seconds launch() waits for the shim's manifest
PR_SET_CHILD_SUBREAPER = 36
_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class RunnerError(Exception):
    """A one-line, user-facing failure of a run operation."""


def default_runs_dir() -> str:
    """Where runs live unless configured otherwise."""
    return os.path.expanduser("~/.cache/eagle3-tui/runs")


# ---------------------------------------------------------------- small helpers


def _read_json(path: str) -> Any:
    """Parsed JSON of a file, or None when missing, unreadable or half-written."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None


def _write_json_atomic(path: str, obj: Any) -> None:
    """Write JSON so readers see the old file or the whole new one, never a part."""
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return "SIG%d" % num


def _alive(pid: int | None, ticks: int | None) -> bool:
    """True when pid is a live (non-zombie) process that started at `ticks`."""
    if not isinstance(pid, int) or pid <= 0 or not isinstance(ticks, int):
        return False
    st = procfs.read_stat(pid)
    return st is not None and st["start_ticks"] == ticks and st["state"] not in ("Z", "X")


def _name_from_argv(argv: list[str]) -> str:
    """A short human name: the script or module a Python command runs, else argv[0]."""
    if not argv:
        return "?"
    if os.path.basename(argv[0]).startswith("python"):
        args = iter(argv[1:])
        for arg in args:
            if arg == "-m":
                return next(args, "python")
            if arg == "-c":
                return "python -c"
            if not arg.startswith("-"):
                return os.path.basename(arg)
    return os.path.basename(argv[0])


# ---------------------------------------------------------------- run records


def _run_dir(runs_dir: str, run_id: str) -> str:
    if not isinstance(run_id, str) or not _RUN_ID_RE.fullmatch(run_id):
        raise RunnerError("no run %s" % json.dumps(str(run_id)[:80]))
    return os.path.join(runs_dir, run_id)


# Fields of a run record that only a started run (its manifest) can fill.
_STARTED_ONLY = ("host", "user", "pid", "pgid", "sid", "start_ticks", "start_time",
                 "shim_pid", "shim_start_ticks", "boot_time", "subreaper")


def _failed_record(run_dir: str) -> dict | None:
    """The record of a run that never started (error.json, no manifest): the request
    from launch.json, state ``failed`` and the error; None when there is no error.json."""
    err_path = os.path.join(run_dir, "error.json")
    err = _read_json(err_path)
    if not isinstance(err, dict):
        return None  # a launch in progress, or junk: not a run yet
    req = _read_json(os.path.join(run_dir, "launch.json"))
    req = req if isinstance(req, dict) else {}
    rec: dict = {key: None for key in _STARTED_ONLY}
    for key in ("name", "argv", "cwd", "env", "patch_state", "log", "launched_at"):
        rec[key] = req.get(key)
    at = err.get("at")
    if not isinstance(at, (int, float)):
        try:  # error.json of an older shim carries no time: its mtime is when it failed
            at = os.stat(err_path).st_mtime
        except OSError:
            at = None
    text = " ".join(str(err.get("error") or "unknown error").split())
    rec.update(run_id=os.path.basename(run_dir), state="failed", error=text, exit_code=None,
               signal=None, ended_at=at, duration=None, external=False)
    return rec


def _write_error(run_dir: str, message: str) -> None:
    """Record why a run could not start (first writer wins), so `runs` can list it."""
    path = os.path.join(run_dir, "error.json")
    if not os.path.exists(path):
        _write_json_atomic(path, {"error": message, "at": time.time()})


def _record(run_dir: str, btime: float) -> dict | None:
    """The run record of one run dir, or None when it holds neither a usable manifest
    nor an error.json (a launch in progress, or junk)."""
    manifest = _read_json(os.path.join(run_dir, "manifest.json"))
    if not isinstance(manifest, dict):
        return _failed_record(run_dir)
    rec = dict(manifest)
    rec["run_id"] = os.path.basename(run_dir)
    for key in ("pid", "pgid", "sid", "start_ticks", "shim_pid", "shim_start_ticks"):
        if not isinstance(rec.get(key), int):
            rec[key] = None
    same_boot = abs(float(rec.get("boot_time") or 0) - btime) < 2.0
    exit_info = _read_json(os.path.join(run_dir, "exit.json"))
    killed = _read_json(os.path.join(run_dir, "killed.json"))
    exit_info = exit_info if isinstance(exit_info, dict) else None
    killed = killed if isinstance(killed, dict) else None
    alive = same_boot and (
        _alive(rec["pid"], rec["start_ticks"]) or _alive(rec["shim_pid"], rec["shim_start_ticks"])
    )
    # exit.json is written only once every process is gone, so it wins over liveness.
    if exit_info is not None:
        state = "killed" if killed is not None else "exited"
    elif alive:
        state = "running"
    elif killed is not None:
        state = "killed"
    else:
        state = "lost"
    ended_at = (exit_info or {}).get("ended_at")
    if ended_at is None and state == "killed":
        ended_at = (killed or {}).get("at")
    rec.update(
        state=state,
        exit_code=(exit_info or {}).get("exit_code"),
        signal=(exit_info or {}).get("signal"),
        ended_at=ended_at,
        external=False,
        error=None,
    )
    start = rec.get("start_time")
    end = ended_at if ended_at is not None else (time.time() if state == "running" else None)
    if isinstance(start, (int, float)) and isinstance(end, (int, float)):
        rec["duration"] = round(end - start, 3)
    else:
        rec["duration"] = None
    return rec


# Records of ended runs never change while their directory does not: the agent lists
# runs every tick, so re-reading three JSON files per old run would dominate its cost.
_ENDED: dict[str, tuple[int, dict]] = {}


def list_runs(runs_dir: str) -> list[dict]:
    """Every run under runs_dir, newest first; junk and half-written dirs are skipped."""
    try:
        names = os.listdir(runs_dir)
    except OSError:
        return []
    btime = procfs.boot_time()
    now = time.time()
    out = []
    for name in names:
        if name.startswith("."):
            continue
        path = os.path.join(runs_dir, name)
        cached = _ENDED.get(path)
        if cached is not None and (cached[1].get("ended_at") or now) < now - 300:
            out.append(dict(cached[1]))  # ended long ago: not even a stat
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            continue
        if cached is not None and cached[0] == st.st_mtime_ns:
            out.append(dict(cached[1]))
            continue
        rec = _record(path, btime)
        if rec is None:
            continue
        if rec["state"] in ("exited", "killed", "failed"):
            _ENDED[path] = (st.st_mtime_ns, rec)
        out.append(rec)

    def newest(r: dict) -> tuple[float, str]:
        at = r.get("launched_at")
        return (float(at) if isinstance(at, (int, float)) else 0.0, r["run_id"])

    out.sort(key=newest, reverse=True)
    return out


# ---------------------------------------------------------------- launch


def _validate(name: Any, argv: Any, cwd: Any, env: Any, patch_state: Any) -> None:
    if name is not None and not isinstance(name, str):
        raise RunnerError("name must be a string")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise RunnerError("argv must be a non-empty list of strings")
    if any("\0" in a for a in argv):
        raise RunnerError("argv must not contain NUL bytes")
    if not isinstance(cwd, str) or not os.path.isdir(cwd):
        raise RunnerError("cwd is not an existing directory: %r" % (cwd,))
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise RunnerError("env must map strings to strings")
    for k, v in env.items():
        if not k or "=" in k or "\0" in k or "\0" in v:
            raise RunnerError("bad environment variable name or value: %r" % k)
    try:
        json.dumps(patch_state)
    except (TypeError, ValueError):
        raise RunnerError("patch_state must be JSON-serialisable") from None


@contextlib.contextmanager
def _launch_lock(runs_dir: str, busy: str) -> Iterator[None]:
    """Hold the runs dir's launch lock (never waiting: `busy` is the error when another
    holder has it), so a launch never races another launch or a prune."""
    try:
        os.makedirs(runs_dir, 0o700, exist_ok=True)
        lock = open(os.path.join(runs_dir, ".launch.lock"), "a+b")
    except OSError as e:
        raise RunnerError("cannot use runs dir %s: %s" % (runs_dir, e.strerror)) from None
    with lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise RunnerError(busy) from None
        yield


def _new_run_dir(runs_dir: str) -> tuple[str, str]:
    for _ in range(100):
        run_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)
        path = os.path.join(runs_dir, run_id)
        try:
            os.mkdir(path, 0o700)
            return run_id, path
        except FileExistsError:
            continue
    raise RunnerError("cannot allocate a run directory in %s" % runs_dir)


def launch(
    runs_dir: str,
    name: str | None,
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    patch_state: Any = None,
    log: str | None = None,
    python: str = sys.executable,
    allow_concurrent: bool = False,
) -> dict:
    """Start argv under a detached supervisor shim and return its run record."""
    _validate(name, argv, cwd, env, patch_state)
    if log is not None and not isinstance(log, str):
        raise RunnerError("log must be a path or null")
    name = name or _name_from_argv(argv)
    cwd = os.path.abspath(cwd)
    with _launch_lock(runs_dir, "another launch is in progress on this host"):
        if not allow_concurrent:
            for rec in list_runs(runs_dir):
                if rec["state"] == "running" and rec.get("name") == name:
                    raise RunnerError(
                        "run %s named %r is still running (pid %s)"
                        % (rec["run_id"], name, rec.get("pid"))
                    )
        run_id, run_dir = _new_run_dir(runs_dir)
        request = {
            "run_id": run_id,
            "name": name,
            "argv": argv,
            "cwd": cwd,
            "env": env,
            "patch_state": patch_state,
            "log": log,
            "launched_at": time.time(),
        }
        _write_json_atomic(os.path.join(run_dir, "launch.json"), request)
        shim_env = dict(os.environ)
        shim_env[RUN_ENV] = run_id  # marks the shim too, so snapshots attribute it
        try:
            first = subprocess.Popen(
                [python, os.path.abspath(__file__), "supervise", run_dir],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,
                env=shim_env,
                cwd=run_dir,
            )
            # The first stage forks the real shim and exits at once; reaping it here
            # leaves no zombie in a long-lived agent.
            first.wait(timeout=LAUNCH_WAIT)
        except (OSError, subprocess.TimeoutExpired) as e:
            _write_error(run_dir, "cannot start the supervisor: %s" % e)
            raise RunnerError("cannot start the supervisor: %s" % e) from None
        deadline = time.monotonic() + LAUNCH_WAIT
        while time.monotonic() < deadline:
            started = _record(run_dir, procfs.boot_time())
            if started is not None and started["state"] != "failed":
                return started
            if started is not None:
                raise RunnerError("run %s did not start: %s" % (run_id, started["error"]))
            time.sleep(0.02)
        # Listed as failed from now on; a manifest written late still wins over this.
        _write_error(run_dir, "the supervisor wrote no manifest within %gs" % LAUNCH_WAIT)
        raise RunnerError(
            "run %s: the supervisor wrote no manifest within %gs" % (run_id, LAUNCH_WAIT)
        )


# ---------------------------------------------------------------- the shim


def _become_subreaper() -> bool:
    """Adopt orphaned descendants (double-forked workers) so they stay findable."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except Exception:  # no libc / no prctl: degrade to marker-only finding
        return False


def _marked_pids(run_id: str, skip: int) -> list[int]:
    return [
        pid
        for pid in procfs.list_pids()
        if pid != skip
        and procfs.read_environ_var(pid, RUN_ENV) == run_id
        and (procfs.read_stat(pid) or {}).get("state") not in (None, "Z", "X")
    ]


def _forward(group: list[int], num: int) -> None:
    """Pass a signal on to the run's process group (group: [its pgid] once it exists)."""
    if group:
        with contextlib.suppress(OSError):
            os.killpg(group[0], num)


def supervise(run_dir: str, detach: bool = True) -> int:
    """Body of ``runner.py supervise RUN_DIR``: run, record, wait, record the end.
    ``detach=False`` (a Slurm batch job) stays in the foreground and returns the run's
    exit code (128 + signal when a signal ended it), so the job's end is the run's."""
    if detach:
        if os.fork():
            os._exit(0)  # first stage: let launch() reap us; the child carries on
        os.setsid()  # the shim leads its own session
    run_dir = os.path.abspath(run_dir)
    try:
        req = _read_json(os.path.join(run_dir, "launch.json"))
        if not isinstance(req, dict):
            raise RunnerError("launch.json is missing or unreadable")
        _validate(req.get("name"), req.get("argv"), req.get("cwd"), req.get("env"), None)
        run_id = os.path.basename(run_dir)
        subreaper = _become_subreaper()
        # A Python-level handler (not SIG_IGN) shields the shim while exec() resets
        # it to the default in the child; a SIG_IGN would be inherited by the run.
        # In the foreground (a Slurm batch job) the handler passes the signal on to the
        # run's process group instead: `scancel --signal` reaches only the batch script.
        group: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, (lambda *_: None) if detach else
                          (lambda num, _f: _forward(group, num)))
        log = req.get("log") or os.path.join(run_dir, "output.log")
        log = os.path.join(req["cwd"], os.path.expanduser(log))
        log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        env = dict(os.environ)
        env.update(req["env"])
        env[RUN_ENV] = run_id
        kwargs: dict[str, Any] = {}
        if sys.version_info >= (3, 11):
            kwargs["process_group"] = 0
        else:
            kwargs["preexec_fn"] = lambda: os.setpgid(0, 0)
        child = subprocess.Popen(
            req["argv"],
            cwd=req["cwd"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            close_fds=True,
            **kwargs,
        )
        os.close(log_fd)
        group.append(child.pid)
    except Exception as e:  # top level of a detached process: report, never vanish
        _write_error(run_dir, str(e) or type(e).__name__)
        return 1
    btime = procfs.boot_time()
    # The child is not reaped yet, so its stat is readable even if it already exited.
    st = procfs.read_stat(child.pid) or {}
    me = procfs.read_stat(os.getpid()) or {}
    manifest = {
        "run_id": run_id,
        "name": req.get("name"),
        "argv": req["argv"],
        "cwd": req["cwd"],
        "env": req["env"],
        "host": socket.gethostname(),
        "user": _user(),
        "pid": child.pid,
        "pgid": st.get("pgid", child.pid),
        "sid": st.get("sid", os.getsid(0)),
        "start_ticks": st.get("start_ticks"),
        "start_time": procfs.start_time(st, btime) if st else time.time(),
        "shim_pid": os.getpid(),
        "shim_start_ticks": me.get("start_ticks"),
        "boot_time": btime,
        "subreaper": subreaper,
        "launched_at": req.get("launched_at"),
        "patch_state": req.get("patch_state"),
        "log": os.path.abspath(log),
    }
    _write_json_atomic(os.path.join(run_dir, "manifest.json"), manifest)
    status, main_ended = None, None
    strays: list[int] = []  # descendants still alive when the main process ended
    while True:  # reap the child and every orphan re-parented to us
        try:
            pid, st_ = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == child.pid:
            status, main_ended = st_, time.time()
            # Reaped here, not by Popen: tell Popen so it never waits on a stale pid.
            child.returncode = os.waitstatus_to_exitcode(st_)
        elif main_ended is not None:
            strays.append(pid)
    if not subreaper:  # orphans went to init: wait for them by their marker instead
        while True:
            left = _marked_pids(run_id, os.getpid())
            if not left:
                break
            strays.extend(p for p in left if p not in strays)
            time.sleep(1.0)
    code = sig_name = None
    if status is not None and os.WIFSIGNALED(status):
        sig_name = _signal_name(os.WTERMSIG(status))
    elif status is not None:
        code = os.WEXITSTATUS(status)
    ended = time.time()
    _write_json_atomic(
        os.path.join(run_dir, "exit.json"),
        {
            "exit_code": code,
            "signal": sig_name,
            "ended_at": ended,
            "main_ended_at": main_ended,
            "strays": strays,
            "strays_outlived": bool(strays),
        },
    )
    if detach:
        return 0
    return code if code is not None else 128 + (os.WTERMSIG(status) if status is not None else 0)


# ---------------------------------------------------------------- external runs


_EXT_ID_RE = re.compile(r"ext-([1-9][0-9]*)-([0-9]+)")


def _ext_id(pid: int, start_ticks: int) -> str:
    """The run id of an external run: its pid and start ticks, so a reused PID never
    passes for it."""
    return "ext-%d-%d" % (pid, start_ticks)


def _start_ticks(p: dict) -> int | None:
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
        ticks = _start_ticks(p)
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
                "run_id": _ext_id(pid, ticks),
                "name": _name_from_argv(p.get("cmdline") or []),
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


def main(args: list[str]) -> int:
    """Command line: ``runner.py supervise RUN_DIR`` (used by launch)."""
    if len(args) == 2 and args[0] == "supervise":
        return supervise(args[1])
    sys.stderr.write("usage: runner.py supervise RUN_DIR\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# ---------------------------------------------------------------- prune


def prune_runs(runs_dir: str, older_than: float | None = None, keep: int | None = None,
               env: dict | None = None, dry_run: bool = False) -> dict:
    """Remove ended runs' directories (records and logs together); never a live one.

    Selected: ended runs (not `running`) whose launch env holds every item of `env`
    (the demo marks its runs so), then of those, the ones that ended more than
    `older_than` seconds ago and are not among the `keep` newest. Only directories
    this runner made (a launch.json inside) are touched. Holds the launch lock, so
    a launch in progress is never raced.
    """
    import shutil

    with _launch_lock(runs_dir, "a launch is in progress on this host; try again"):
        now = time.time()
        ended = [r for r in list_runs(runs_dir) if r.get("state") != "running"
                 and os.path.isfile(os.path.join(runs_dir, r["run_id"], "launch.json"))
                 and all((r.get("env") or {}).get(k) == v for k, v in (env or {}).items())]
        chosen = ended[keep:] if keep else ended  # list_runs is newest first
        if older_than is not None:
            chosen = [r for r in chosen
                      if (r.get("ended_at") or r.get("launched_at") or now) < now - older_than]
        removed = []
        for rec in chosen:
            path = _run_dir(runs_dir, rec["run_id"])
            if not dry_run:
                shutil.rmtree(path, ignore_errors=True)
                _ENDED.pop(path, None)
                if os.path.exists(path):
                    continue
            removed.append({"run_id": rec["run_id"], "name": rec.get("name"),
                            "state": rec.get("state"), "ended_at": rec.get("ended_at")})
    return {"removed": removed, "kept": len(ended) - len(removed), "dry_run": dry_run}
