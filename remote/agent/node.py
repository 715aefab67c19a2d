"""A second agent on a Slurm job's node, inside the job's allocation: started by the
login node's agent (the one the client reaches over SSH) as

    srun --jobid=JOB --overlap --nodelist=NODE -N1 -n1 PYTHON -u .../remote/agent/step.py RUN_ID

(``how = "srun"``, the default: every Slurm lets a job's owner step into the job), or
``ssh -o BatchMode=yes -T -- NODE PYTHON -u .../step.py RUN_ID`` where the site allows ssh to a
node that runs one's job (``how = "ssh"``, pam_slurm_adopt). There it runs the agent
(step.py: main.py's agent with no runner, which samples and answers, and runs nothing) and speaks the
same JSON lines; the login agent (``Follower``) starts one for each node of the job,
keeps each one's latest snapshot, shows those nodes' GPUs and the job's processes in
its own snapshots, and reads the kill's GPU-free proof from each (remote/run/slurmkill.py).
The files are the login agent's own (a shared home), run by the same
Python, as the batch script is. Standard library only; Python 3.9+.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Set

from remote.base import wire

# the node's agent: a program of its own (step.py), so this follower and the agent it
# follows do not import each other
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "step.py")
START_S = 30.0  # seconds the step may take to say hello
MAX_NODES = 16  # node agents one followed job starts at most (its first nodes)


def command(how: str, run_id: str, job: str, node: str, python: str = sys.executable,
            gpus: Optional[int] = None) -> List[str]:
    """The argv that starts the node's agent (an argument list, never a shell line).
    ``gpus``: the job's GPUs on that node (squeue's gres_detail). The step asks for
    them: a one-node step of a job that asked ``--gpus=N`` over several nodes would
    otherwise inherit all N and be refused ("Invalid generic resource"), and where
    Slurm confines devices a step sees only the GPUs it was given."""
    agent = [python, "-u", SCRIPT, run_id]
    if how == "ssh":
        # A node name is Slurm's (squeue's) text, not ours: one like `-oProxyCommand=…`
        # would be an ssh option. `--` ends ssh's options, and a name that starts with
        # `-` is refused outright (no real host is called that).
        if node.startswith("-"):
            raise ValueError("node name %r starts with '-'; not passed to ssh" % node)
        return ["ssh", "-o", "BatchMode=yes", "-T", "--", node] + agent
    gres = ["--gres=gpu:%d" % gpus] if gpus else []
    return ["srun", "--jobid=%s" % job, "--overlap", "--nodelist=%s" % node, "-N1", "-n1",
            "--quiet"] + gres + agent


class NodeAgent:
    """One node agent for one run's job: its latest hello and snapshot, the pids of the
    run it has seen there, and why it is not (or no longer) running."""

    def __init__(self, run_id: str, job: str, node: str, how: str = "srun",
                 interval: float = 1.0, gpus: Optional[int] = None) -> None:
        self.run_id, self.job, self.node, self.how = run_id, job, node, how
        self.hello: Optional[Dict[str, Any]] = None
        self.latest: Optional[Dict[str, Any]] = None
        self.run_pids: Set[int] = set()
        self.error: Optional[str] = None
        self.stderr: List[str] = []
        self.ended = threading.Event()
        self.lock = threading.Lock()
        self.proc: Optional[subprocess.Popen] = None
        try:
            argv = command(how, run_id, job, node, gpus=gpus)
        except ValueError as e:
            self.error = str(e)
            self.ended.set()
            return
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, close_fds=True, start_new_session=True)
        except OSError as e:
            self.proc = None
            self.error = "%s: %s" % (argv[0], e.strerror or e)
            self.ended.set()
            return
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()
        self.send("configure", {"interval": interval})

    def send(self, op: str, args: Dict[str, Any]) -> None:
        try:
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write((json.dumps({"id": 1, "op": op, "args": args}) + "\n").encode())
            self.proc.stdin.flush()
        except (OSError, ValueError, AssertionError):
            pass

    def _read(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        for raw in proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            if msg.get("type") == "hello":
                with self.lock:
                    self.hello = msg
            elif msg.get("type") == "snapshot":
                pids = {p["pid"] for p in msg.get("processes") or []
                        if isinstance(p, dict) and p.get("run_id") == self.run_id and isinstance(p.get("pid"), int)}
                with self.lock:
                    self.latest = msg
                    self.run_pids |= pids
        code = proc.wait()
        time.sleep(0.1)  # the last stderr line, read by the other thread
        with self.lock:
            if self.error is None and self.hello is None:
                why = self.stderr[-1] if self.stderr else "exit status %s" % code
                self.error = "%s ended before it answered: %s" % (self.how, why)
        self.ended.set()

    def _read_err(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stderr is not None
        for raw in proc.stderr:
            line = " ".join(raw.decode("utf-8", "replace").split())[:300]
            if line:
                with self.lock:
                    self.stderr = (self.stderr + [line])[-5:]

    def wait_ready(self, timeout: float = START_S) -> bool:
        """Wait until the first snapshot came (True) or the step ended (False)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and not self.ended.is_set():
            if self.latest is not None:
                return True
            time.sleep(0.05)
        return self.latest is not None

    def step(self) -> str:
        """What the node agent runs in: "srun step 12.0 on node7" / "ssh to node7"."""
        env = (self.hello or {}).get("slurm_step") or {}
        if self.how == "srun" and env.get("step_id") is not None:
            return "srun step %s.%s on %s" % (env.get("job_id"), env.get("step_id"), self.node)
        return "%s to %s" % (self.how, self.node)

    def gpus(self) -> Optional[List[Dict[str, Any]]]:
        """The node's GPUs as its latest snapshot had them (kill's proof), or None when
        that reading failed: an empty list from a failed nvidia-smi proves nothing."""
        with self.lock:
            snap = self.latest
        if not isinstance(snap, dict):
            return None
        gpus = snap.get("gpus")
        ok = isinstance(gpus, list) and snap.get("gpu_source") and not snap.get("gpu_error")
        return gpus if ok else None

    def reading(self, timeout: float) -> Optional[List[Dict[str, Any]]]:
        """A good GPU reading from the node: the latest, else the next within `timeout`."""
        end = time.monotonic() + timeout
        while self.gpus() is None and not self.ended.is_set() and time.monotonic() < end:
            time.sleep(0.1)
        return self.gpus()

    def info(self) -> Dict[str, Any]:
        """Where this node's view comes from (`via`), or why there is none (`error`)."""
        info: Dict[str, Any] = {"run_id": self.run_id, "job_id": self.job, "node": self.node,
                                "how": self.how, "via": self.step(), "error": None}
        with self.lock:
            latest = self.latest
        if self.ended.is_set() or latest is None:
            info["error"] = self.error or ("starting" if not self.ended.is_set() else
                                           "the node agent ended")
        else:
            info["hostname"] = (latest.get("host") or {}).get("hostname") or self.node
        return info

    def shown(self) -> Dict[str, Any]:
        """The node's GPUs and the job's processes there (each naming the node), its GPU
        source and error, from its latest snapshot."""
        with self.lock:
            latest = self.latest or {}
        return {"gpus": [dict(g, node=self.node) for g in latest.get("gpus") or [] if isinstance(g, dict)],
                "processes": [dict(p, node=self.node) for p in latest.get("processes") or []
                              if isinstance(p, dict) and (p.get("run_id") == self.run_id
                                                          or "gpu" in (p.get("why") or []))],
                "gpu_source": latest.get("gpu_source"), "gpu_error": latest.get("gpu_error")}

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()



