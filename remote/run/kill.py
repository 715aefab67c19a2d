"""Kill a run: find every process of it, escalate SIGINT -> SIGTERM -> SIGKILL, then
wait for its GPU memory to be released. Standard library only; Python 3.9+.

A managed run's processes are found by the run marker (``EAGLE3_TUI_RUN_ID``), by
the process tree under its main process and shim, and by its session and group
while a process verified to be the run's own still holds them. An external run
(``ext-<pid>-<start_ticks>``) is that very process, its tree and the groups that
tree made, and only while its command line still contains the configured match.
A process is signalled only if it is still the one first seen (same start ticks).

Shared with the Slurm path (slurm.py): `RunFinder` (a run's processes on this host),
`gpu_read` (one GPU reading) and the kill's tail, `wait_for_gpus` then `write_killed`.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterable

from remote.base import atomicfile, procfs
from remote.run import adopt, rundir

RUN_ENV, RunnerError = rundir.RUN_ENV, rundir.RunnerError

KILL_WAIT = 10.0  # seconds to wait after SIGKILL (processes in D state die late)
POLL = 0.1
RESCAN_EVERY = 0.3
PROGRESS_EVERY = 0.5

GpuQuery = Callable[[], "list[dict] | None"]  # a string: `X | None` needs 3.10 at runtime
"""Returns ``[{"index": int, "processes": [{"pid": int, "mem": int | None}]}]`` (the
snapshot's gpu shape suffices), or None / raises when no GPU reading is available."""


def _send(pid: int, ticks: int, sig: int) -> bool:
    """Signal pid only if it is still the process first seen (same start_ticks).

    A pidfd opened *before* the start-time check makes this race-free: if the
    check passes, the process was alive all along, so the pidfd names it.
    """
    fd = None
    if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        except OSError:
            fd = None  # kernel older than 5.3: fall back to kill()
    try:
        if not rundir.pid_alive(pid, ticks):
            return False
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if fd is not None:
            os.close(fd)


class RunFinder:
    """Finds the processes of one run by full /proc scans, remembering each one's
    start_ticks at first sight so that a reused PID is never taken for it."""

    def __init__(
        self,
        run_id: str,
        manifest: dict | None,
        ext_root: tuple[int, int] | None,
        ended: bool = False,
    ):
        self.run_id = run_id
        self.m = manifest or {}
        self.ext_root = ext_root
        self.tracked: dict[int, int] = {}  # pid -> start_ticks
        self.env_cache: dict[tuple[int, int], str | None] = {}
        self.never: set[int] = {0, 1, 2, os.getpid()}
        stats = self._stats()
        pid: int | None = os.getpid()
        while pid and pid in stats:  # never signal ourselves or whoever runs us
            self.never.add(pid)
            pid = stats[pid]["ppid"]
        if ext_root is not None and ext_root[0] in stats:
            root = stats[ext_root[0]]
            pid = root["ppid"]
            while pid and pid in stats:  # the matched process's shell and its parents
                self.never.add(pid)
                pid = stats[pid]["ppid"]
            if root["sid"] != ext_root[0]:
                self.never.add(root["sid"])
        same_boot = rundir.same_boot(self.m, procfs.boot_time())
        # Once exit.json exists the shim saw every process of the run end, so the
        # manifest's numbers may name strangers now: only the marker and the tree count.
        self.use_ids = same_boot and not ended
        self.shim = self._valid(stats, "shim_pid", "shim_start_ticks") if same_boot else None
        if self.shim is not None:
            self.never.add(self.shim)  # the shim reaps the run and writes exit.json
        self.main = self._valid(stats, "pid", "start_ticks") if same_boot else None
        self.scan(stats)

    def _valid(self, stats: dict[int, dict], pid_key: str, ticks_key: str) -> int | None:
        pid, ticks = self.m.get(pid_key), self.m.get(ticks_key)
        st = stats.get(pid) if isinstance(pid, int) else None
        ok = st is not None and st["start_ticks"] == ticks and st["state"] not in ("Z", "X")
        return pid if ok else None

    def _ids(self, live: dict[int, dict]) -> tuple[int | None, int | None]:
        """The run's (sid, pgid) when they provably still belong to the run, else None.

        A session or group id outlives its leader while it has members, but once the
        run is over the number may be reused by anyone's session (a nohup job whose
        login shell exited). So an id is trusted only while a process that is
        verified to be the run's own (same start ticks as the manifest) holds it:
        the shim leads the session and the main process leads the group.
        """
        if not self.use_ids:
            return None, None

        def verified(key: str, ticks_key: str) -> dict | None:
            pid, ticks = self.m.get(key), self.m.get(ticks_key)
            st = live.get(pid) if isinstance(pid, int) else None
            return st if st is not None and st["start_ticks"] == ticks else None

        shim, main = verified("shim_pid", "shim_start_ticks"), verified("pid", "start_ticks")
        sid, pgid = self.m.get("sid"), self.m.get("pgid")
        sid = sid if isinstance(sid, int) and sid > 1 else None
        pgid = pgid if isinstance(pgid, int) and pgid > 1 else None
        # The session leader (the shim) alive, or the run's main process still in it.
        sid_ok = sid is not None and (
            (shim is not None and shim["sid"] == sid) or (main is not None and main["sid"] == sid)
        )
        # Every group lives inside one session, so a trusted session vouches for it too.
        pgid_ok = pgid is not None and (
            (main is not None and main["pgid"] == pgid) or (sid_ok and shim is not None)
        )
        return (sid if sid_ok else None), (pgid if pgid_ok else None)

    @staticmethod
    def _stats() -> dict[int, dict]:
        out = {}
        for pid in procfs.list_pids():
            st = procfs.read_stat(pid)
            if st is not None:
                out[pid] = st
        return out

    def _marker(self, pid: int, ticks: int) -> str | None:
        """The run id in the process's environ, only for a process of this user (its real
        uid: a setuid-root program another user starts is owned by root in /proc): another
        user can put any run's id in the environ of their own processes, and a kill by
        root must not take them for the run's (found through the run's tree, they still are)."""
        key = (pid, ticks)
        if key not in self.env_cache:  # a process's initial environ never changes
            self.env_cache[key] = procfs.run_marker(pid, RUN_ENV)  # by the real uid, not /proc's owner
        return self.env_cache[key]

    def scan(self, stats: dict[int, dict] | None = None) -> list[int]:
        """Full /proc scan; returns the pids of the run seen for the first time."""
        stats = self._stats() if stats is None else stats
        live = {p: s for p, s in stats.items() if s["state"] not in ("Z", "X")}
        children: dict[int, list[int]] = {}
        for pid, st in live.items():
            children.setdefault(st["ppid"], []).append(pid)
        found: set[int] = set()
        roots = [p for p, t in self.tracked.items() if p in live and live[p]["start_ticks"] == t]
        if self.ext_root is not None:
            pid, ticks = self.ext_root
            if pid in live and live[pid]["start_ticks"] == ticks:
                roots.append(pid)
            leaders = set(roots)
            for pid, st in live.items():  # a group counts only if our tree made it
                if st["pgid"] in leaders or st["pgid"] in self.tracked:
                    found.add(pid)
        else:
            for p, ticks_key in ((self.main, "start_ticks"), (self.shim, "shim_start_ticks")):
                if p is not None and p in live and live[p]["start_ticks"] == self.m.get(ticks_key):
                    roots.append(p)
            sid, pgid = self._ids(live)  # re-checked each scan: the shim may end meanwhile
            for pid, st in live.items():
                if (
                    (sid is not None and st["sid"] == sid)
                    or (pgid is not None and st["pgid"] == pgid and (sid is None or st["sid"] == sid))
                    or self._marker(pid, st["start_ticks"]) == self.run_id
                ):
                    found.add(pid)
        stack = list(roots)
        while stack:  # descendants, including orphans re-parented to the shim
            pid = stack.pop()
            found.add(pid)
            stack.extend(c for c in children.get(pid, ()) if c not in found)
        new = []
        for pid in sorted(found - self.never):
            if pid not in self.tracked:
                self.tracked[pid] = live[pid]["start_ticks"]
                new.append(pid)
        return new

    def alive(self) -> list[int]:
        return sorted(p for p, t in self.tracked.items() if rundir.pid_alive(p, t))

    def send(self, pid: int, sig: int) -> bool:
        """Signal a process found for the run, only if it is still the one first seen."""
        return _send(pid, self.tracked[pid], sig)


def gpu_read(gpu_query: GpuQuery | None, failed: list[str] | None = None) -> list[dict] | None:
    """One GPU reading, or None without a source or when the reading fails; a failure's
    one-line reason (the exception's text: "nvidia-smi failed: …") goes onto `failed`."""
    if gpu_query is None:
        return None
    try:
        gpus = gpu_query()
    except Exception as e:  # the GPU source is optional; a failed reading is N/A, never "free"
        if failed is not None:
            failed.append(" ".join(str(e).split())[:300] or type(e).__name__)
        return None
    return gpus if isinstance(gpus, list) else None


def unread(freed: dict, failed: list[str]) -> str | None:
    """The kill's note when its GPU source failed (no proof either way), else None: a
    failed reading is said, never taken for "GPUs free"."""
    if freed["gpus_free"] is None and failed:
        return "the GPU-free proof could not be read: %s" % failed[-1]
    return None


def _run_mem(gpu: dict, pids: set[int]) -> tuple[int | None, list[int]]:
    """Memory the run's pids hold on one GPU (None if unknown), and those pids."""
    procs = [p for p in gpu.get("processes") or [] if isinstance(p, dict) and p.get("pid") in pids]
    mems = [p["mem"] for p in procs if isinstance(p.get("mem"), int)]
    mem = sum(mems) if mems or not procs else None
    return mem, sorted(p["pid"] for p in procs)


def _gpu_report(before: list[dict] | None, now: list[dict] | None, pids: set[int]) -> list[dict]:
    prior = {g.get("index"): _run_mem(g, pids)[0] for g in before or [] if isinstance(g, dict)}
    out = []
    for g in now or []:
        if not isinstance(g, dict):
            continue
        mem, holders = _run_mem(g, pids)
        was = prior.get(g.get("index"))
        if not was and not holders:
            continue  # a GPU the run never used
        others = [
            {"pid": p.get("pid"), "mem": p.get("mem")}
            for p in g.get("processes") or []
            if isinstance(p, dict) and p.get("pid") not in pids
        ]
        freed = was - mem if isinstance(was, int) and isinstance(mem, int) else None
        out.append(
            {
                "index": g.get("index"),
                "run_mem_before": was,
                "run_mem": mem,
                "freed": freed,
                "run_pids": holders,
                "other_pids": others,
            }
        )
    return out


Report = Callable[[str, "list[dict] | None"], None]
"""A kill's progress: the stage, and the GPU report now (`_gpu_report`'s shape) or None."""


def wait_for_gpus(finder: RunFinder | None, before: list[dict] | None, gpu_query: GpuQuery | None,
                  gpu_wait: float, report: Report, pids: Iterable[int] = (),
                  first: list[dict] | None = None, stop: Callable[[], bool] | None = None,
                  failed: list[str] | None = None) -> dict:
    """The kill's tail, local and Slurm alike, once the signals are sent: when every
    process of the run is gone, wait up to `gpu_wait` s until no GPU lists one of them
    (`waiting_gpu` progress meanwhile). ``{"remaining", "gpus", "gpus_free"}``:
    gpus_free is None without a GPU reading (`gpu_query` None: no proof here).
    Without a finder (the run is on another node), `pids` are the run's processes
    there and `first` the reading already taken there; `stop()` true ends the wait
    early (the node's agent is gone); `failed` collects why readings failed (`gpu_read`)."""
    remaining = finder.alive() if finder else []
    pids = set(finder.tracked) if finder else set(pids)
    latest = first if first is not None else gpu_read(gpu_query, failed)
    if latest is not None and pids and not remaining:
        report("waiting_gpu", _gpu_report(before, latest, pids))
        last_report = time.monotonic()
        deadline = last_report + max(0.0, gpu_wait)
        while any(_run_mem(g, pids)[1] for g in latest if isinstance(g, dict)):
            if time.monotonic() >= deadline or (stop is not None and stop()):
                break
            time.sleep(0.25)
            latest = gpu_read(gpu_query, failed) or latest
            if time.monotonic() - last_report >= PROGRESS_EVERY:
                report("waiting_gpu", _gpu_report(before, latest, pids))
                last_report = time.monotonic()
    gpus = _gpu_report(before, latest, pids)
    gpus_free = None if latest is None else not any(g["run_pids"] for g in gpus)
    return {"remaining": remaining, "gpus": gpus, "gpus_free": gpus_free}


def write_killed(run_dir: str, result: dict) -> None:
    """Keep the kill's report with the run (killed.json, stamped with the time)."""
    try:
        atomicfile.write_json(os.path.join(run_dir, "killed.json"), dict(result, at=time.time()))
    except OSError:
        pass  # the processes are gone; a read-only run dir must not turn that into an error


def _ext_root(run_id: str, match: str | None) -> tuple[int, int] | None:
    """(pid, start_ticks) of an external run's process; None when it has ended (its
    pid is gone or now names a process that started at another time). Refuses
    unless the process's command line still contains `match`."""
    m = adopt.EXT_ID_RE.fullmatch(run_id)
    if m is None:
        raise RunnerError("no run %s" % json.dumps(run_id[:80]))
    if not match:
        raise RunnerError("cannot kill %s: no match is configured to check it against" % run_id)
    pid, ticks = int(m.group(1)), int(m.group(2))
    st = procfs.read_stat(pid)
    if st is None or st["state"] in ("Z", "X") or st["start_ticks"] != ticks:
        return None
    cmd = procfs.read_cmdline(pid)
    if cmd is None:
        return None
    if match not in " ".join(cmd):
        raise RunnerError(
            "refusing to kill %s: its command line does not contain %s"
            % (run_id, json.dumps(match[:80]))
        )
    if procfs.read_environ_var(pid, RUN_ENV) is not None:
        raise RunnerError("refusing to kill %s: it belongs to a managed run" % run_id)
    return pid, ticks


def kill(
    runs_dir: str,
    run_id: str,
    graces: Iterable[float] = (10.0, 10.0),
    gpu_wait: float = 30.0,
    gpu_query: GpuQuery | None = None,
    progress: Callable[[dict], None] | None = None,
    match: str | None = None,
) -> dict:
    """Stop every process of a run: SIGINT, SIGTERM, then SIGKILL, each after a grace;
    then wait for the run's GPU memory to be released and report what still holds it.

    An external run (``ext-<pid>-<start_ticks>``) is killed only while that very
    process lives and its command line still contains `match`; without a match,
    external kills are refused."""
    try:
        g_int, g_term = (max(0.0, float(g)) for g in graces)
        gpu_wait = max(0.0, float(gpu_wait))
    except (TypeError, ValueError):
        raise RunnerError("graces must be two numbers and gpu_wait a number") from None
    t0 = time.monotonic()
    run_dir: str | None = None
    if isinstance(run_id, str) and run_id.startswith("ext-"):
        root = _ext_root(run_id, match)
        finder = RunFinder(run_id, None, root) if root else None
        if root and finder and root[0] in finder.never:
            raise RunnerError("refusing to kill %s: it runs the agent itself" % run_id)
    else:
        run_dir = rundir.trusted_run_dir(runs_dir, run_id)  # never a planted manifest
        manifest = rundir.read_record(os.path.join(run_dir, "manifest.json"))
        if not isinstance(manifest, dict):
            if not os.path.isfile(os.path.join(run_dir, "launch.json")):
                raise RunnerError("no run %s" % run_id)
            manifest = None  # shim never wrote it: find the run by its marker alone
        ended = os.path.exists(os.path.join(run_dir, "exit.json"))
        finder = RunFinder(run_id, manifest, None, ended=ended)

    def elapsed() -> float:
        return round(time.monotonic() - t0, 3)

    failed: list[str] = []  # why GPU readings failed: the proof then says it could not be read
    before = gpu_read(gpu_query, failed)
    latest = before
    last_report = 0.0

    def report(stage: str, now: list[dict] | None = None) -> None:
        """Progress; `now`: the GPU report, else made from the latest reading."""
        nonlocal last_report
        last_report = time.monotonic()
        if progress is None:
            return
        pids = set(finder.tracked) if finder else set()
        gpus = [
            {"index": g["index"], "run_mem": g["run_mem"]}
            for g in (now if now is not None else _gpu_report(before, latest, pids))
        ]
        try:
            progress(
                {
                    "run_id": run_id,
                    "stage": stage,
                    "alive": finder.alive() if finder else [],
                    "gpus": gpus,
                    "elapsed": elapsed(),
                }
            )
        except Exception:  # a broken progress sink must not abort a kill half-way
            pass

    stages: list[dict] = []
    for sig, wait in (
        (signal.SIGINT, g_int),
        (signal.SIGTERM, g_term),
        (signal.SIGKILL, KILL_WAIT),
    ):
        if finder is None:
            break
        finder.scan()
        alive = finder.alive()
        if not alive:
            break
        sent_to = [p for p in alive if finder.send(p, sig)]
        stages.append({"signal": sig.name, "at": elapsed(), "sent_to": sent_to})
        report(sig.name)
        deadline = time.monotonic() + wait
        last_scan = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(POLL)
            if time.monotonic() - last_scan >= RESCAN_EVERY:
                last_scan = time.monotonic()
                for pid in finder.scan():  # a worker born during the wait
                    if finder.send(pid, sig):
                        sent_to.append(pid)
            if not finder.alive():
                finder.scan()
                if not finder.alive():
                    break
            if time.monotonic() - last_report >= PROGRESS_EVERY:
                latest = gpu_read(gpu_query, failed) if gpu_query else None
                report(sig.name)
    freed = wait_for_gpus(finder, before, gpu_query, gpu_wait, report, failed=failed)
    result = {
        "run_id": run_id,
        "ok": not freed["remaining"] and freed["gpus_free"] is not False,
        "stages": stages,
        **freed,
        "elapsed": elapsed(),
    }
    note = unread(freed, failed)
    if note is not None:
        result["note"] = note
    report("done", freed["gpus"])
    if run_dir is not None and stages:
        write_killed(run_dir, result)
    return result
