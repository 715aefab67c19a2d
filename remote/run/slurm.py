"""Runs through Slurm: submit, state, cancel with escalation, GPU-free proof.

Standard library only; Python 3.9+. A Slurm run lives in the same run dir as any
other (``launch.json``, then the shim's ``manifest.json``, ``output.log``,
``exit.json``) plus ``slurm.json`` (job id, the sbatch argv) and ``job.sbatch``, a
Python batch script that runs the run under the same supervisor shim as a local
launch, in the foreground (the job lasts as long as the run; its exit code is the
run's). Every scheduler call is an argument list, never a shell line.

State: ``squeue --json --states=all`` (PENDING + reason, RUNNING + nodes, ended jobs
for MinJobAge), then ``sacct --json`` when accounting exists, else the run dir's own
records (``exit.json``, ``killed.json``). The kill (scancel escalation and the GPU-free
proof on the job's nodes) is slurmkill.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from typing import Any

from remote.base import atomicfile, procfs
from remote.run import attempts, launch, rundir

RunnerError = rundir.RunnerError
SLURM_FILE = "slurm.json"
SCRIPT = "job.sbatch"
TIMEOUT = 30.0  # seconds any one Slurm command may take
SQUEUE_TTL = 2.0  # seconds one squeue reading serves every listing
CANCEL_WAIT = 60.0  # seconds plain scancel may take (Slurm's KillWait, then SIGKILL)
PENDING = ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD")
ACTIVE = PENDING + ("RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT",
                    "RESIZING")
_TIME_RE = re.compile(r"[0-9]+(-[0-9]+)?(:[0-9]+){0,2}|UNLIMITED|INFINITE")


def call(argv: list[str]) -> subprocess.CompletedProcess:
    """One Slurm command (an argument list); a missing or hung command is a RunnerError."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise RunnerError("%s not found on this host: is Slurm installed here?" % argv[0]) from None
    except subprocess.TimeoutExpired:
        raise RunnerError("%s did not answer within %gs" % (argv[0], TIMEOUT)) from None


def last_line(text: str) -> str:
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    return lines[-1] if lines else "no output"


def is_slurm(run_dir: str) -> bool:
    return os.path.isfile(os.path.join(run_dir, SLURM_FILE))


def is_slurm_run(runs_dir: str, run_id: str) -> bool:
    """Whether run_id names a run submitted through Slurm (never for an external id)."""
    try:
        return is_slurm(rundir.run_path(runs_dir, run_id))
    except RunnerError:
        return False


def check_options(opts: Any) -> dict:
    """The scheduler options of a launch request, checked: partition, gpus, time, sbatch_args."""
    if not isinstance(opts, dict):
        raise RunnerError("scheduler must be an object")
    out: dict = {}
    for key in ("partition", "time"):
        value = opts.get(key)
        if value is not None and (not isinstance(value, str) or not value or "\0" in value):
            raise RunnerError("slurm %s must be a non-empty string" % key)
        out[key] = value
    if out["time"] is not None and not _TIME_RE.fullmatch(out["time"]):
        raise RunnerError("slurm time %r is not a Slurm time (minutes, H:MM:SS, D-HH)" % out["time"])
    gpus = opts.get("gpus")
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0):
        raise RunnerError("slurm gpus must be a whole number >= 0")
    out["gpus"] = gpus
    extra = opts.get("sbatch_args") or []
    if not isinstance(extra, list) or not all(isinstance(a, str) and "\0" not in a for a in extra):
        raise RunnerError("slurm sbatch_args must be a list of strings")
    out["sbatch_args"] = extra
    return out


# ---------------------------------------------------------------- submit


def _script(run_dir: str, python: str) -> str:
    """The batch script: the agent's Python running the shim in the foreground."""
    above = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds the package
    return "\n".join([
        "#!%s -u" % python,
        "# eagle3-tui: run %s under the supervisor shim, as a Slurm batch job" % os.path.basename(run_dir),
        "import sys",
        "sys.path.insert(0, %r)" % above,
        "import os",
        "if os.path.exists(%r):  # killed while this job waited to restart the run"
        % os.path.join(run_dir, "killed.json"),
        "    sys.exit(0)",
        "from remote.run import shim",
        "sys.exit(shim.supervise(%r, detach=False))" % run_dir,
        "",
    ])


