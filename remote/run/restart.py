"""Restarts on the host: ``python restart.py RUN_DIR``, the run's main process when its
launch request carries a restart policy (``launch.json``'s ``restart``, compiled by the
client from eagle3.toml and the one signature table: tui/services/restartpolicy.py).
This is the process work; what the policy decides (root cause, restart or not, the
wait) is remote/run/restartpolicy.py.

The supervisor shim starts this instead of the run's argv (``command``); this process
runs the argv as attempt 1, 2, … in its own process group, with no client connected:

- when an attempt ends it names the root cause from the attempt's part of the log
  (``restartpolicy.Matcher``), reads the attempt's progress (remote/run/pace.py), and asks
  ``restartpolicy.decide``: finished, killed, or restart / not, and why;
- a restart waits ``restartpolicy.delay`` seconds; a SIGINT/SIGTERM/SIGHUP (``kill``)
  during an attempt or the wait ends the run there: kill always wins, nothing starts later;
- with ``on_hang`` = "kill" or "restart" it watches the shim's ``pace.json``: an attempt
  idle (no CPU, GPUs idle) for ``hang_s`` after its load is stopped (SIGINT, SIGTERM,
  SIGKILL after the run's graces), then ended or restarted;
- with ``on_diverge`` / ``on_idle`` = "kill" the same, for an attempt the pace calls
  diverged (remote/run/diverge.py), or idle for ``idle_s`` after its load while its
  processes hold GPU memory (log, CPU and GPUs quiet); every stop the host decides is
  proved as a kill is (the GPUs the attempt held free: ``proof``), and a diverged attempt
  is never restarted (restartpolicy.decide);
- ``attempts.json`` (atomic) keeps ``restarts``, ``attempts`` (started, ended, exit
  code, signal, cause, progress, decision and why) and ``restart_at`` while waiting;
  the run record carries them (rundir.record). On a full disk a write that fails costs
  the run nothing: the record goes to ``attempts.reserve`` with why, and the file is
  tried again until it is written (remote/run/attempts.py);
- a marker line goes into the run's log between attempts (``restartpolicy.MARK``): the
  client's log analysis and the host's pace start afresh there;
- a Slurm run restarts as a new job instead (``Supervisor.resubmit``, slurm.resubmit).

It exits with the last attempt's exit status (dying of its signal when a signal ended
it), so the shim's ``exit.json`` says what the run's end was. Stdlib only, Python 3.9+.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

if not __package__:  # started as a file: docs/architecture.md, "Upload layout and imports"
    _HERE = os.path.dirname(os.path.abspath(__file__))  # off sys.path, for the dir above
    _ABOVE = os.path.dirname(os.path.dirname(_HERE))
    sys.path[:] = [_ABOVE] + [p for p in sys.path if os.path.abspath(p) != _HERE]

from remote.base import atomicfile, procfs, trust
from remote.run import attempts, pace, reserve, rundir
from remote.run.restartpolicy import MARK, Matcher, decide, delay, span

RUN_ENV = rundir.RUN_ENV
ATTEMPTS_FILE = attempts.FILE
SCRIPT = os.path.abspath(__file__)
READ_TAIL = 4 * 1024 * 1024  # bytes of an attempt's log the matcher reads (its end)
POLL = 0.2
PR_SET_CHILD_SUBREAPER = 36


def command(run_dir: str, req: dict, python: str = sys.executable) -> list[str] | None:
    """What the shim starts for this request: this supervisor when it carries a policy,
    else None (the argv itself)."""
    return [python, SCRIPT, run_dir] if isinstance(req.get("restart"), dict) else None


def progress_of(log: str, start: int, inode: Any) -> dict:
    """What the attempt that began at byte ``start`` of the log got to (remote/run/pace.py):
    its phase, its last step's label and, while extracting, its batch number."""
    p = pace.Pace(log, {"log": log, "size": start, "inode": inode})
    p.update(time.time())
    mark = p.mark or []
    batch = mark[1] if len(mark) == 2 and mark[0] == "batch" and isinstance(mark[1], int) else None
    return {"phase": p.phase, "step": p.step, "batch": batch}


# ---------------------------------------------------------------- the supervisor


