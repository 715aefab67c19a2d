"""The supervisor shim of one run: ``python shim.py supervise RUN_DIR``, started
detached by ``launch.py``. It starts the run's command with its log and run marker,
writes ``manifest.json``, keeps the run's pace in ``pace.json`` (a thread running
``pace.follow`` over the run's log), reaps the run and every orphan of it, and writes
``exit.json`` when all are gone -- through ENOSPC too: its space is reserved at launch
(``exit.reserve``, see `write_exit`). Standard library only; Python 3.9+."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Iterator

if not __package__:  # started as a file: docs/architecture.md, "Upload layout and imports"
    _HERE = os.path.dirname(os.path.abspath(__file__))  # off sys.path, for the dir above
    _ABOVE = os.path.dirname(os.path.dirname(_HERE))
    sys.path[:] = [_ABOVE] + [p for p in sys.path if os.path.abspath(p) != _HERE]

from remote.base import atomicfile, procfs, trust
from remote.run import history, pace, reserve, restart, rundir, timeline

RUN_ENV, RunnerError = rundir.RUN_ENV, rundir.RunnerError
PR_SET_CHILD_SUBREAPER = 36
RESERVE_BYTES = rundir.RESERVE_BYTES  # the exit record's space, reserved at launch (write_exit)
UMASK_ENV = "EAGLE3_TUI_UMASK"  # the login's umask; the agent itself runs under 022


def _restore_umask(text: str | None) -> None:
    try:
        if text and text.strip().isdigit():
            os.umask(int(text.strip(), 8) & 0o777)
    except ValueError:
        pass


def open_log(log: str) -> int:
    """The run's log, opened for appending under the host's one rule for files opened as
    the user (trust.open_file: no symlink, no FIFO, a regular file of ours alone, created
    0644 whatever the umask); RunnerError with one line otherwise, which the launch
    reports at once (error.json). As root in another user's directory a symlink named
    like the log would have root append the run's output to any file, a FIFO would block
    the shim until they read it, and a file of theirs would let them add lines."""
    try:
        return trust.open_file(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, "log", 0o644)
    except trust.Untrusted as e:
        raise RunnerError(str(e)) from None
    except OSError as e:
        raise RunnerError("cannot open log %s: %s" % (log, e.strerror or e)) from None


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
        and procfs.run_marker(pid, RUN_ENV) == run_id  # this user's only: anyone may set it
        and (procfs.read_stat(pid) or {}).get("state") not in (None, "Z", "X")
    ]


def _forward(group: list[int], num: int) -> None:
    """Pass a signal on to the run's process group (group: [its pgid] once it exists)."""
    if group:
        with contextlib.suppress(OSError):
            os.killpg(group[0], num)


def reserve_exit(run_dir: str) -> int | None:
    """An fd on the exit record's reserved space (``exit.reserve``): the one the launch or
    Slurm's submit made (launch.write_request; a Slurm run's jobs share it), else a new
    one; None when there is none to be had (reserve.open_or_make). `write_exit` and
    `write_failure` overwrite it in place on a full disk."""
    return reserve.open_or_make(run_dir, rundir.EXIT_RESERVE, RESERVE_BYTES)


def _into_reserve(run_dir: str, reserve: int, record: dict, name: str) -> None:
    """Write `record` (under RESERVE_BYTES) over the reserved blocks in place, no new
    block needed, then rename the reserve to `name` (a rename needs no data block; if it
    fails, an exit record stays in ``exit.reserve``, which `rundir.record` reads too)."""
    data = json.dumps(record, sort_keys=True).encode()
    os.pwrite(reserve, data.ljust(RESERVE_BYTES - 1) + b"\n", 0)
    os.fsync(reserve)
    with contextlib.suppress(OSError):
        os.rename(os.path.join(run_dir, rundir.EXIT_RESERVE), os.path.join(run_dir, name))