def merge(snap: Dict[str, Any], agents: List[NodeAgent]) -> None:
    """Show the job's nodes in a login agent's snapshot: `job_nodes` (each node's `via`
    or `error`; `node` is the first, as one-node clients read it) and, when any node
    answers, those nodes' GPUs and the job's processes in place of the login node's,
    each naming its node. No node answering: the login node's view stays."""
    infos = [a.info() for a in agents]
    snap["node"], snap["job_nodes"] = infos[0], infos
    up = [(a, a.shown()) for a, info in zip(agents, infos) if info["error"] is None]
    if not up:
        return
    snap["gpus"] = [g for _, part in up for g in part["gpus"]]
    snap["processes"] = [p for _, part in up for p in part["processes"]]
    errors = ["%s: %s" % (a.node, part["gpu_error"]) for a, part in up if part["gpu_error"]]
    snap["gpu_error"] = (up[0][1]["gpu_error"] if len(agents) == 1 else "; ".join(errors) or None)
    source = next((part["gpu_source"] for _, part in up if part["gpu_source"]), None)
    if source is None:
        snap["gpu_source"] = None
    elif len(agents) == 1:
        snap["gpu_source"] = "%s via %s" % (source, up[0][0].step())
    else:
        snap["gpu_source"] = "%s via %s on %d of %d nodes" % (source, agents[0].how, len(up), len(agents))


