"""The run directory on the host: where runs live, their record files, and the run
records read back from them (list, prune). Standard library only; Python 3.9+.

A run lives in ``RUNS_DIR/<run_id>/``: ``launch.json`` (the request),
``manifest.json`` (written by the shim once the run's process exists),
``output.log``, ``exit.json`` (written by the shim when every process of the run
is gone), ``killed.json`` (written by ``kill``) and ``error.json`` (the run could not
be started; listed as state ``failed`` from ``launch.json`` and the error). Every
process of the run inherits ``EAGLE3_TUI_RUN_ID=<run_id>`` so workers that escape the
process tree can still be found. Every file is written through ``atomicfile``.

Trust (``trust.py``): the runs dir and every run dir must be ours alone (owner, no
group/other write, no symlink) and every record is read with O_NOFOLLOW and checked
the same way. A runs dir that fails is refused (`RunnerError`, one line); a run dir or
record that fails is left out of the listing with a one-line warning.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pwd
import re
import secrets
import signal
import stat
import time
from typing import Any, Callable, Iterator

from remote.base import atomicfile, procfs, trust
from remote.run import attempts

RUN_ENV = "EAGLE3_TUI_RUN_ID"
EXIT_RESERVE = "exit.reserve"  # the exit record's space, reserved at launch (reserve.make)
RESERVE_BYTES = 4096
_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class RunnerError(Exception):
    """A one-line, user-facing failure of a run operation."""


def default_runs_dir() -> str:
    """Where runs live unless configured otherwise."""
    return os.path.expanduser("~/.cache/eagle3-tui/runs")


# ---------------------------------------------------------------- small helpers


def read_json(path: str) -> Any:
    """Parsed JSON of a file, or None when missing, unreadable or half-written.
    A symlink, or a file another user owns or may write, raises `trust.Untrusted`."""
    try:
        return json.loads(trust.read_bytes(path, "run record").decode("utf-8"))
    except (OSError, ValueError):
        return None


def read_record(path: str) -> Any:
    """`read_json` for an action on a run: a record that is not ours alone is RunnerError."""
    try:
        return read_json(path)
    except trust.Untrusted as e:
        raise RunnerError(str(e)) from None


def check_runs_dir(runs_dir: str) -> bool:
    """False when runs_dir does not exist; RunnerError (one line: path, owner, mode)
    when it is not ours alone; True when it may be used."""
    try:
        trust.check_dir(runs_dir, "runs dir")
    except FileNotFoundError:
        return False
    except trust.Untrusted as e:
        raise RunnerError(str(e)) from None
    return True


def trusted_run_dir(runs_dir: str, run_id: str) -> str:
    """The path of a run dir that may be used (`run_path`, the runs dir and the run dir
    checked); RunnerError when either is not ours alone."""
    path = run_path(runs_dir, run_id)
    try:
        if check_runs_dir(runs_dir):
            trust.check_dir(path, "run dir")
    except FileNotFoundError:
        pass  # no such run: the caller says so
    except trust.Untrusted as e:
        raise RunnerError(str(e)) from None
    return path


def user_name() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return "SIG%d" % num


def pid_alive(pid: int | None, ticks: int | None) -> bool:
    """True when pid is a live (non-zombie) process that started at `ticks`."""
    if not isinstance(pid, int) or pid <= 0 or not isinstance(ticks, int):
        return False
    st = procfs.read_stat(pid)
    return st is not None and st["start_ticks"] == ticks and st["state"] not in ("Z", "X")


def same_boot(manifest: dict, btime: float) -> bool:
    """True when the manifest was written during this boot, so its pids and start ticks
    still mean the same processes. The boot id decides; btime (which a clock step moves)
    only for a manifest written before boot ids were recorded."""
    then, now = manifest.get("boot_id"), procfs.boot_id()
    if isinstance(then, str) and now is not None:
        return then == now
    return abs(float(manifest.get("boot_time") or 0) - btime) < 2.0


def name_from_argv(argv: list[str]) -> str:
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


def run_path(runs_dir: str, run_id: str) -> str:
    if not isinstance(run_id, str) or not _RUN_ID_RE.fullmatch(run_id):
        raise RunnerError("no run %s" % json.dumps(str(run_id)[:80]))
    return os.path.join(runs_dir, run_id)


# Fields of a run record that only a started run (its manifest) can fill.
_STARTED_ONLY = ("host", "user", "pid", "pgid", "sid", "start_ticks", "start_time",
                 "shim_pid", "shim_start_ticks", "boot_time", "boot_id", "subreaper")


def new_run_dir(runs_dir: str) -> tuple[str, str]:
    """A fresh run directory (mode 0700) under `runs_dir`: (run_id, path)."""
    for _ in range(100):
        run_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)
        path = os.path.join(runs_dir, run_id)
        try:
            os.mkdir(path, 0o700)
            return run_id, path
        except FileExistsError:
            continue
        except OSError as e:  # ENOSPC, EDQUOT: one line, as for the records (`write_failed`)
            raise RunnerError("cannot launch: %s" % write_failed(e, path, "making")) from None
    raise RunnerError("cannot allocate a run directory in %s" % runs_dir)


def request_record(req: dict) -> dict:
    """A run record from its request alone (launch.json): what was asked for, and None
    for every field only a started run has (a run that never started, a queued job)."""
    rec: dict = {key: None for key in _STARTED_ONLY}
    for key in ("name", "argv", "cwd", "env", "patch_state", "log", "launched_at"):
        rec[key] = req.get(key)
    return rec


def failed_record(run_dir: str) -> dict | None:
    """The record of a run that never started (error.json, no manifest): the request
    from launch.json, state ``failed`` and the error; None when there is no error.json.
    On a full disk the shim writes the error into the exit record's reserve and renames
    it error.json; a rename that failed too leaves it in the reserve, read from there."""
    err_path = os.path.join(run_dir, "error.json")
    err = read_json(err_path)
    if not isinstance(err, dict):
        err_path = os.path.join(run_dir, EXIT_RESERVE)
        err = read_json(err_path)  # blanks while the run is young: None
        if not isinstance(err, dict) or "error" not in err:
            return None  # a launch in progress, or junk: not a run yet
    req = read_json(os.path.join(run_dir, "launch.json"))
    rec = request_record(req if isinstance(req, dict) else {})
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


def write_failed(e: OSError, path: str, doing: str = "writing") -> str:
    """One line for a record that could not be written: "no space left on device writing PATH"."""
    return "%s %s %s" % (os.strerror(e.errno).lower() if e.errno else str(e), doing, path)


def write_error(run_dir: str, message: str) -> None:
    """Record why a run could not start (first writer wins), so `runs` can list it."""
    path = os.path.join(run_dir, "error.json")
    if not os.path.exists(path):
        atomicfile.write_json(path, {"error": message, "at": time.time()})


def record(run_dir: str, btime: float) -> dict | None:
    """The run record of one run dir, or None when it holds neither a usable manifest
    nor an error.json (a launch in progress, or junk)."""
    manifest = read_json(os.path.join(run_dir, "manifest.json"))
    if not isinstance(manifest, dict):
        return failed_record(run_dir)
    rec = dict(manifest)
    rec["run_id"] = os.path.basename(run_dir)
    for key in ("pid", "pgid", "sid", "start_ticks", "shim_pid", "shim_start_ticks"):
        if not isinstance(rec.get(key), int):
            rec[key] = None
    this_boot = same_boot(rec, btime)
    # exit.reserve: the shim's exit record written into its reserved space (a full disk)
    exit_info = read_json(os.path.join(run_dir, "exit.json")) or read_json(os.path.join(run_dir, EXIT_RESERVE))
    killed = read_json(os.path.join(run_dir, "killed.json"))
    exit_info = exit_info if isinstance(exit_info, dict) else None
    killed = killed if isinstance(killed, dict) else None
    alive = this_boot and (
        pid_alive(rec["pid"], rec["start_ticks"]) or pid_alive(rec["shim_pid"], rec["shim_start_ticks"])
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
    full = bool((exit_info or {}).get("disk_full"))
    write_error = (exit_info or {}).get("write_error")
    if state == "lost" and _disk_full(run_dir):  # not even the reserve: say why, not "lost"
        full, write_error = True, "no space left on device in %s now: the run's end could not be recorded" % run_dir
    rec.update(
        disk_full=full,
        write_error=write_error if isinstance(write_error, str) else None,
        state=state,
        exit_code=(exit_info or {}).get("exit_code"),
        signal=(exit_info or {}).get("signal"),
        ended_at=ended_at,
        external=False,
        error=None,
    )
    attempts.add_to(rec, run_dir)  # restart.py's, with a policy: attempts.json or its reserve
    start = rec.get("start_time")
    end = ended_at if ended_at is not None else (time.time() if state == "running" else None)
    if isinstance(start, (int, float)) and isinstance(end, (int, float)):
        rec["duration"] = round(end - start, 3)
    else:
        rec["duration"] = None
    return rec


def _disk_full(path: str) -> bool:
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 64 * 1024 or (st.f_files > 0 and st.f_favail == 0)


# Records of ended runs never change while their directory does not: the agent lists
# runs every tick, so re-reading three JSON files per old run would dominate its cost.
_ENDED: dict[str, tuple[int, dict]] = {}


def list_runs(runs_dir: str, warnings: list[str] | None = None) -> list[dict]:
    """Every run under runs_dir, newest first; junk and half-written dirs are skipped.
    A run dir or record that is not ours alone is skipped too, with its one line added
    to `warnings`; a runs dir that is not ours alone is RunnerError."""
    try:
        if not check_runs_dir(runs_dir):
            return []
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
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode):
            continue
        if cached is not None and cached[0] == st.st_mtime_ns:
            out.append(dict(cached[1]))
            continue
        try:
            trust.check_dir(path, "run dir")
            rec = record(path, btime)
        except trust.Untrusted as e:
            if warnings is not None:
                warnings.append(str(e))
            continue
        except OSError:
            continue
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


def validate(name: Any, argv: Any, cwd: Any, env: Any, patch_state: Any) -> None:
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
def launch_lock(runs_dir: str, busy: str) -> Iterator[None]:
    """Hold the runs dir's launch lock (never waiting: `busy` is the error when another
    holder has it), so a launch never races another launch or a prune."""
    path = os.path.join(runs_dir, ".launch.lock")
    try:
        trust.make_dir(runs_dir, "runs dir")
        # never through a symlink (O_NOFOLLOW), and only a lock file that is ours alone
        lock = os.fdopen(trust.open_file(path, os.O_RDWR | os.O_CREAT, "launch lock"), "r+b")
    except trust.Untrusted as e:
        raise RunnerError(str(e)) from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RunnerError("refusing launch lock %s: a symlink" % path) from None
        raise RunnerError("cannot use runs dir %s: %s" % (runs_dir, e.strerror)) from None
    with lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise RunnerError(busy) from None
        yield


# ---------------------------------------------------------------- prune


def prune_verdict(run_dir: str) -> str | None:
    """Why an ended run chosen for pruning must be kept (one line), or None when its
    directory can be removed whole. The one decision `--dry-run` and the real prune
    share: a run dir that is not ours alone, one that holds a mount point (removing it
    would empty that filesystem), or a folder in it we may not delete from."""
    try:
        root = trust.check_dir(run_dir, "run dir")
    except trust.Untrusted as e:
        return str(e)
    except OSError as e:
        return "cannot read %s: %s" % (run_dir, e.strerror)
    for here, dirs, files in os.walk(run_dir, onerror=None):
        if not os.access(here, os.W_OK | os.X_OK):
            return "cannot delete inside %s: permission denied" % here
        for name in dirs + files:
            path = os.path.join(here, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if st.st_dev != root.st_dev:
                return "%s is a mount point; unmount it first" % path
    return None


def _remove_tree(path: str) -> str | None:
    """Remove `path` and everything in it (symlinks as links, never followed); the first
    error ("PATH: reason"), or None when all of it is gone."""
    first: list[str] = []

    def gone(fn: Callable[[str], None], p: str) -> None:
        try:
            fn(p)
        except FileNotFoundError:
            pass
        except OSError as e:
            first.append("%s: %s" % (p, e.strerror or e))

    for here, dirs, files in os.walk(path, topdown=False):
        for name in files:
            gone(os.unlink, os.path.join(here, name))
        for name in dirs:
            sub = os.path.join(here, name)
            gone(os.unlink if os.path.islink(sub) else os.rmdir, sub)
    gone(os.rmdir, path)
    return first[0] if first else None


def prune_runs(runs_dir: str, older_than: float | None = None, keep: int | None = None,
               env: dict | None = None, dry_run: bool = False,
               lister: Callable[[str], list[dict]] | None = None) -> dict:
    """Remove ended runs' directories (records and logs together); never a live one.

    Selected: ended runs (not `running`) whose launch env holds every item of `env`
    (the demo marks its runs so), then of those, the ones that ended more than
    `older_than` seconds ago and are not among the `keep` newest. Only directories
    this runner made (a launch.json inside) are touched. Each selected run then goes
    through `prune_verdict`, in a dry run as in the real one: those it keeps are listed
    in `skipped` with the reason, as is a removal that failed part-way. Holds the launch
    lock, so a launch in progress is never raced. `lister` lists the runs (default
    `list_runs`; the agent passes Slurm's, whose queued and running jobs are live too).
    """
    with launch_lock(runs_dir, "a launch is in progress on this host; try again"):
        now = time.time()
        ended = [r for r in (lister or list_runs)(runs_dir) if r.get("state") not in ("running", "pending")
                 and os.path.isfile(os.path.join(runs_dir, r["run_id"], "launch.json"))
                 and all((r.get("env") or {}).get(k) == v for k, v in (env or {}).items())]
        chosen = ended[keep:] if keep else ended  # list_runs is newest first
        if older_than is not None:
            chosen = [r for r in chosen
                      if (r.get("ended_at") or r.get("launched_at") or now) < now - older_than]
        removed, skipped = [], []
        for rec in chosen:
            path = run_path(runs_dir, rec["run_id"])
            brief = {"run_id": rec["run_id"], "name": rec.get("name"),
                     "state": rec.get("state"), "ended_at": rec.get("ended_at")}
            reason = prune_verdict(path)
            if reason is None and not dry_run:
                error = _remove_tree(path)
                _ENDED.pop(path, None)
                if error is not None:
                    reason = "removal failed part-way (%s)" % error
            if reason is not None:
                skipped.append(dict(brief, reason=reason))
            else:
                removed.append(brief)
    return {"removed": removed, "skipped": skipped, "kept": len(ended) - len(removed),
            "dry_run": dry_run}