class Supervisor:
    """Attempts of one run, with no client connected."""

    def __init__(self, run_dir: str, req: dict) -> None:
        self.run_dir = run_dir
        self.run_id = os.path.basename(run_dir)
        self.req = req
        self.policy = req["restart"]
        self.matcher = Matcher(self.policy)
        log = req.get("log") or os.path.join(run_dir, "output.log")
        self.log = os.path.join(req["cwd"], os.path.expanduser(log))
        self.attempts: list[dict] = []
        self.seq, self.next_try = 0, 0.0
        self.unsaved: tuple[float | None, str | None, str | None] | None = None  # a failed save's args
        self.reserve = reserve.open_or_make(run_dir, attempts.RESERVE, attempts.RESERVE_BYTES)  # attempts.py
        self.stop_sig: int | None = None
        self.wake = threading.Event()
        self.child: subprocess.Popen | None = None
        self.gpus: Any = None  # remote/gpus.Gpus, made at the first stop that needs a proof
        self.idle_since: float | None = None  # since when the attempt stopped for idle was idle
        # A Slurm run restarts as a new job (slurm.resubmit), which carries on the attempts
        # of the jobs before it; elsewhere attempts restart in this process.
        sched = req.get("scheduler")
        self.job = (os.environ.get("SLURM_JOB_ID") or None
                    if isinstance(sched, dict) and sched.get("kind") == "slurm" else None)
        if self.job is not None:
            prev = load(run_dir) or {}
            self.seq = prev["seq"] if isinstance(prev.get("seq"), int) else 0
            before = prev.get("attempts")
            self.attempts = [a for a in before if isinstance(a, dict)] if isinstance(before, list) else []
            for a in self.attempts:
                if a.get("ended_at") is None:  # its job died under it (a node lost, a requeue)
                    a.update(ended_at=time.time(), restarted=False, why="its Slurm job ended under it")

    def on_signal(self, num: int, _frame: Any) -> None:
        """A kill (it signals the attempt's processes itself): never start another."""
        self.stop_sig = self.stop_sig or num
        self.wake.set()

    def save(self, restart_at: float | None = None, note: str | None = None,
             next_job: str | None = None) -> None:
        """``attempts.json``, atomically. A write that fails (a full disk) must not end the
        run: the good file stays, the record goes to the reserve with why (attempts.py),
        and `retry` writes the file again once there is room."""
        self.seq += 1
        rec = {"restarts": sum(1 for a in self.attempts if a.get("restarted")),
               "attempts": self.attempts, "restart_at": restart_at, "note": note, "next_job": next_job,
               "max_restarts": self.policy.get("max_restarts"), "on_hang": self.policy.get("on_hang"),
               "policy": self.policy.get("restart"), "seq": self.seq}
        path = os.path.join(self.run_dir, ATTEMPTS_FILE)
        try:
            atomicfile.write_json(path, rec)
            self.unsaved = None
        except OSError as e:
            self.unsaved, self.next_try = (restart_at, note, next_job), time.monotonic() + attempts.RETRY_S
            rec.update(write_error=rundir.write_failed(e, path), disk_full=e.errno in (errno.ENOSPC, errno.EDQUOT))
            if self.reserve is not None:
                with contextlib.suppress(OSError):
                    attempts.into_reserve(self.reserve, rec)

    def retry(self) -> None:
        """Write the record again when the last write failed, every RETRY_S at most."""
        if self.unsaved is not None and time.monotonic() >= self.next_try:
            self.save(*self.unsaved)

    def pause(self, seconds: float) -> None:
        """Wait `seconds`, or until a kill; a record the disk had no room for is tried again."""
        end = time.monotonic() + seconds
        while not self.wake.is_set() and time.monotonic() < end:
            self.wake.wait(max(0.0, min(attempts.RETRY_S, end - time.monotonic())))
            self.retry()

    def say(self, text: str) -> None:
        try:
            os.write(1, (MARK + text + "\n").encode("utf-8", "replace"))
        except OSError:
            pass

    def _log_pos(self) -> tuple[int, Any]:
        try:
            st = os.fstat(1)
            return st.st_size, st.st_ino
        except OSError:
            return 0, None

    def _hung(self, started: float) -> bool:
        """The shim's pace says this attempt has been idle for hang_s after its load."""
        rec = pace.load(self.run_dir) or {}
        since, hang_s = rec.get("idle_since"), float(self.policy.get("hang_s") or 0)
        return (hang_s > 0 and isinstance(since, (int, float)) and since >= started
                and rec.get("phase") in ("loaded", "extracting") and time.time() - since >= hang_s)

    def _judge(self, started: float) -> tuple[str, str] | None:
        """("diverged" | "idle", why) when the shim's pace says this attempt should be
        stopped under ``on_diverge`` / ``on_idle`` = "kill", else None."""
        rec = pace.load(self.run_dir) or {}
        div = rec.get("diverged")
        if self.policy.get("on_diverge") == "kill" and isinstance(div, dict) \
                and float(div.get("at") or 0) >= started:
            return "diverged", "diverged (%s: %s)" % (div.get("id"), div.get("why"))
        idle_s = float(self.policy.get("idle_s") or 0)
        since, grew, now = rec.get("idle_since"), rec.get("grew_at"), time.time()
        if (self.policy.get("on_idle") == "kill" and idle_s > 0 and isinstance(since, (int, float))
                and since >= started and now - since >= idle_s and rec.get("phase") in pace.IDLE_PHASES
                and isinstance(rec.get("held"), int) and rec["held"] > 0
                and not str(rec.get("gpu") or "none").startswith("none")
                and (not isinstance(grew, (int, float)) or now - grew >= idle_s)):
            self.idle_since = float(since)
            return "idle", "idle (its GPUs hold %.1f GiB at ~0 %% utilisation, log and CPU quiet for %s)" % (
                rec["held"] / 1024.0 ** 3, span(idle_s))
        return None

    def _proof(self, before: list[dict] | None, pids: list[int]) -> dict:
        """The GPU-free proof of a stop the host decided (kill.wait_for_gpus, the kill's own
        tail): {"gpus_free": True | False | None (no reading), "gpus", "note"}."""
        from remote.base import gpus
        from remote.run import kill

        if self.gpus is None:
            self.gpus = gpus.Gpus()
        failed: list[str] = []
        query = self.gpus.proof if self.gpus.source else None
        got = kill.wait_for_gpus(None, before, query, float(self.policy.get("gpu_wait") or 30.0),
                                 lambda *_: None, pids=pids, failed=failed)
        note = kill.unread(got, failed) or (None if query else "no GPU source: %s" % self.gpus.error)
        return {"gpus_free": got["gpus_free"], "gpus": got["gpus"], "note": note, "at": time.time()}

    def _reading(self) -> list[dict] | None:
        from remote.base import gpus
        from remote.run import kill

        if self.gpus is None:
            self.gpus = gpus.Gpus()
        return kill.gpu_read(self.gpus.proof if self.gpus.source else None)

    def _others(self) -> list[int]:
        """Live processes of the run other than this supervisor and the shim above it."""
        me, shim = os.getpid(), os.getppid()
        return [p for p in procfs.list_pids() if p not in (me, shim)
                and procfs.run_marker(p, RUN_ENV) == self.run_id  # this user's only (real uid)
                and (procfs.read_stat(p) or {}).get("state") not in (None, "Z", "X")]

    def _reap(self) -> None:
        """Reap orphans re-parented to this subreaper; never the attempt's own process,
        whose status Popen must read."""
        me, keep = os.getpid(), self.child.pid if self.child is not None else None
        for pid in procfs.list_pids():
            if pid != keep and (procfs.read_stat(pid) or {}).get("ppid") == me:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def stop_attempt(self) -> None:
        """SIGINT, SIGTERM, then SIGKILL after the run's graces, to every process of the
        attempt (a hung one, or leftovers of a failed one before the next starts)."""
        graces = list(self.policy.get("graces") or [10.0, 10.0]) + [5.0]
        for num, grace in zip((signal.SIGINT, signal.SIGTERM, signal.SIGKILL), graces):
            left = self._others()
            if not left:
                return
            for pid in left:
                try:
                    os.kill(pid, num)
                except OSError:
                    pass
            deadline = time.monotonic() + float(grace)
            while time.monotonic() < deadline and self._others():
                self._reap()
                time.sleep(POLL)

    def attempt(self, n: int) -> dict:
        start, inode = self._log_pos()
        started = time.time()
        rec: dict[str, Any] = {"n": n, "started_at": started, "log_offset": start}
        if self.job is not None:
            rec["job_id"] = self.job
        self.attempts.append(rec)
        self.save()
        try:
            self.child = subprocess.Popen(self.req["argv"], stdin=subprocess.DEVNULL, close_fds=True)
        except OSError as e:  # the command itself is missing or not executable: no retry helps
            self.say("%d: cannot start the command: %s" % (n, e))
            self.attempts.pop()
            rec.update(ended_at=time.time(), exit_code=127, signal=None, hung=False, killed=False,
                       progress=None, cause={"id": "cannot-start", "title": "cannot start the command",
                                             "class": "deterministic", "line": str(e)[:500]})
            return rec
        rec["pid"] = self.child.pid
        self.save()
        hung, stopped, proof = False, None, None  # stopped: ("diverged" | "idle", why)
        watch_hang = self.policy.get("on_hang") in ("kill", "restart")
        watch = watch_hang or "kill" in (self.policy.get("on_diverge"), self.policy.get("on_idle"))
        next_look = time.monotonic() + 1.0
        while self.child.poll() is None:
            self.wake.wait(POLL)
            self.retry()
            if watch and not hung and stopped is None and self.stop_sig is None and time.monotonic() >= next_look:
                next_look = time.monotonic() + 1.0
                if watch_hang and self._hung(started):
                    hung = True
                    self.say("%d: hung (no CPU or GPU activity for %s after the load): stopping it"
                             % (n, span(float(self.policy.get("hang_s") or 0))))
                    proof = self._stop_proved()
                elif (stopped := self._judge(started)) is not None:
                    self.say("%d: %s: stopping it" % (n, stopped[1]))
                    proof = self._stop_proved()
        code = self.child.returncode
        self.child = None
        self._reap()
        self.attempts.pop()
        div = (pace.load(self.run_dir) or {}).get("diverged")
        div = div if isinstance(div, dict) and float(div.get("at") or 0) >= started else None
        rec.update(ended_at=time.time(), exit_code=code if code >= 0 else None,
                   signal=_signame(-code) if code < 0 else None, hung=hung,
                   killed=self.stop_sig is not None,
                   progress=progress_of(self.log, start, inode),
                   diverged=div is not None, stopped=stopped[0] if stopped else None,
                   stopped_why=stopped[1] if stopped else None, proof=proof,
                   idle_since=self.idle_since if stopped and stopped[0] == "idle" else None)
        rec["cause"] = None if code == 0 and not hung and div is None else self._cause(start)
        if div is not None:  # the divergence the host read is the cause, whatever the log says later
            rec["cause"] = {"id": div.get("id"), "title": "Training diverged: %s" % div.get("why"),
                            "class": "deterministic", "line": str(div.get("line") or "")[:500]}
        return rec

    def _stop_proved(self) -> dict:
        """Stop the attempt (stop_attempt) and prove its GPUs free, as a kill does."""
        pids, before = self._others(), self._reading()
        self.stop_attempt()
        return self._proof(before, pids)

    def resubmit(self, n: int, rec: dict, why: str, wait: float) -> None:
        """Restart a Slurm run as a new job that begins after ``wait`` (slurm.resubmit);
        the job this supervisor runs in then ends. A kill that came meanwhile cancels the
        new job (the kill itself also cancels whatever job slurm.json names by then)."""
        slurm = _slurm()
        try:
            job = slurm.resubmit(self.run_dir, wait)
        except Exception as e:  # sbatch refused or is missing: the run ends here, saying why
            text = " ".join(str(e).split()) or type(e).__name__
            rec.update(restarted=False, restart_at=None, why="not restarted: %s" % text)
            self.save(note=rec["why"])
            self.say("%d ended (%s): %s" % (n, _how(rec), rec["why"]))
            return
        rec["next_job"] = job
        if self.stop_sig is None:
            self.save(restart_at=rec["restart_at"], note=why, next_job=job)
            self.say("%d ended (%s): %s in %s, as Slurm job %s" % (n, _how(rec), why, span(wait), job))
        if self.stop_sig is not None:  # killed while submitting: the new job never runs
            try:
                slurm.call(["scancel", job])  # plain: the job has not begun
            except Exception:
                pass  # the kill cancels it too
            rec.update(restarted=False, restart_at=None, why="killed while waiting to restart")
            self.save(note=rec["why"])
            self.say("%d: killed while waiting to restart; Slurm job %s cancelled" % (n, job))

    def _cause(self, start: int) -> dict | None:
        try:
            data = trust.read_tail(self.log, start, READ_TAIL)
        except (OSError, trust.Untrusted):
            return None
        return self.matcher.root_cause(re.split(r"\r\n|[\r\n]", data.decode("utf-8", "replace")))

    def run(self) -> int:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self.on_signal)
        n, code = len(self.attempts) + 1, 1
        if n > 1:  # a Slurm run's next job: the attempts before it ran in earlier jobs
            self.say("%d/%d starts (Slurm job %s)" % (n, int(self.policy.get("max_restarts", 3)) + 1, self.job))
        while True:
            rec = self.attempt(n)
            restart, why = decide(self.policy, self.attempts, rec, rec["ended_at"])
            if self.stop_sig is not None:
                restart, why = False, "killed"
            rec.update(restarted=restart, why=why)
            self.attempts.append(rec)
            code = rec["exit_code"] if rec["exit_code"] is not None else -_signum(rec["signal"])
            if not restart:
                self.save(note=why)
                if n > 1 or why != "finished":
                    self.say("%d ended (%s): %s" % (n, _how(rec), why))
                break
            self.stop_attempt()  # leftovers of the attempt never overlap the next one
            wait = delay(self.policy, sum(1 for a in self.attempts if a.get("restarted")))
            at = time.time() + wait
            rec["restart_at"] = at
            if self.job is not None:  # a Slurm run: a new job begins after the wait; this one ends
                self.resubmit(n, rec, why, wait)
                break
            self.save(restart_at=at, note=why)
            self.say("%d ended (%s): %s in %s" % (n, _how(rec), why, span(wait)))
            self.pause(wait)
            if self.stop_sig is not None:  # killed while waiting: nothing starts later
                rec.update(restarted=False, why="killed while waiting to restart")
                self.save(note=rec["why"])
                self.say("%d: killed while waiting to restart; no further attempt" % n)
                break
            n += 1
            cap = int(self.policy.get("max_restarts", 3)) + 1
            self.say("%d/%d starts" % (n, cap))
        if self.stop_sig is not None and code == 0:
            code = -self.stop_sig
        if code < 0:  # end as the attempt did: the shim records the same signal
            if -code not in (signal.SIGKILL, signal.SIGSTOP):  # no handler to reset (EINVAL)
                signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
            time.sleep(1.0)
            return 128 - code
        return code