class Follower:
    """The login agent's side: the run it was asked to follow (op ``follow_job``), one
    node agent per node of that run's job while it runs (MAX_NODES at most), and each
    node's failure, said once."""

    def __init__(self, agent: Any) -> None:
        self.want: Optional[tuple] = None  # (run id, how)
        self.agents: Dict[str, NodeAgent] = {}  # node name -> its agent, in the job's order
        self.said: Set[tuple] = set()

    def follow_job(self, args: Dict[str, Any]) -> Any:
        """Follow a running Slurm run to its nodes: their GPUs and the job's processes
        then come from agents inside its job (``run_id`` null: stop)."""
        run_id, how = wire.arg(args, "run_id", str, None), wire.arg(args, "how", str, "srun")
        if how not in ("srun", "ssh"):
            raise wire.BadRequest('how must be "srun" or "ssh"')
        self.want, self.said = ((run_id, how) if run_id else None), set()
        if any((a.run_id, a.how) != self.want for a in self.agents.values()):
            self.stop()
        return {}

    def stop(self) -> None:
        agents, self.agents = list(self.agents.values()), {}
        for a in agents:
            a.close()

    def for_run(self, run_id: str) -> List[NodeAgent]:
        """The node agents of run_id's job (the kill reads its proof from them)."""
        return [a for a in self.agents.values() if a.run_id == run_id]

    def view(self, snap: Dict[str, Any], slurm: Any, interval: float) -> Dict[str, Any]:
        """Start, keep or stop the followed run's node agents; show its nodes in `snap`."""
        want = self.want
        run = next((r for r in snap["runs"] if want and r.get("run_id") == want[0]), None) or {}
        job, nodes = run.get("job_id"), run.get("nodes")
        if want is None or run.get("state") != "running":
            self.stop()
            return snap
        if not job or not nodes:  # squeue did not answer this time: keep what runs
            if self.agents:
                merge(snap, list(self.agents.values()))
            return snap
        names = (slurm.hostnames(nodes) if slurm is not None else [nodes])[:MAX_NODES]
        if any(a.job != job for a in self.agents.values()) or list(self.agents) != names:
            self.stop()
            counts = run.get("node_gpus")
            if not isinstance(counts, list) or len(counts) < len(names):
                counts = [None] * len(names)
            self.agents = {n: NodeAgent(want[0], job, n, want[1], interval, gpus=c)
                           for n, c in zip(names, counts)}
        agents = list(self.agents.values())
        merge(snap, agents)
        up = any(info["error"] is None for info in snap["job_nodes"])
        for info in snap["job_nodes"]:
            why = info["error"]
            if why and why != "starting" and (info["node"], why) not in self.said:  # once a node
                self.said.add((info["node"], why))
                rest = ("its GPUs are not shown, the job's other nodes are" if up else
                        "GPUs and processes are this login node's")
                wire.emit({"type": "error", "message": "no agent on %s for job %s (%s): %s; %s"
                           % (info["node"], job, want[1], why, rest)})
        return snap