def write_exit(run_dir: str, reserve: int | None, record: dict) -> None:
    """Write ``exit.json``; when that fails (ENOSPC, EDQUOT, any OSError) the record, with
    ``write_error`` ("no space left on device in RUN_DIR") and ``disk_full``, goes into the reserved blocks of
    ``exit.reserve`` (`_into_reserve`), renamed to ``exit.json`` (``rundir.record`` reads
    either). The exit code is never lost."""
    path = os.path.join(run_dir, "exit.json")
    try:
        atomicfile.write_json(path, record)
    except OSError as e:
        if reserve is None:
            raise
        why = os.strerror(e.errno).lower() if e.errno else str(e)
        record = dict(record, write_error="%s in %s" % (why, run_dir),
                      disk_full=e.errno in (errno.ENOSPC, errno.EDQUOT))
        while len(json.dumps(record, sort_keys=True)) >= RESERVE_BYTES and record["strays"]:
            record["strays"] = record["strays"][: len(record["strays"]) // 2]  # the pids can go
        _into_reserve(run_dir, reserve, record, "exit.json")
    else:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(run_dir, rundir.EXIT_RESERVE))
    if reserve is not None:
        os.close(reserve)


def write_failure(run_dir: str, reserve: int | None, message: str) -> None:
    """``error.json``: why the run did not start (the launch reports it, `runs` lists the
    run as failed with it); into the reserve as `write_exit` does when the disk has no
    room for it. Never raises: this is the last word of a detached process."""
    try:
        rundir.write_error(run_dir, message)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(run_dir, rundir.EXIT_RESERVE))
    except OSError:
        if reserve is not None:  # 600 characters: JSON-escaped, still under RESERVE_BYTES
            with contextlib.suppress(OSError):
                _into_reserve(run_dir, reserve, {"error": message[:600], "at": time.time()}, "error.json")
    if reserve is not None:
        os.close(reserve)