def submit(runs_dir: str, name: str | None, argv: list[str], cwd: str, env: dict[str, str],
           opts: Any, patch_state: Any = None, log: str | None = None,
           python: str = sys.executable, restart: Any = None) -> dict:
    """Write the batch script and submit it with ``sbatch --parsable``; the run record.
    ``restart``: the restart policy; the job's supervisor resubmits the run as a new job
    (``resubmit``)."""
    rundir.validate(name, argv, cwd, env, patch_state)
    opts = check_options(opts)
    if log is not None and not isinstance(log, str):
        raise RunnerError("log must be a path or null")
    name = name or rundir.name_from_argv(argv)
    cwd = os.path.abspath(cwd)
    with rundir.launch_lock(runs_dir, "another launch is in progress on this host"):
        for rec in list_runs(runs_dir):
            if rec["state"] in ("running", "pending") and rec.get("name") == name:
                raise RunnerError("run %s named %r is still %s (job %s)"
                                  % (rec["run_id"], name, rec["state"], rec.get("job_id")))
        run_id, run_dir = rundir.new_run_dir(runs_dir)
        request = {"run_id": run_id, "name": name, "argv": argv, "cwd": cwd, "env": env,
                   "patch_state": patch_state, "log": log, "launched_at": time.time(),
                   "scheduler": dict(opts, kind="slurm")}
        if isinstance(restart, dict):
            request["restart"] = restart
        launch.write_request(runs_dir, run_dir, request)  # and its reserves: no room, no job
        script = os.path.join(run_dir, SCRIPT)
        with open(script, "w", encoding="utf-8") as f:
            f.write(_script(run_dir, python))
        os.chmod(script, 0o700)
        sbatch = ["sbatch", "--parsable", "--job-name=e3-%s" % name,
                  "--output=%s" % os.path.join(run_dir, "slurm.out"), "--chdir=%s" % cwd]
        if opts["partition"]:
            sbatch.append("--partition=%s" % opts["partition"])
        if opts["gpus"]:
            sbatch.append("--gpus=%d" % opts["gpus"])
        if opts["time"]:
            sbatch.append("--time=%s" % opts["time"])
        sbatch += opts["sbatch_args"] + [script]
        try:
            done = call(sbatch)
        except RunnerError as e:
            rundir.write_error(run_dir, str(e))
            raise
        job = done.stdout.strip().split(";")[0]
        if done.returncode != 0 or not job.isdigit():
            why = "sbatch failed: %s" % last_line(done.stderr or done.stdout)
            rundir.write_error(run_dir, why)
            raise RunnerError("run %s: %s" % (run_id, why))
        atomicfile.write_json(os.path.join(run_dir, SLURM_FILE),
                                  {"job_id": job, "submitted_at": time.time(), "sbatch": sbatch})
        _SQUEUE.clear()
        return record(run_dir)


