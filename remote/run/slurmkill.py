"""The kill of a Slurm run: ``scancel`` escalation, then the GPU-free proof, read on
this node or on each of the job's nodes through its node agent (remote/agent/node.py).

Standard library only; Python 3.9+. ``scancel --signal=TERM --full``, a grace, plain
``scancel``, then on this node whatever of the run is left gets SIGKILL and the GPUs
are polled until no process of the run holds memory. A job on other nodes gets its
proof from the agents inside the job, one per node: each node's GPUs before and after,
and a node whose agent never answered says so (the kill's `gpus_free` is then None
unless another node shows the run's memory still held).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any, Callable

from remote.run import kill as killer
from remote.run import rundir, slurm

RunnerError = rundir.RunnerError


def _proof(nodes: list, before: dict, gpu_wait: float, report: Callable) -> list[dict]:
    """Wait for every node's GPUs at once (each within `gpu_wait`); one result a node, in
    the nodes' order: wait_for_gpus's fields plus `node` and `via`."""
    out: list[dict] = [{} for _ in nodes]

    def one(i: int, node: Any) -> None:
        freed = killer.wait_for_gpus(None, before[node.node], node.gpus, gpu_wait, report,
                                     pids=node.run_pids, first=node.reading(gpu_wait),
                                     stop=node.ended.is_set)
        if freed["gpus_free"] is False and node.ended.is_set():
            freed["gpus_free"] = None  # its step ended (Slurm's SIGKILL) before it saw the memory go
        out[i] = dict(freed, node=node.node, via=node.step())

    threads = [threading.Thread(target=one, args=(i, n), daemon=True) for i, n in enumerate(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _on_nodes(proofs: list[dict], unreached: list[Any]) -> dict:
    """The kill's GPU fields from every node's proof: each GPU named by its node, free
    only when every node proved it, NOT free when any node still shows the run."""
    frees = [p["gpus_free"] for p in proofs] + [None for _ in unreached]
    free = False if False in frees else True if frees and all(frees) else None
    gpus = [dict(g, node=p["node"]) for p in proofs for g in p["gpus"]]
    per_node = [{"node": p["node"], "via": p["via"], "gpus_free": p["gpus_free"], "error": None}
                for p in proofs]
    per_node += [{"node": n.node, "via": n.step(), "gpus_free": None,
                  "error": n.error or "no GPU reading from its agent"} for n in unreached]
    return {"remaining": [], "gpus": gpus, "gpus_free": free, "node_proofs": per_node}


def _note(proofs: list[dict], unreached: list[Any]) -> str:
    if len(proofs) == 1 and not unreached:
        p = proofs[0]
        if p["gpus_free"] is None:
            return "the agent on %s ended before the run's GPU memory was seen freed" % p["node"]
        return "GPU proof read through %s" % p["via"]
    text = "GPU proof read on %d of %d nodes" % (len(proofs), len(proofs) + len(unreached))
    lost = ["%s (%s)" % (n.node, n.error or "no GPU reading") for n in unreached]
    return text + ("; none from " + ", ".join(lost) if lost else "")


def kill(runs_dir: str, run_id: str, graces: Any = (10.0, 10.0), gpu_wait: float = 30.0,
         gpu_query: Any = None, progress: Callable[[dict], None] | None = None,
         nodes: Any = None) -> dict:
    """``scancel --signal=TERM --full``, wait the grace, plain ``scancel``, wait for the
    job to leave Slurm's active states; then SIGKILL whatever of the run is still on
    this node and wait until no GPU lists a process of it (the same proof as a local
    kill). ``nodes``: the agents inside the job, one per node (remote/agent/node.py);
    the proof is then read on each, from the last snapshot it sent before its step
    ended, and `node_proofs` says each node's verdict; a job on this host whose GPUs
    `gpu_query` reads is proven here instead. Without either, a job on another node
    gets no proof: `gpus_free` is None there."""
    run_dir = rundir.trusted_run_dir(runs_dir, run_id)
    if not slurm.is_slurm(run_dir):
        raise RunnerError("run %s is not a Slurm run" % run_id)
    g_term = sum(max(0.0, float(g)) for g in graces)
    t0 = time.monotonic()
    rec = slurm.record(run_dir, slurm.squeue(fresh=True))
    job = rec["job_id"]
    manifest = rundir.read_record(os.path.join(run_dir, "manifest.json"))
    # A job on this very host whose GPUs this agent reads: the proof is read here, by an
    # agent that outlives the job (a node agent ends with the job it lives in).
    local = (isinstance(manifest, dict) and manifest.get("host") == socket.gethostname()
             and gpu_query is not None and len(list(nodes or [])) <= 1)  # one node: this one
    agents = list(nodes or []) if rec["state"] == "running" and not local else []
    start = time.monotonic() + 10.0  # one deadline for all (they started together): ready, then a reading

    def left() -> float:
        return max(0.0, start - time.monotonic())

    ready = [n for n in agents if n.wait_ready(left())]
    before = {n.node: n.reading(left()) for n in ready}
    ready = [n for n in ready if before[n.node] is not None]
    unreached = [n for n in agents if n not in ready]
    on_node = bool(ready)
    here = not on_node and isinstance(manifest, dict) and manifest.get("host") == socket.gethostname()
    finder = killer.RunFinder(run_id, manifest if here else None, None) if here else None
    if finder is not None:
        finder.scan()
    failed: list[str] = []  # why a reading here failed: the proof then says it could not be read
    before_here = killer.gpu_read(gpu_query, failed) if here else None
    stages: list[dict] = []

    def elapsed() -> float:
        return round(time.monotonic() - t0, 3)

    def report(stage: str, _gpus: Any = None) -> None:
        if progress is not None:
            try:
                progress({"run_id": run_id, "stage": stage, "job_id": job, "gpus": [],
                          "alive": finder.alive() if finder else [], "elapsed": elapsed()})
            except Exception:  # a broken progress sink must not abort a kill half-way
                pass

    def active() -> str | None:
        st = (slurm.squeue(fresh=True).get(job) or {}).get("state")
        return st if st in slurm.ACTIVE else None

    def scancel(argv: list[str], what: str) -> None:
        done = slurm.call(argv)
        if done.returncode != 0:
            raise RunnerError("%s %s failed: %s" % (what, job, slurm.last_line(done.stderr)))

    def wait_gone(seconds: float, also: Callable[[], bool] = lambda: True) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and active() and also():
            time.sleep(0.2)

    if rec["state"] == "running":
        stages.append({"signal": "scancel --signal=TERM", "at": elapsed(), "job_id": job})
        scancel(["scancel", "--signal=TERM", "--full", job], "scancel --signal=TERM")
        report("scancel --signal=TERM")
        wait_gone(g_term, lambda: finder is None or bool(finder.alive()))
    if active():
        stages.append({"signal": "scancel", "at": elapsed(), "job_id": job})
        scancel(["scancel", job], "scancel")
        report("scancel")
        wait_gone(slurm.CANCEL_WAIT)
    newer = str((rundir.read_json(os.path.join(run_dir, slurm.SLURM_FILE)) or {}).get("job_id") or "")
    if newer and newer != job:  # the run restarted as a new job meanwhile: that one goes too
        job = newer
        if active():
            stages.append({"signal": "scancel", "at": elapsed(), "job_id": job})
            slurm.call(["scancel", job])
            wait_gone(slurm.CANCEL_WAIT)
    if finder is not None:  # anything of the run Slurm did not track (escaped the job)
        finder.scan()
        for pid in finder.alive():
            finder.send(pid, signal.SIGKILL)
        end = time.monotonic() + killer.KILL_WAIT
        while finder.alive() and time.monotonic() < end:
            time.sleep(0.1)
    proofs: list[dict] = []
    if on_node:
        proofs = _proof(ready, before, float(gpu_wait), report)
        freed = _on_nodes(proofs, unreached)
    else:
        freed = killer.wait_for_gpus(finder, before_here, gpu_query if here else None, float(gpu_wait), report,
                                     failed=failed)
    still = active()
    final = slurm.record(run_dir, slurm.squeue(fresh=True))
    result = {"run_id": run_id, "job_id": job,
              "ok": not freed["remaining"] and not still and freed["gpus_free"] is not False,
              "stages": stages, **freed,
              "slurm_state": final.get("slurm_state"), "nodes": final.get("nodes") or rec.get("nodes"),
              "elapsed": elapsed()}
    unread = killer.unread(freed, failed)  # this host's GPU source failed: no proof either way
    if rec["state"] == "pending" and rec.get("restart_at") is not None:
        result["note"] = "job %s was waiting to restart the run: cancelled, nothing starts later" % job
    elif rec["state"] == "pending":
        result["note"] = "job %s was still pending: no process of it ever ran" % job
    elif on_node:
        result["note"] = _note(proofs, unreached)
    elif here and unread is not None:
        result["note"] = unread
    elif not here and rec.get("nodes"):
        result["note"] = "GPU proof needs the agent on %s (this is %s)" % (rec["nodes"], socket.gethostname())
    report("done")
    if stages:
        killer.write_killed(run_dir, result)
        slurm.forget(run_dir)
    return result