def _kill_unrecorded(child: subprocess.Popen, run_id: str) -> None:
    """SIGKILL a run just started whose manifest could not be written: its process group
    and anything carrying its marker. No process of the run goes on without a record."""
    with contextlib.suppress(OSError):
        os.killpg(child.pid, signal.SIGKILL)
    for pid in _marked_pids(run_id, os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _reaped() -> Iterator[tuple[int, int]]:
    """(pid, wait status) of the child and of every orphan re-parented to the shim, as
    each ends, until none is left."""
    while True:
        try:
            yield os.waitpid(-1, 0)
        except ChildProcessError:
            return


def supervise(run_dir: str, detach: bool = True) -> int:
    """Body of ``shim.py supervise RUN_DIR``: run, record, wait, record the end.
    ``detach=False`` (a Slurm batch job, slurm.py) stays in the foreground and returns
    the run's exit code (128 + signal when a signal ended it): the job's end is the run's."""
    if detach:
        if os.fork():
            os._exit(0)  # first stage: let launch() reap us; the child carries on
        os.setsid()  # the shim leads its own session
    run_dir = os.path.abspath(run_dir)
    reserve = reserve_exit(run_dir)  # before the run can fill the disk
    try:
        req = rundir.read_json(os.path.join(run_dir, "launch.json"))
        if not isinstance(req, dict):
            raise RunnerError("launch.json is missing or unreadable")
        rundir.validate(req.get("name"), req.get("argv"), req.get("cwd"), req.get("env"), None)
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
        log_fd = open_log(log)
        env = dict(os.environ)
        _restore_umask(env.pop(UMASK_ENV, None))  # the login's umask, for the run's files
        env.update(req["env"])
        env[RUN_ENV] = run_id
        kwargs: dict[str, Any] = {}
        if sys.version_info >= (3, 11):
            kwargs["process_group"] = 0
        else:
            kwargs["preexec_fn"] = lambda: os.setpgid(0, 0)
        child = subprocess.Popen(  # the argv, or the restart supervisor that runs it (restart.py)
            restart.command(run_dir, req) or req["argv"],
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
        write_failure(run_dir, reserve, str(e) or type(e).__name__)
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
        "user": rundir.user_name(),
        "pid": child.pid,
        "pgid": st.get("pgid", child.pid),
        "sid": st.get("sid", os.getsid(0)),
        "start_ticks": st.get("start_ticks"),
        "start_time": procfs.start_time(st, btime) if st else time.time(),
        "shim_pid": os.getpid(),
        "shim_start_ticks": me.get("start_ticks"),
        "boot_time": btime,
        "boot_id": procfs.boot_id(),
        "subreaper": subreaper,
        "launched_at": req.get("launched_at"),
        "patch_state": req.get("patch_state"),
        "log": os.path.abspath(log),
    }
    try:  # the last loads of this argv on this host (history.py); never costs the run
        manifest.update(history.expected_load(os.path.dirname(run_dir), run_id, req["argv"], manifest["host"]))
    except Exception:  # noqa: BLE001 - no history is an answer
        manifest.update(expected_load_s=None, expected_load_runs=[])
    path = os.path.join(run_dir, "manifest.json")
    try:
        atomicfile.write_json(path, manifest)
    except OSError as e:  # no room for the record (ENOSPC, EDQUOT): no run goes on unrecorded
        _kill_unrecorded(child, run_id)
        write_failure(run_dir, reserve, "%s; its command was stopped" % rundir.write_failed(e, path))
        for pid, st_ in _reaped():  # after the record: one that escaped the kill cannot hold it back
            if pid == child.pid:
                child.returncode = os.waitstatus_to_exitcode(st_)  # reaped here, not by Popen
        return 1
    stop = threading.Event()  # the pace thread: the run's progress, for clients not watching
    tick = float(os.environ.get("EAGLE3_TUI_PACE_S") or pace.TICK_S)
    recorder = None if os.environ.get("EAGLE3_TUI_TIMELINE") == "0" else timeline.Recorder(
        run_dir, time.time(), run_id, launched_at=manifest.get("launched_at"),  # timeline.jsonl
        sample_s=float(os.environ.get("EAGLE3_TUI_TIMELINE_S") or timeline.SAMPLE_S))
    pacer = threading.Thread(target=pace.follow, daemon=True,
                             args=(run_dir, manifest["log"], stop, tick, manifest.get("pgid"), recorder))
    pacer.start()
    status, main_ended = None, None
    strays: list[int] = []  # descendants still alive when the main process ended
    for pid, st_ in _reaped():
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
    stop.set()
    pacer.join(timeout=10.0)  # its last look, before the end is recorded
    code = sig_name = None
    if status is not None and os.WIFSIGNALED(status):
        sig_name = rundir.signal_name(os.WTERMSIG(status))
    elif status is not None:
        code = os.WEXITSTATUS(status)
    ended = time.time()
    if not detach and restart.resubmitted(run_dir):
        # A Slurm run restarted as a new job (restart.py): this job's end is not the run's.
        if recorder is not None:  # the next job's shim appends to the same timeline
            recorder.event(ended, "resubmitted", code=code, signal=sig_name)
            recorder.release(ended)
            recorder.close()
        if reserve is not None:  # kept for the next job's shim (reserve_exit opens it)
            os.close(reserve)
        return code if code is not None else 128 + (os.WTERMSIG(status) if status is not None else 0)
    if recorder is not None:
        recorder.event(ended, "exit", code=code, signal=sig_name)
        recorder.close()
    write_exit(run_dir, reserve, {
        "exit_code": code,
        "signal": sig_name,
        "ended_at": ended,
        "main_ended_at": main_ended,
        "strays": strays,
        "strays_outlived": bool(strays),
    })
    if detach:
        return 0
    return code if code is not None else 128 + (os.WTERMSIG(status) if status is not None else 0)


def main(args: list[str]) -> int:
    """Command line: ``shim.py supervise RUN_DIR`` (used by launch)."""
    if len(args) == 2 and args[0] == "supervise":
        return supervise(args[1])
    sys.stderr.write("usage: shim.py supervise RUN_DIR\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