def resubmit(run_dir: str, wait: float) -> str:
    """Submit the run's batch script again, as a new job that starts no sooner than
    ``wait`` seconds from now (``sbatch --begin``): a restart of a Slurm run, called by
    the restart supervisor inside the job that failed (restart.py). The wait is spent
    in the queue, not holding the failed job's nodes. ``slurm.json`` then names the new
    job (the run's record follows it) and lists every job of the run. The new job id; a
    slurm.json that cannot be written (a full disk) cancels that job: RunnerError, one line."""
    path = os.path.join(run_dir, SLURM_FILE)
    info = rundir.read_json(path)
    if not isinstance(info, dict) or not isinstance(info.get("sbatch"), list) or not info["sbatch"]:
        raise RunnerError("%s has no sbatch command to resubmit" % path)
    sbatch = [a for a in info["sbatch"] if not str(a).startswith("--begin=")]
    sbatch.insert(len(sbatch) - 1, "--begin=now+%d" % max(0, int(wait + 0.999)))  # before the script
    # The failed job's own Slurm variables, GPUs and run marker stay out of the new job's
    # environment: it gets its own from Slurm and the shim.
    env = {k: v for k, v in os.environ.items()
           if k == "SLURM_CONF" or not (k.startswith(("SLURM_", "SBATCH_")) or k in
                                        ("CUDA_VISIBLE_DEVICES", rundir.RUN_ENV))}
    try:
        done = subprocess.run(sbatch, capture_output=True, text=True, timeout=TIMEOUT,
                              stdin=subprocess.DEVNULL, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RunnerError("sbatch failed: %s" % e) from None
    job = done.stdout.strip().split(";")[0]
    if done.returncode != 0 or not job.isdigit():
        raise RunnerError("sbatch failed: %s" % last_line(done.stderr or done.stdout))
    jobs = [str(j) for j in info.get("jobs") or [info.get("job_id")] if j]
    try:  # no room for it (a full disk): the run would not know its new job, which must not run
        atomicfile.write_json(path, dict(info, job_id=job, submitted_at=time.time(), sbatch=sbatch, jobs=jobs + [job]))
    except OSError as e:
        call(["scancel", job])
        raise RunnerError("%s; Slurm job %s cancelled" % (rundir.write_failed(e, path), job)) from None
    return job


_HOSTNAMES: dict[str, list[str]] = {}  # node list -> its hosts, once expanded


def hostnames(nodes: str) -> list[str]:
    """Every host of a Slurm node list ("gpu[3-4],gpu7" -> gpu3, gpu4, gpu7), by
    ``scontrol show hostnames`` (once per list); a plain name as it is."""
    if "[" not in nodes and "," not in nodes:
        return [nodes]
    if nodes not in _HOSTNAMES:
        try:
            done = call(["scontrol", "show", "hostnames", nodes])
        except RunnerError:
            return [n for n in nodes.split(",") if n]  # asked again next time
        names = done.stdout.split() if done.returncode == 0 else []
        if not names:
            return [n for n in nodes.split(",") if n]
        _HOSTNAMES[nodes] = names
    return list(_HOSTNAMES[nodes])


# ---------------------------------------------------------------- state


def _number(value: Any) -> int | None:
    """An int, or data_parser's number object {set, infinite, number} (v0.0.39+) when
    set; None otherwise (unset, infinite, absent)."""
    if isinstance(value, dict):
        if not value.get("set") or value.get("infinite"):
            return None
        value = value.get("number")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _exit(value: Any) -> tuple[int | None, str | None]:
    """(exit code, signal name) of a Slurm exit_code, in each shape Slurm printed it
    (tests/fixtures/slurm): a wait status, as an int (22.05) or a number object
    (squeue 23.02); or {status, return_code, signal} (sacct 23.02: plain ints;
    23.11+: number objects, where an unset return_code means the job was signalled
    and `signal` is {id: number object, name: "TERM"})."""
    if isinstance(value, dict) and ("return_code" in value or "signal" in value or "status" in value):
        sig = value.get("signal")
        sig_id = _number(sig.get("id", sig.get("signal_id"))) if isinstance(sig, dict) else None
        named = sig.get("name") if isinstance(sig, dict) else None
        name = (rundir.signal_name(sig_id) if sig_id is not None and sig_id > 0 else
                "SIG" + named if isinstance(named, str) and named.isalpha() and named.isupper() else None)
        return _number(value.get("return_code")), name
    status = _number(value)
    if status is not None:
        if status & 0x7F:
            return None, rundir.signal_name(status & 0x7F)
        return status >> 8, None
    return None, None


def _state_name(value: Any) -> str | None:
    if isinstance(value, list):  # 23.02+: a list of flags, the base state first
        value = value[0] if value else None
    if isinstance(value, dict):  # sacct: {"current": ..., "reason": ...}
        value = value.get("current")
    return _state_name(value) if isinstance(value, list) else (value if isinstance(value, str) else None)


_GRES_PART = re.compile(r",(?![^()]*\))")  # commas between gres, not inside "(IDX:0,2)"
_GPUS = re.compile(r"gpu(?::[^:(,]+)?:([0-9]+)")


def node_gpus(detail: Any) -> list[int | None] | None:
    """GPUs the job holds on each of its nodes, from squeue's ``gres_detail`` (one
    entry a node, in the node list's order: "gpu:2(IDX:0-1)", "gpu:a100:1(IDX:3)");
    None when squeue did not say."""
    if not isinstance(detail, list) or not all(isinstance(d, str) for d in detail):
        return None
    out: list[int | None] = []
    for entry in detail:
        counts = [int(m.group(1)) for part in _GRES_PART.split(entry) if (m := _GPUS.match(part.strip()))]
        out.append(sum(counts) if counts else 0)
    return out


_SQUEUE: dict[str, Any] = {}  # "at": monotonic time, "jobs": {job id: info}


def squeue(fresh: bool = False) -> dict[str, dict]:
    """Job id -> {state, reason, nodes, exit_code, signal} of every job squeue knows
    (ended jobs stay for Slurm's MinJobAge); one reading serves SQUEUE_TTL seconds."""
    now = time.monotonic()
    if not fresh and _SQUEUE and now - _SQUEUE["at"] < SQUEUE_TTL:
        return _SQUEUE["jobs"]
    done = call(["squeue", "--json", "--states=all"])
    if done.returncode != 0:
        raise RunnerError("squeue failed: %s" % last_line(done.stderr))
    jobs = parse_squeue(done.stdout)
    _SQUEUE.update(at=now, wall=time.time(), jobs=jobs)
    return jobs


def parse_squeue(text: str) -> dict[str, dict]:
    """``squeue --json`` output -> job id -> {state, reason, nodes, exit_code, signal,
    node_gpus}."""
    try:
        data = json.loads(text)
    except ValueError:
        raise RunnerError("squeue --json printed no JSON (Slurm older than 21.08?)") from None
    jobs = {}
    for j in (data.get("jobs") if isinstance(data, dict) else None) or []:
        if not isinstance(j, dict):
            continue
        code, sig = _exit(j.get("exit_code"))
        jobs[str(j.get("job_id"))] = {"state": _state_name(j.get("job_state")),
                                      "reason": j.get("state_reason"), "nodes": j.get("nodes") or None,
                                      "exit_code": code, "signal": sig,
                                      "node_gpus": node_gpus(j.get("gres_detail"))}
    return jobs


_NO_ACCOUNTING: list[str] = []  # why sacct cannot answer here, once known


def sacct(job: str) -> dict | None:
    """The job's end as accounting recorded it, or None (no accounting: see
    ``accounting_note()``)."""
    if _NO_ACCOUNTING:
        return None
    try:
        done = call(["sacct", "--json", "--jobs=%s" % job])
    except RunnerError as e:
        _NO_ACCOUNTING.append(str(e))
        return None
    if done.returncode != 0:
        _NO_ACCOUNTING.append("sacct: %s" % last_line(done.stderr))
        return None
    return parse_sacct(done.stdout, job)


def parse_sacct(text: str, job: str) -> dict | None:
    """The job's record in ``sacct --json`` output: {state, reason, nodes, exit_code,
    signal, elapsed, ended_at}, or None."""
    try:
        jobs = json.loads(text).get("jobs") or []
    except (ValueError, AttributeError):
        return None
    for j in jobs:
        if str(j.get("job_id")) == job:
            code, sig = _exit(j.get("exit_code"))
            state = _state_name(j.get("state"))
            if state not in ("COMPLETED", None) and code == 0 and sig is None:
                code = None  # sacct says SUCCESS / 0 for a FAILED (22.05) or TIMEOUT (24.05+) job
            times = j.get("time") if isinstance(j.get("time"), dict) else {}
            end = times.get("end")
            return {"state": state, "reason": (j.get("state") or {}).get("reason")
                    if isinstance(j.get("state"), dict) else None,
                    "nodes": j.get("nodes") or None, "exit_code": code, "signal": sig,
                    "elapsed": times.get("elapsed"), "ended_at": end if isinstance(end, int) and end > 0 else None}
    return None


def accounting_note() -> str | None:
    return _NO_ACCOUNTING[0] if _NO_ACCOUNTING else None


def _base(run_dir: str) -> dict:
    """The run's record without Slurm: the shim's manifest when it wrote one, else the
    request (a pending job has no process yet)."""
    rec = rundir.record(run_dir, procfs.boot_time())
    if rec is not None:
        return rec
    req = rundir.read_json(os.path.join(run_dir, "launch.json")) or {}
    rec = rundir.request_record(req)
    rec.update(run_id=os.path.basename(run_dir), state="pending", exit_code=None, signal=None,
               ended_at=None, duration=None, external=False, error=None)
    # Where the shim will write it (as supervise() resolves it), so a client can follow
    # the log from the moment the job starts.
    log = rec.get("log") or os.path.join(run_dir, "output.log")
    rec["log"] = os.path.abspath(os.path.join(rec.get("cwd") or run_dir, os.path.expanduser(log)))
    return rec


def record(run_dir: str, jobs: dict[str, dict] | None = None, squeue_error: str | None = None) -> dict:
    """The run record of a Slurm run: the usual fields, `state` from Slurm (``pending``
    while queued), plus scheduler, job_id, slurm_state, slurm_reason, nodes."""
    info = rundir.read_json(os.path.join(run_dir, SLURM_FILE)) or {}
    job = str(info.get("job_id") or "")
    rec = _base(run_dir)
    rec.update(scheduler="slurm", job_id=job or None, slurm_state=None, slurm_reason=None,
               nodes=None, slurm_note=None)
    if rec["state"] == "failed" or not job:
        return rec  # sbatch refused it: error.json says why
    if jobs is None and squeue_error is None:
        try:
            jobs = squeue()
        except RunnerError as e:
            squeue_error = str(e)
    if jobs is None:  # squeue failed: keep what the run dir says, and say why
        rec["slurm_note"] = squeue_error
        return rec
    found = jobs.get(job)
    submitted = info.get("submitted_at")
    if (found is None and isinstance(submitted, (int, float)) and "wall" in _SQUEUE
            and submitted >= _SQUEUE["wall"] - 1):
        try:  # submitted after that reading (a restart's new job): ask again
            found = squeue(fresh=True).get(job)
        except RunnerError:
            pass
    if found is None:  # gone from squeue (after MinJobAge): accounting, if there is any
        found = sacct(job)
        if found is None:
            rec["slurm_note"] = "job %s is gone from squeue; %s: state from the run dir" % (
                job, accounting_note() or "sacct has no record")
    killed = os.path.exists(os.path.join(run_dir, "killed.json"))
    if found is not None:
        st = found["state"]
        rec.update(slurm_state=st, slurm_reason=None if found["reason"] in (None, "None") else found["reason"],
                   nodes=found["nodes"])
        if found.get("node_gpus"):
            rec["node_gpus"] = found["node_gpus"]  # the job's GPUs on each node, as squeue said
        if st in PENDING:
            rec["state"] = "pending"
            tried = attempts.load(run_dir) or {}  # attempts.json, or its reserve on a full disk
            at = tried.get("restart_at")
            if isinstance(at, (int, float)) and (rec["slurm_reason"] == "BeginTime" or at > time.time()):
                # a restart resubmitted as this job, waiting to begin; the attempts as read here
                rec.update(restart_at=at, restarts=tried.get("restarts") or 0, attempts=tried.get("attempts"),
                           restart_note=tried.get("note"), max_restarts=tried.get("max_restarts"))
        elif st in ACTIVE:
            rec["state"] = "running"
        elif killed or st == "CANCELLED":
            rec["state"] = "killed"
        else:
            rec["state"] = "exited"
        if rec["state"] in ("exited", "killed") and rec["exit_code"] is None and rec["signal"] is None:
            rec["exit_code"], rec["signal"] = found["exit_code"], found["signal"]
        if rec["state"] in ("exited", "killed") and rec["ended_at"] is None:
            rec["ended_at"] = found.get("ended_at") or time.time()  # sacct's end, where it has one
    elif rec["state"] == "pending":  # never started and Slurm forgot it
        rec["state"] = "killed" if killed else "lost"
    return rec


def _slurm_dirs(runs_dir: str) -> list[str]:
    try:
        names = os.listdir(runs_dir)
    except OSError:
        return []
    return [os.path.join(runs_dir, n) for n in names
            if not n.startswith(".") and _ours(os.path.join(runs_dir, n))
            and is_slurm(os.path.join(runs_dir, n))]


def _ours(run_dir: str) -> bool:
    """A run dir that is ours alone (rundir.list_runs warns about the others)."""
    try:
        rundir.trust.check_dir(run_dir)
    except (OSError, rundir.trust.Untrusted):
        return False
    return True


_FINAL: dict[str, dict] = {}  # run dir -> record of a Slurm run that has ended


def overlay(runs: list[dict], runs_dir: str) -> list[dict]:
    """`rundir.list_runs` output with every Slurm run's record from Slurm (pending
    runs, which have no manifest yet, added); newest first. squeue is asked only while
    some Slurm run has not ended."""
    dirs = _slurm_dirs(runs_dir)
    if not dirs:
        return runs
    jobs: dict[str, dict] | None = None
    error: str | None = None
    mine = {}
    for d in dirs:
        rec = _FINAL.get(d)
        if rec is None:
            if jobs is None and error is None:
                try:
                    jobs = squeue()
                except RunnerError as e:
                    error = str(e)
            try:
                rec = record(d, jobs, error)
            except rundir.trust.Untrusted:
                continue  # a planted record: rundir.list_runs warned about it
            if rec["state"] in ("exited", "killed", "failed") and rec.get("slurm_state") not in ACTIVE:
                _FINAL[d] = rec
        mine[rec["run_id"]] = dict(rec)
    out = [r for r in runs if r.get("run_id") not in mine] + list(mine.values())
    out.sort(key=lambda r: (float(r.get("launched_at") or 0), r["run_id"]), reverse=True)
    return out


def forget(run_dir: str) -> None:
    """Read the run's record from Slurm again (a kill just rewrote it)."""
    _FINAL.pop(run_dir, None)


def list_runs(runs_dir: str, warnings: list[str] | None = None) -> list[dict]:
    return overlay(rundir.list_runs(runs_dir, warnings), runs_dir)
