"""Launch a run on the host: allocate its run directory, write the request, start the
supervisor shim (``shim.py``) detached, and wait for its manifest. No room for the
request or the records' reserves (a full disk, a quota) fails the launch in one line
before anything starts (`write_request`). Standard library only; Python 3.9+."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from typing import Any

from remote.base import atomicfile, procfs
from remote.run import attempts, reserve, rundir

RUN_ENV, RunnerError = rundir.RUN_ENV, rundir.RunnerError

LAUNCH_WAIT = 10.0  # seconds launch() waits for the shim's manifest
SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim.py")


def write_request(runs_dir: str, run_dir: str, request: dict) -> None:
    """``launch.json`` and the records' reserves: ``exit.reserve``, and with a restart
    policy ``attempts.reserve`` (remote/run/attempts.py). No room for them (ENOSPC,
    EDQUOT): no run. What was written and the run dir are removed, and RunnerError says
    so in one line. Slurm's submit writes its run's the same way (slurm.py)."""
    made = [("launch.json", None), (rundir.EXIT_RESERVE, rundir.RESERVE_BYTES)]
    if request.get("restart") is not None:
        made.append((attempts.RESERVE, attempts.RESERVE_BYTES))
    done: list[str] = []
    try:
        for name, size in made:
            if size is None:
                atomicfile.write_json(os.path.join(run_dir, name), request)
            else:
                os.close(reserve.make(run_dir, name, size))
            done.append(name)
    except OSError as e:
        for gone in done:  # nothing started: no run dir is left either
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(run_dir, gone))
        with contextlib.suppress(OSError):
            os.rmdir(run_dir)
        why = rundir.write_failed(e, runs_dir, "in")  # the runs dir: the run's own is gone
        raise RunnerError("cannot launch: %s (writing the run's %s; nothing was started)"
                          % (why, made[len(done)][0])) from None


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
    restart: dict | None = None,
) -> dict:
    """Start argv under a detached supervisor shim and return its run record.
    ``restart``: the client's compiled restart policy (restart.py), kept in launch.json."""
    rundir.validate(name, argv, cwd, env, patch_state)
    if restart is not None and not isinstance(restart, dict):
        raise RunnerError("restart must be a policy object or null")
    if log is not None and not isinstance(log, str):
        raise RunnerError("log must be a path or null")
    name = name or rundir.name_from_argv(argv)
    cwd = os.path.abspath(cwd)
    with rundir.launch_lock(runs_dir, "another launch is in progress on this host"):
        if not allow_concurrent:
            for rec in rundir.list_runs(runs_dir):
                if rec["state"] == "running" and rec.get("name") == name:
                    raise RunnerError(
                        "run %s named %r is still running (pid %s)"
                        % (rec["run_id"], name, rec.get("pid"))
                    )
        run_id, run_dir = rundir.new_run_dir(runs_dir)
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
        if restart is not None:
            request["restart"] = restart
        write_request(runs_dir, run_dir, request)
        shim_env = dict(os.environ)
        shim_env[RUN_ENV] = run_id  # marks the shim too, so snapshots attribute it
        try:
            first = subprocess.Popen(
                [python, SHIM, "supervise", run_dir],
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
            with contextlib.suppress(OSError):  # a full disk: the line below still says why
                rundir.write_error(run_dir, "cannot start the supervisor: %s" % e)
            raise RunnerError("cannot start the supervisor: %s" % e) from None
        deadline = time.monotonic() + LAUNCH_WAIT
        while time.monotonic() < deadline:
            started = rundir.record(run_dir, procfs.boot_time())
            if started is not None and started["state"] != "failed":
                return started
            if started is not None:
                raise RunnerError("run %s did not start: %s" % (run_id, started["error"]))
            time.sleep(0.02)
        # Listed as failed from now on; a manifest written late still wins over this.
        with contextlib.suppress(OSError):
            rundir.write_error(run_dir, "the supervisor wrote no manifest within %gs" % LAUNCH_WAIT)
        raise RunnerError(
            "run %s: the supervisor wrote no manifest within %gs" % (run_id, LAUNCH_WAIT)
        )


