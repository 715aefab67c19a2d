"""eagle3-tui host agent: JSON lines on stdin/stdout (protocol in docs/architecture.md).

Run as `python3 -u remote/agent/main.py [--runs-dir DIR]`. Standard library only (Python 3.9+);
`pynvml` is used when importable. It samples the host (CPU, memory, GPUs, the
processes that matter), follows logs, reads/writes files atomically and hands run
lifecycle to `remote.run` (`runner`, `kill`; `slurm`, `slurmkill` for Slurm runs). It never
interprets logs. This file holds the request loop; its parts are the other modules of
`remote/agent/` and `remote/base/` (docs/architecture.md, "Host files": which holds what).

Threads: a stdin reader queues requests and pokes a self-pipe; the main loop waits on
that pipe and an inotify fd, answers short requests, follows logs and sends
snapshots; long requests run in worker threads. Each op is declared once, by `@op` on
its handler (remote/base/wire.py): its capability and whether it is long, an action, finished
after the client leaves, in need of the runner. Every stdout line goes through `emit()`,
which holds one lock. When the client goes away (stdin EOF, or stdout broken) the agent
still waits for launches and kills in flight (declared `finish`), so a kill always
completes its escalation and killed.json.

Paths in requests (`runs_dir`, `subscribe`, `read_range`, `file_read`, `file_write`,
launch `cwd`) may start with `~`, expanded on the host; a relative path is relative
to the agent's working directory, which is the remote user's home over SSH.

Env: EAGLE3_TUI_GPU_SOURCE=none|nvml|nvidia-smi forces the GPU source;
EAGLE3_TUI_NO_INOTIFY=1 forces the 0.25 s poll; EAGLE3_TUI_FULL_SCAN=1 reads every
process every tick (only to measure what the cheap scheme saves).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import select
import shutil
import socket
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

if not __package__:  # started as a file: docs/architecture.md, "Upload layout and imports"
    _HERE = os.path.dirname(os.path.abspath(__file__))  # off sys.path, for the dir above
    _ABOVE = os.path.dirname(os.path.dirname(_HERE))
    sys.path[:] = [_ABOVE] + [p for p in sys.path if os.path.abspath(p) != _HERE]
from remote.agent import fileops, journal  # noqa: F401 - fileops declares the file ops (@op)
from remote.agent.follow import Inotify, Sub, holds
from remote.agent.node import Follower
from remote.agent.outcomes import read_outcomes, record_outcome, valid_id
from remote.agent.proctable import ProcTable
from remote.agent.rundelta import RunsSent
from remote.base.gpus import Gpus, host_info
from remote.base.wire import (
    CLIENT_GONE,
    OPS,
    BadRequest,
    arg,
    capabilities,
    emit,
    one_line,
    op,
    user_path,
    user_path_or_none,
)
from remote.run.pace import attach as attach_pace

AGENT_VERSION = "0.1.0"
PROTOCOL = 1
RUN_ENV_FALLBACK = "EAGLE3_TUI_RUN_ID"  # same value as runner.RUN_ENV, used if runner is broken


def load_runner() -> Tuple[Any, Any, Any, Any, Optional[str]]:
    """Import the sibling run modules: (runner, kill, slurm, slurmkill, None), or (None, None,
    None, None, reason). A broken Slurm module only costs Slurm runs (slurm is None then)."""
    try:
        from remote.run import kill, runner
    except Exception as exc:  # SyntaxError, ImportError, anything: the agent must live on
        return None, None, None, None, "runner unavailable: %s" % one_line(exc)
    try:
        from remote.run import slurm, slurmkill
    except Exception:
        return runner, kill, None, None, None
    return runner, kill, slurm, slurmkill, None


class Agent:
    """Owns the state; the main loop in `run()` is the only thread that touches it,
    except workers, which only call runner/GPUs and `emit()`."""

    def __init__(self, runs_dir: Optional[str]) -> None:
        self.runner, self.killer, self.slurm, self.slurm_killer, self.runner_error = load_runner()
        self.nodes = Follower(self)  # a followed Slurm run's node
        self.run_env = getattr(self.runner, "RUN_ENV", RUN_ENV_FALLBACK)
        self.cli_runs_dir = user_path_or_none(runs_dir)
        self.runs_dir = self.cli_runs_dir
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
        self.runs_sent = RunsSent()
        self.next_snap = time.monotonic()
        self.workers: List[threading.Thread] = []  # running ops declared `finish`

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

    def _runs(self, procs: Optional[List[Dict[str, Any]]],
              warnings: Optional[List[str]] = None) -> List[Dict[str, Any]]:
        if self.runner is None:
            return []
        runs = list(self.runner.list_runs(self._runs_dir(), warnings))
        if self.slurm is not None:  # Slurm runs: state from the scheduler, pending ones added
            runs = self.slurm.overlay(runs, self._runs_dir())
        if self.match and procs is not None:
            runs += self.runner.external_runs(self.match, procs)
        attach_pace(runs, self._runs_dir())
        return runs

    def hello(self) -> Dict[str, Any]:
        with open(os.path.abspath(__file__), "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        return {"type": "hello", "protocol": PROTOCOL, "agent_version": AGENT_VERSION,
                "agent_sha": sha, "hostname": socket.gethostname(),
                "python": "%d.%d.%d" % sys.version_info[:3], "pid": os.getpid(),
                "time": time.time(), "gpu_source": self.gpus.source,
                "gpu_error": self.gpus.error, "capabilities": capabilities(self.runner is not None)}

    def _sample(self) -> Tuple[List[Dict[str, Any]], Optional[str], List[Dict[str, Any]],
                               List[Dict[str, Any]], Optional[str]]:
        """One reading of the host: (gpus, gpu_error, processes, runs, runs_error).
        Main thread only (the process table is not shared); records `last_procs`."""
        gpus, gpu_error = self.gpus.read()
        gpu_pids = {p["pid"] for g in gpus for p in g.get("processes") or []}
        live: Dict[str, Dict[int, str]] = {"sid": {}, "pgid": {}}
        runs_error = None
        skipped: List[str] = []  # run dirs and records refused (trust.py): said, never silent
        try:
            runs = self._runs(None, skipped)
        except Exception as exc:
            runs, runs_error = [], str(exc) if type(exc).__name__ == "RunnerError" else one_line(exc)
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
        attach_pace(runs, self._runs_dir())
        runs_error = "; ".join(([runs_error] if runs_error else []) + skipped) or None
        with self.lock:
            self.last_procs = procs
        return gpus, gpu_error, procs, runs, runs_error

    def snapshot(self) -> Dict[str, Any]:
        """One snapshot object (without `type`)."""
        gpus, gpu_error, procs, runs, runs_error = self._sample()
        if runs_error and runs_error != self.runs_error:  # once per distinct fault, not per tick
            emit({"type": "error", "message": "runs: %s" % runs_error})
        self.runs_error = runs_error
        self.seq += 1
        return self.nodes.view({"seq": self.seq, "time": time.time(), "host": host_info(),
                                "gpu_source": self.gpus.source, "gpu_error": gpu_error,
                                "gpus": gpus, "processes": procs, "runs": runs}, self.slurm, self.interval)

    def send_snapshot(self) -> None:
        emit(self.runs_sent.trim({"type": "snapshot", **self.snapshot()}))  # rundelta.py

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
        spec = OPS.get(op)
        if spec is None:
            self.reply(rid, error="unknown op %r" % op)
            return
        action = args.get("action") if spec.action else None
        if action is not None:
            if not valid_id(action) or len(action) > 64:
                self.reply(rid, error="action must be 1-64 letters, digits, '-' or '_'")
                return
            self._record_outcome(action, {"state": "running", "op": op, "started": time.time(),
                                          "run_id": args.get("run_id"), "agent_pid": os.getpid()})
        if spec.long:
            worker = threading.Thread(target=self._call, args=(rid, op, args, action), daemon=True)
            worker.start()
            if spec.finish:
                self.workers = [w for w in self.workers if w.is_alive()] + [worker]
        else:
            self._call(rid, op, args, action)

    def _call(self, rid: int, op: str, args: Dict[str, Any], action: Optional[str]) -> None:
        try:
            if OPS[op].runner:
                self._need_runner()
            result = OPS[op].handler(self, args, rid)
        except Exception as exc:  # the runner's own one-line errors pass through as they are
            plain = isinstance(exc, BadRequest) or type(exc).__name__ in ("RunnerError", "Untrusted")
            error = str(exc) if plain else one_line(exc)
            if action:  # recorded before the reply, so a client that missed it can ask
                self._record_outcome(action, {"state": "done", "ok": False, "error": error})
            self.reply(rid, error=error)
            return
        after = None
        if isinstance(result, tuple):  # (result, callback to run after the reply)
            result, after = result
        if action:
            self._record_outcome(action, {"state": "done", "ok": True, "result": result})
        self.reply(rid, result=result)
        if after:
            try:
                after()
            except Exception as exc:
                emit({"type": "error", "message": "after op_%s: %s" % (op, one_line(exc))})

    # -- action outcomes: RUNS_DIR/.actions/<id>.json (remote/agent/outcomes.py)

    def _actions_dir(self, runs_dir: Optional[str] = None) -> str:
        return os.path.join(user_path(runs_dir) if runs_dir else self._runs_dir(), ".actions")

    def _record_outcome(self, action: str, record: Dict[str, Any]) -> None:
        record_outcome(self._actions_dir(), action, record)

    @staticmethod
    def reply(rid: int, result: Any = None, error: Optional[str] = None) -> None:
        if error is not None:
            emit({"type": "result", "id": rid, "ok": False, "error": error})
        else:
            emit({"type": "result", "id": rid, "ok": True, "result": result})

    @op("snapshot")
    def op_configure(self, args: Dict[str, Any], rid: int) -> Any:
        interval = float(arg(args, "interval", (int, float), self.interval))
        if not 0.05 <= interval <= 3600:
            raise BadRequest("interval must be between 0.05 and 3600 s")
        self.interval = interval
        if "match" in args:
            self.match = arg(args, "match", str, None) or None
        if "runs_dir" in args:
            self.runs_dir = user_path_or_none(arg(args, "runs_dir", str, None)) or self.cli_runs_dir
        self.configured = True
        self.next_snap = time.monotonic() + self.interval
        self.runs_sent.reset()  # its snapshot whole: the client may be new
        return {}, self.send_snapshot

    @op("snapshot")
    def op_snapshot(self, args: Dict[str, Any], rid: int) -> Any:
        # A one-shot client (`status`) asks right after configure's snapshot: wait out the
        # short CPU window (at most 0.2 s) so it gets readings, not the first sample's nulls.
        time.sleep(self.procs.cpu_ready_in())
        return self.snapshot()

    @op("logs")
    def op_subscribe(self, args: Dict[str, Any], rid: int) -> Any:
        name, path = arg(args, "sub", str), arg(args, "path", str)
        offset = arg(args, "offset", int, 0)
        inode = arg(args, "inode", int, None)
        old = self.subs.pop(name, None)
        if old:
            old.close()
        sub = Sub(name, os.path.abspath(user_path(path)))
        info = sub.start(offset, inode)
        self.subs[name] = sub
        self._sync_watches()
        rotated = info.pop("_rotated", False)

        def after() -> None:
            if sub.fd is None:
                sub.reset("missing")
            elif rotated:
                sub.reset("rotated")
            sub.pump()
        return info, after

    @op("logs")
    def op_unsubscribe(self, args: Dict[str, Any], rid: int) -> Any:
        sub = self.subs.pop(arg(args, "sub", str), None)
        if sub:
            sub.close()
        self._sync_watches()
        return {}

    def _sync_watches(self) -> None:
        self.inotify.sync({os.path.dirname(s.path) for s in self.subs.values()})

    @op("files")
    def op_patch_apply(self, args: Dict[str, Any], rid: int) -> Any:
        """A patch push as one transaction (remote/agent/journal.py): every file or none."""
        return journal.apply_request(args)

    @op("runs", long=True, action=True, finish=True, runner=True)
    def op_launch(self, args: Dict[str, Any], rid: int) -> Any:
        runner = self.runner
        scheduler = arg(args, "scheduler", dict, None)
        # argv, env and cwd are checked by rundir.validate on both paths
        where = (self._runs_dir(), arg(args, "name", str, None), arg(args, "argv", list),
                 user_path(arg(args, "cwd", str, "~")), arg(args, "env", dict, {}))
        extra = {"patch_state": args.get("patch_state"), "log": arg(args, "log", str, None),
                 "python": sys.executable, "restart": arg(args, "restart", dict, None)}
        if scheduler is not None and scheduler.get("kind", "local") != "local":
            if scheduler.get("kind") != "slurm":
                raise BadRequest("unknown scheduler %r" % scheduler.get("kind"))
            if self.slurm is None:
                raise BadRequest("the Slurm module of this agent is unavailable")
            return self.slurm.submit(*where, scheduler, **extra)
        return runner.launch(*where, **extra)

    @op("files", long=True)  # long: a hung network mount must not stall the loop
    def op_disk_usage(self, args: Dict[str, Any], rid: int) -> Any:
        """Space on the filesystem of `path` (default: the runs dir), or of its nearest
        existing parent: where a run writes its checkpoints."""
        path = os.path.abspath(user_path(arg(args, "path", str, None) or self._runs_dir()))
        while not os.path.exists(path) and os.path.dirname(path) != path:
            path = os.path.dirname(path)
        total, used, free = shutil.disk_usage(path)
        return {"path": path, "total": total, "used": used, "free": free}

    @op("runs", runner=True)
    def op_runs(self, args: Dict[str, Any], rid: int) -> Any:
        with self.lock:
            procs = self.last_procs
        if self.match and procs is None:
            # A client may ask before any snapshot was taken: scan now, or external
            # runs (found only through the process table) would be missing.
            procs = self._sample()[2]
        warnings: List[str] = []
        return {"runs": self._runs(procs, warnings), "warnings": warnings}

    @op("runs")
    def op_follow_job(self, args: Dict[str, Any], rid: int) -> Any:
        return self.nodes.follow_job(args)

    @op("runs", long=True, runner=True)
    def op_prune(self, args: Dict[str, Any], rid: int) -> Any:
        runner = self.runner
        older, keep = arg(args, "older_than", (int, float), None), arg(args, "keep", int, None)
        if (older is not None and older < 0) or (keep is not None and keep < 0):
            raise BadRequest("prune needs older_than >= 0 and keep >= 0")
        return runner.prune_runs(self._runs_dir(), older, keep, arg(args, "env", dict, None),
                                 bool(arg(args, "dry_run", bool, False)),
                                 lister=self.slurm.list_runs if self.slurm is not None else None)

    @op("kill", long=True, action=True, finish=True, runner=True)
    def op_kill(self, args: Dict[str, Any], rid: int) -> Any:
        graces = arg(args, "graces", list, [10, 10])
        if len(graces) != 2 or not all(isinstance(g, (int, float)) and g >= 0 for g in graces):
            raise BadRequest("graces must be [sigint_s, sigterm_s]")

        def progress(payload: Dict[str, Any]) -> None:
            emit(dict(payload, type="kill_progress", id=rid))

        run_id = arg(args, "run_id", str)
        slurm_run = (self.slurm is not None and not run_id.startswith("ext-")
                     and self.slurm.is_slurm_run(self._runs_dir(), run_id))
        how = {"nodes": self.nodes.for_run(run_id)} if slurm_run else {"match": self.match}  # scancel
        return (self.slurm_killer if slurm_run else self.killer).kill(
            self._runs_dir(), run_id, graces=tuple(graces),
            gpu_wait=arg(args, "gpu_wait", (int, float), 30),
            gpu_query=self.gpus.proof if self.gpus.source else None,  # a failed reading proves nothing
            progress=progress, **how)

    @op("runs")
    def op_outcomes(self, args: Dict[str, Any], rid: int) -> Any:
        """Outcomes of actions by id (remote/agent/outcomes.py)."""
        return read_outcomes(self._actions_dir(arg(args, "runs_dir", str, None)), arg(args, "ids", list))

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

    def _finish(self) -> int:
        """The client is gone: wait for kills and launches in flight (their results
        can no longer be delivered), then exit 0."""
        for worker in self.workers:
            worker.join()
        return 0

    def run(self) -> int:
        recovered = journal.recover()  # before anything else: a push whose agent died
        emit(dict(self.hello(), patch_recovered=recovered))
        if recovered:
            emit({"type": "error", "message": journal.describe(recovered)})
        threading.Thread(target=self._reader, daemon=True).start()
        self.next_snap = time.monotonic()
        behind = False
        last_wake = 0.0
        poll = 1.0 if self.inotify.fd is not None else 0.25
        fds = [self.wake_r] + ([self.inotify.fd] if self.inotify.fd is not None else [])
        while True:
            release, all_held = holds(self.subs.values(), time.monotonic())
            timeout = 0.0 if behind else min(poll, release)
            if self.configured:
                timeout = max(0.0, min(timeout, self.next_snap - time.monotonic()))
            ready, _, _ = select.select(fds[:1] if all_held else fds, [], [], timeout)
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
                    return self._finish()
                if line.strip():
                    self.handle_line(line)
            if CLIENT_GONE.is_set():
                return self._finish()
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