def _how(rec: dict) -> str:
    if rec.get("hung"):
        return "hung"
    if rec.get("stopped"):
        return str(rec["stopped"])
    return "signal %s" % rec["signal"] if rec.get("signal") else "exit %s" % rec.get("exit_code")


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return "SIG%d" % num


def _signum(name: Any) -> int:
    try:
        return int(signal.Signals[str(name)])
    except KeyError:
        return int(signal.SIGKILL)


def resubmitted(run_dir: str) -> bool:
    """Whether a Slurm run goes on as a new job (``Supervisor.resubmit``): the job that
    ends now is not the run's end, so its shim records no exit."""
    rec = load(run_dir) or {}
    return bool(rec.get("next_job")) and rec.get("restart_at") is not None


def _slurm() -> Any:
    """remote/run/slurm.py, imported only when a Slurm run restarts."""
    from remote.run import slurm

    return slurm


def load(run_dir: str) -> dict | None:
    """The run's attempts record (``attempts.json``, or its reserve when the newest went
    there: attempts.load), or None (a run without a policy, or not started)."""
    try:
        return attempts.load(run_dir)
    except trust.Untrusted:
        return None


def _become_subreaper() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except Exception:  # leftovers are still found by their marker
        pass


def main(args: list[str]) -> int:
    if len(args) != 1:
        sys.stderr.write("usage: restart.py RUN_DIR\n")
        return 2
    run_dir = os.path.abspath(args[0])
    try:
        with open(os.path.join(run_dir, "launch.json"), "rb") as f:
            req = json.loads(f.read().decode("utf-8"))
        Matcher(req["restart"])  # a broken policy is said now, not at the first failure
    except (OSError, ValueError, KeyError, TypeError, re.error) as e:
        sys.stderr.write("[eagle3-tui] bad restart policy in launch.json: %s\n" % e)
        return 2
    _become_subreaper()
    return Supervisor(run_dir, req).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
