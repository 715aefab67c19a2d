"""Slurm as the engine: a real single-node cluster (tests/slurm.py) driven through the
real agent's ops — submit, pending with its reason, running on its node, kill with
scancel escalation and the GPU-free proof, a failed job's exit code, resubmission.

One stand-in: the GPU. Off the GPU machine a fake `nvidia-smi` (the agent's second GPU
source) reports that every process started with HOLDS_GPU=1 in its environment holds
1 GiB on GPU 0 while it lives, read from /proc, so the proof sees real processes go.
Slurm's own GPUs are faked by gres.conf. The job's node has its own stand-in
(tests/slurm.py NODE_SMI, on PATH inside jobs only), so a reading through the node
agent's `srun --overlap` step is told from the login agent's. Packages missing: the tier
fails with one line.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from remote.run import slurm
from tests import checkout
from tests.agent_driver import AgentProc
from tests.slurm import LINES, NODE_SMI, Cluster
from tui.protocol.ops import KillReport
from tui.protocol.records import RunRecord
from tui.services import timeline
from tui.state import view

REPO = Path(__file__).resolve().parent.parent
PYTHONPATH = checkout.pythonpath()
GIB = 1 << 30
FAKE_SMI = NODE_SMI  # the login node's stand-in GPU: the same script, outside any job
# A run that ignores SIGTERM (a wedged worker): only plain scancel's SIGKILL ends it.
STUBBORN = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('up', flush=True)\ntime.sleep(600)\n")
SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"


def say(line: str) -> None:
    LINES.append(line)
    print("slurm tier: " + line)


T = TypeVar("T")


def wait_for(pred: Callable[[], T | None], timeout: float, what: str) -> T:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError("timed out after %gs waiting for %s" % (timeout, what))


@pytest.fixture()
def agent(slurm_cluster: Cluster, tmp_path: Path):
    cluster = slurm_cluster
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable))
    smi.chmod(0o755)
    env = dict(cluster.env, EAGLE3_TUI_GPU_SOURCE="nvidia-smi",
               PATH="%s:%s" % (bindir, cluster.env.get("PATH", "/usr/bin:/bin")))
    with AgentProc(env=env) as a:
        a.call("configure", {"interval": 0.5, "runs_dir": str(tmp_path / "runs")})
        a.tmp = tmp_path  # type: ignore[attr-defined]
        yield a


def launch(a: AgentProc, name: str, script: str, gpus: int = 2, **extra: object) -> dict:
    sched = {"kind": "slurm", "partition": "debug", "gpus": gpus, "time": "10", "sbatch_args": []}
    sched.update(extra)
    return a.call("launch", {"name": name, "argv": [sys.executable, "-u", "-c", script],
                             "cwd": str(a.tmp), "env": {"HOLDS_GPU": "1"},  # type: ignore[attr-defined]
                             "scheduler": sched})


def run_of(a: AgentProc, run_id: str) -> dict:
    return next(r for r in a.call("runs")["runs"] if r["run_id"] == run_id)


def in_state(a: AgentProc, run_id: str, state: str) -> Callable[[], dict | None]:
    def check() -> dict | None:
        rec = run_of(a, run_id)
        return rec if rec["state"] == state else None
    return check


def with_pid(a: AgentProc, run_id: str) -> Callable[[], dict | None]:
    """The run's record once the shim's manifest gave it its pid."""
    def check() -> dict | None:
        rec = run_of(a, run_id)
        return rec if rec.get("pid") is not None else None
    return check


def test_submit_pending_running_kill_gpus_free(agent: AgentProc) -> None:
    first = launch(agent, "first", STUBBORN)
    assert first["scheduler"] == "slurm" and first["job_id"].isdigit()
    say("submit: run %s is job %s (sbatch --parsable)" % (first["run_id"], first["job_id"]))
    second = launch(agent, "second", SLEEPER)  # wants the same 2 GPUs: must wait
    a = wait_for(in_state(agent, first["run_id"], "running"), 30, "the first job to run")
    assert a["slurm_state"] == "RUNNING" and a["nodes"] == "e3node"
    def waits_for_resources() -> dict | None:
        rec = run_of(agent, second["run_id"])
        return rec if rec.get("slurm_reason") == "Resources" else None

    b = wait_for(waits_for_resources, 30, "the second job to pend for Resources")
    assert b["state"] == "pending" and b["slurm_state"] == "PENDING" and b["pid"] is None
    # What the runs table and `eagle3-tui runs` show, from these very records.
    assert view.slurm_label(RunRecord.parse(b)) == "job %s PENDING (Resources)" % b["job_id"]
    assert view.slurm_label(RunRecord.parse(a)) == "job %s RUNNING on e3node" % a["job_id"]
    assert RunRecord.parse(b).alive and view.state_label(RunRecord.parse(b)) == "pending"
    say("pending: %s while job %s holds the node's GPUs"
        % (view.slurm_label(RunRecord.parse(b)), a["job_id"]))
    say("running: " + view.slurm_label(RunRecord.parse(a)))
    wait_for(lambda: Path(run_of(agent, first["run_id"])["log"]).read_text().startswith("up") or None,
             20, "the run's first line")
    a = wait_for(with_pid(agent, first["run_id"]), 20, "the run's manifest")  # RUNNING may come first
    snap = agent.call("snapshot")
    held = [p for g in snap["gpus"] for p in g["processes"]]
    assert any(p["pid"] == a["pid"] and p["mem"] == GIB for p in held), held

    marks = agent.mark()
    report = agent.call("kill", {"run_id": first["run_id"], "graces": [1, 1], "gpu_wait": 10},
                        timeout=120)
    stages = [s["signal"] for s in report["stages"]]
    assert stages == ["scancel --signal=TERM", "scancel"], report  # it ignored SIGTERM
    assert report["ok"] and report["remaining"] == [] and report["gpus_free"] is True
    (gpu,) = report["gpus"]
    assert gpu["run_mem_before"] == GIB and gpu["run_mem"] == 0 and gpu["freed"] == GIB
    progress = [m["stage"] for m in agent.messages[marks:] if m.get("type") == "kill_progress"]
    assert "scancel" in progress and progress[-1] == "done"
    say("kill: job %s: %s, %.1fs" % (a["job_id"], " -> ".join(stages), report["elapsed"]))
    say("GPUs free: GPU %d held %d MiB by the run before, %d after (stand-in nvidia-smi)"
        % (gpu["index"], gpu["run_mem_before"] >> 20, gpu["run_mem"] >> 20))
    gone = wait_for(in_state(agent, first["run_id"], "killed"), 20, "the killed run")
    assert gone["slurm_state"] in ("CANCELLED", "FAILED", "COMPLETED")

    b = wait_for(in_state(agent, second["run_id"], "running"), 30, "the second job to start")
    say("the waiting job %s now RUNNING on %s" % (b["job_id"], b["nodes"]))
    report = agent.call("kill", {"run_id": second["run_id"], "graces": [5, 5], "gpu_wait": 10},
                        timeout=120)
    assert [s["signal"] for s in report["stages"]] == ["scancel --signal=TERM"], report
    assert report["ok"] and report["gpus_free"] is True


def test_failed_job_shows_exit_code_and_pending_kill(agent: AgentProc, slurm_cluster: Cluster,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    rec = launch(agent, "fails", "import sys\nprint('boom', flush=True)\nsys.exit(3)\n", gpus=1)
    done = wait_for(in_state(agent, rec["run_id"], "exited"), 30, "the failing job to end")
    assert done["exit_code"] == 3 and done["slurm_state"] == "FAILED", done
    shown = view.run_row(RunRecord.parse(done), "", time.time())
    assert shown.state == "failed" and shown.exit == "3"
    assert shown.job == "job %s FAILED exit 3" % done["job_id"]
    say("failed: " + shown.job)
    # Once squeue has forgotten the job (after MinJobAge) and there is no accounting
    # (no slurmdbd here), the run dir's own exit record decides, and the record says so.
    run_dir = str(agent.tmp / "runs" / rec["run_id"])  # type: ignore[attr-defined]
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    forgotten = slurm.record(run_dir, jobs={})
    assert forgotten["state"] == "exited" and forgotten["exit_code"] == 3
    assert forgotten["slurm_state"] is None
    assert "accounting storage is disabled" in forgotten["slurm_note"], forgotten
    say("gone from squeue, no sacct: " + forgotten["slurm_note"])
    # A job that can never run (more GPUs than the node has) stays pending; kill cancels it.
    never = launch(agent, "never", SLEEPER, gpus=2, sbatch_args=["--nodes=1", "--hold"])
    pend = wait_for(in_state(agent, never["run_id"], "pending"), 10, "the held job")
    assert pend["slurm_reason"] in ("JobHeldUser", "JobHeldAdmin"), pend
    pruned = agent.call("prune", {"older_than": 0, "dry_run": True})  # a queued job is live
    assert [r["run_id"] for r in pruned["removed"]] == [rec["run_id"]], pruned
    report = agent.call("kill", {"run_id": never["run_id"], "graces": [1, 1]}, timeout=60)
    assert [s["signal"] for s in report["stages"]] == ["scancel"] and report["ok"], report
    assert report["gpus_free"] is None and "still pending" in view.kill_verdict(KillReport.parse(report))
    assert wait_for(in_state(agent, never["run_id"], "killed"), 10, "the cancelled job")


def test_a_run_a_signal_ended_ends_its_job_with_128_plus_the_signal(agent: AgentProc, slurm_cluster: Cluster,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch job's end is the run's: a run the kernel killed (the OOM killer's SIGKILL)
    ends its job with 128 + 9, as a shell would say, so Slurm's own record (squeue, sacct,
    a dependency, the job's mail) tells the kill apart from a plain failure."""
    rec = launch(agent, "oom", "import os, signal\nprint('up', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n",
                 gpus=0)
    done = wait_for(lambda: (lambda r: r if r["state"] != "pending" and r["slurm_state"] not in (
        "PENDING", "RUNNING", "CONFIGURING", "COMPLETING") else None)(run_of(agent, rec["run_id"])),
        30, "the killed job to end")
    assert done["signal"] == "SIGKILL" and done["exit_code"] is None, done  # the run dir's record
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    job = slurm.squeue(fresh=True)[done["job_id"]]
    assert (job["state"], job["exit_code"], job["signal"]) == ("FAILED", 128 + 9, None), job
    say("a run SIGKILL ended: its job %s FAILED exit %s" % (done["job_id"], job["exit_code"]))


def test_relaunch_resubmits_and_sbatch_errors_are_one_line(agent: AgentProc) -> None:
    rec = launch(agent, "again", "print('once')\n", gpus=0)
    first = wait_for(in_state(agent, rec["run_id"], "exited"), 30, "the job to end")
    assert first["exit_code"] == 0 and first["slurm_state"] == "COMPLETED"
    again = launch(agent, "again", "print('once')\n", gpus=0)
    assert again["run_id"] != rec["run_id"] and again["job_id"] != rec["job_id"]
    say("relaunch: run %s resubmitted as job %s (was job %s)"
        % (again["run_id"], again["job_id"], rec["job_id"]))
    with pytest.raises(Exception, match=r"sbatch failed: .*(partition|Partition)") as err:
        launch(agent, "nowhere", SLEEPER, partition="nosuch")
    assert "\n" not in str(err.value)
    failed = [r for r in agent.call("runs")["runs"] if r["name"] == "nowhere"]
    assert failed and failed[0]["state"] == "failed" and "sbatch failed" in failed[0]["error"]


# ---------------------------------------------------------------- restarts as new jobs

JOB = str(REPO / "tests" / "jobs" / "resumable_job.py")


def launch_restartable(a: AgentProc, name: str, mode: str, toml: str, n: int = 6) -> tuple[dict, Path]:
    """The resumable job (tests/jobs/resumable_job.py) submitted with a restart policy
    compiled from eagle3.toml, as the client sends it."""
    from tui.services.config import parse_config
    from tui.services.restartpolicy import compile_policy

    out = a.tmp / ("out-" + name)  # type: ignore[attr-defined]
    sched = {"kind": "slurm", "partition": "debug", "gpus": 1, "time": "10", "sbatch_args": []}
    rec = a.call("launch", {"name": name, "argv": [sys.executable, JOB, str(out), str(n), mode],
                            "cwd": str(a.tmp), "env": {}, "scheduler": sched,  # type: ignore[attr-defined]
                            "restart": compile_policy(parse_config(toml))})
    return rec, out


def waiting(a: AgentProc, run_id: str) -> Callable[[], dict | None]:
    def check() -> dict | None:
        rec = run_of(a, run_id)
        return rec if rec.get("restart_at") is not None else None
    return check


def test_a_transient_failure_resubmits_the_job(agent: AgentProc, slurm_cluster: Cluster) -> None:
    toml = '[run]\nrestart = "on-failure"\nrestart_delay = 4\ngraces = [0.5, 0.5]\n'
    rec, out = launch_restartable(agent, "resubmit", "transient1", toml)
    first = rec["job_id"]
    wait = wait_for(waiting(agent, rec["run_id"]), 60, "the run to wait for its restart")
    # The failed job ended; the restart is a new job, queued until the delay is over.
    assert wait["state"] == "pending" and wait["job_id"] != first, wait
    assert wait["slurm_state"] == "PENDING" and wait["slurm_reason"] == "BeginTime", wait
    assert wait["restarts"] == 1 and wait["attempts"][0]["job_id"] == first
    shown = view.run_row(RunRecord.parse(wait), "", time.time())
    assert shown.state == "waiting" and "; waiting to restart in " in shown.note, shown
    say("restart: job %s died (%s); the run waits: %s %s"
        % (first, wait["attempts"][0]["cause"]["title"], shown.state, shown.note))
    done = wait_for(in_state(agent, rec["run_id"], "exited"), 90, "the resubmitted job to finish")
    assert (done["exit_code"], done["restarts"], done["slurm_state"]) == (0, 1, "COMPLETED"), done
    assert done["job_id"] == wait["job_id"] and done["restart_at"] is None
    assert [(a["job_id"], a["restarted"]) for a in done["attempts"]] == [(first, True), (wait["job_id"], False)]
    assert done["attempts"][0]["cause"]["id"] == "nccl-timeout" and done["attempts"][1]["why"] == "finished"
    writes = (out / "writes.log").read_text().split()
    assert sorted(writes, key=int) == [str(i) for i in range(1, 7)]  # every sample exactly once
    log = Path(done["log"]).read_text()
    assert "[eagle3-tui] attempt 2/4 starts (Slurm job %s)" % wait["job_id"] in log, log
    shown = view.run_row(RunRecord.parse(done), "", time.time())
    say("restarted: run %s %s: %s" % (done["run_id"], shown.state, shown.note))
    # One timeline across both jobs: the second job's shim appends to the first's file.
    run_dir = agent.tmp / "runs" / rec["run_id"]  # type: ignore[attr-defined]
    tl = timeline.parse((run_dir / "timeline.jsonl").read_bytes())
    kinds = [ln.get("e") for ln in tl.lines]
    cut = kinds.index("resubmitted")  # job 1 ended, the run goes on as job 2
    assert tl.header["run"] == rec["run_id"] and tl.bad_lines == 0, tl
    assert any("s" in ln for ln in tl.lines[:cut]) and any("s" in ln for ln in tl.lines[cut + 1:]), tl.lines
    assert kinds.count("exit") == 1 and kinds[-1] == "exit", kinds  # the run's one end, after job 2
    assert [ln["t"] for ln in tl.lines] == sorted(ln["t"] for ln in tl.lines), tl.lines  # one time axis
    assert any(ln.get("e") == "attempts" and ln.get("restarts") == 1 for ln in tl.lines[:cut]), tl.lines
    (agent.tmp / "eagle3.toml").write_text('[host]\nruns_dir = "%s"\npython = "%s"\n'  # type: ignore[attr-defined]
                                           % (agent.tmp / "runs", sys.executable))  # type: ignore[attr-defined]
    show = subprocess.run([sys.executable, "-m", "tui.cli", "runs", "show", "local", rec["run_id"], "--json"],
                          cwd=agent.tmp, capture_output=True, text=True, timeout=60,  # type: ignore[attr-defined]
                          env=checkout.env(slurm_cluster.env))
    assert show.returncode == 0, show.stderr
    s = json.loads(show.stdout)
    assert (s["outcome"], s["attempts"], s["restarts"], s["timeline_bad_lines"]) == ("exit 0", 2, 1, 0), s
    assert "resubmitted" in [e["e"] for e in s["events"]], s["events"]
    say("timeline across jobs %s and %s: %d lines, events %s"
        % (first, wait["job_id"], len(tl.lines), ", ".join(str(e["e"]) for e in s["events"])))


def test_an_attempt_a_signal_ended_ends_its_job_so_though_the_run_goes_on(agent: AgentProc, slurm_cluster: Cluster,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """An attempt a signal ended (an NCCL watchdog timeout, then SIGKILL), restarted as a
    new job: the job it ran in still ends as the attempt did, with 128 + 9, so Slurm's
    record of that job (sacct, squeue) says it was killed, not that it failed with some code."""
    toml = '[run]\nrestart = "on-failure"\nrestart_delay = 600\n'
    rec, _ = launch_restartable(agent, "killed9", "sigkill", toml)
    try:
        wait = wait_for(waiting(agent, rec["run_id"]), 60, "the run to wait for its restart")
        assert wait["attempts"][0]["signal"] == "SIGKILL" and wait["job_id"] != rec["job_id"], wait
        monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
        first = wait_for(lambda: (lambda j: j if j["state"] not in ("RUNNING", "COMPLETING") else None)(
            slurm.squeue(fresh=True)[rec["job_id"]]), 30, "the first job to end")
        assert (first["state"], first["exit_code"], first["signal"]) == ("FAILED", 128 + 9, None), first
        say("an attempt SIGKILL ended, restarted as job %s: its job %s FAILED exit %s"
            % (wait["job_id"], rec["job_id"], first["exit_code"]))
    finally:
        agent.call("kill", {"run_id": rec["run_id"], "graces": [1, 1]}, timeout=60)


def test_kill_while_the_next_job_waits_cancels_it(agent: AgentProc) -> None:
    toml = '[run]\nrestart = "on-failure"\nrestart_delay = 600\n'
    rec, out = launch_restartable(agent, "killwait", "always", toml)
    wait = wait_for(waiting(agent, rec["run_id"]), 60, "the run to wait for its restart")
    assert wait["restart_at"] > time.time() + 500 and wait["job_id"] != rec["job_id"]
    report = agent.call("kill", {"run_id": rec["run_id"], "graces": [1, 1]}, timeout=60)
    assert report["ok"] and [s["signal"] for s in report["stages"]] == ["scancel"], report
    assert report["job_id"] == wait["job_id"] and "waiting to restart" in report["note"], report
    gone = wait_for(in_state(agent, rec["run_id"], "killed"), 20, "the cancelled restart")
    assert gone["slurm_state"] == "CANCELLED" and gone["restart_at"] is None
    time.sleep(2)
    assert (out / "attempts").read_text() == "1"  # nothing started later
    say("kill while waiting: job %s %s; %s"
        % (wait["job_id"], gone["slurm_state"], view.kill_verdict(KillReport.parse(report))))


CRASH_ONCE = """\
import os, sys, time
d = sys.argv[1]
n = len([f for f in os.listdir(d) if f.startswith("began")]) + 1
open(os.path.join(d, "began%d" % n), "w").close()
while not os.path.exists(os.path.join(d, "go%d" % n)):
    time.sleep(0.05)
print("[rank0]:[E1201 03:00:00.000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective "
      "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.",
      flush=True)
sys.exit(1)
"""


@pytest.mark.needs_root("a Slurm restart on a full disk: a 1 MiB tmpfs mounted for the runs dir")
def test_a_restart_on_a_full_disk_cancels_the_job_the_run_could_not_record(
        agent: AgentProc, slurm_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs dir's disk fills while attempt 1 runs; it dies of an NCCL timeout and the
    supervisor resubmits the run, but slurm.json cannot name the new job: that job is
    cancelled (it would run the command again in a run already recorded as ended), and
    the run ends with the attempt's exit code and says why in one line."""
    from tui.services.config import parse_config
    from tui.services.restartpolicy import compile_policy

    runs, work = agent.tmp / "runs", agent.tmp / "work"  # type: ignore[attr-defined]
    runs.mkdir(exist_ok=True)
    work.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(runs)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {(done.stderr.strip() or str(done.returncode)).splitlines()[0]}")
    try:
        sched = {"kind": "slurm", "partition": "debug", "gpus": 1, "time": "10", "sbatch_args": []}
        toml = '[run]\nrestart = "on-failure"\nrestart_delay = 10\ngraces = [0.5, 0.5]\n'
        rec = agent.call("launch", {"name": "fullslurm", "argv": [sys.executable, "-c", CRASH_ONCE, str(work)],
                                    "cwd": str(agent.tmp), "env": {}, "scheduler": sched,  # type: ignore[attr-defined]
                                    "log": str(agent.tmp / "out.log"),  # type: ignore[attr-defined]
                                    "restart": compile_policy(parse_config(toml))})
        wait_for(lambda: (work / "began1").exists(), 60, "attempt 1 to start")
        with open(runs / "filler", "wb", buffering=0) as f:
            with pytest.raises(OSError):
                while True:
                    f.write(b"\0" * 65536)
        (work / "go1").touch()
        ended = wait_for(in_state(agent, rec["run_id"], "exited"), 60, "the run to end")
        info = json.loads((runs / rec["run_id"] / "slurm.json").read_text())
        assert info["job_id"] == rec["job_id"], info  # still the first job: the new one is not the run's
        assert ended["exit_code"] == 1 and ended["restarts"] == 0, ended
        why = ended["restart_note"]
        assert re.fullmatch(rf"not restarted: no space left on device writing {re.escape(str(runs / rec['run_id']))}"
                            r"/slurm\.json; Slurm job (\d+) cancelled", why), why
        monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
        later = {j: v["state"] for j, v in slurm.squeue(fresh=True).items() if int(j) > int(rec["job_id"])}
        assert list(later.values()) == ["CANCELLED"], later  # not PENDING: it would start the run again
        assert why.endswith("Slurm job %s cancelled" % next(iter(later))), (why, later)
        assert not (work / "began2").exists()
        say("full disk under Slurm: %s" % why)
    finally:
        for n in (1, 2):
            (work / f"go{n}").touch()
        subprocess.run(["umount", "-l", str(runs)], check=False)


# ---------------------------------------------------------------- the job's node

def login_agent_on(cluster: Cluster, tmp_path: Path) -> Iterator[AgentProc]:
    """The agent as on a login node: no GPU of its own (nvidia-smi is not on its PATH;
    jobs get the node's stand-in through TaskProlog, tests/slurm.py)."""
    env = dict(cluster.env, EAGLE3_TUI_GPU_SOURCE="nvidia-smi")
    with AgentProc(env=env) as a:
        a.call("configure", {"interval": 0.5, "runs_dir": str(tmp_path / "runs")})
        a.tmp = tmp_path  # type: ignore[attr-defined]
        yield a
    # a failed test's job must not hold the node's GPUs for the tests after it
    subprocess.run(["scancel", "--user", getpass.getuser()], env=cluster.env, capture_output=True,
                   timeout=30, check=False)


@pytest.fixture()
def login_agent(slurm_cluster: Cluster, tmp_path: Path) -> Iterator[AgentProc]:
    yield from login_agent_on(slurm_cluster, tmp_path)


def test_the_jobs_node_through_srun_overlap_and_the_kill_proof_there(login_agent: AgentProc) -> None:
    a = login_agent
    login = a.call("snapshot")
    assert login["gpus"] == [] and login["gpu_error"] == "nvidia-smi not found", login
    rec = launch(a, "onnode", SLEEPER, gpus=1)
    run = wait_for(in_state(a, rec["run_id"], "running"), 30, "the job to run")
    wait_for(lambda: Path(run["log"]).exists() and Path(run["log"]).read_text().startswith("up") or None,
             20, "the run's first line")
    run = wait_for(with_pid(a, rec["run_id"]), 20, "the run's manifest")  # RUNNING may come first
    a.call("follow_job", {"run_id": rec["run_id"]})

    def on_node() -> dict | None:
        snap = a.call("snapshot")
        return snap if snap.get("gpus") and (snap.get("node") or {}).get("error") is None else None

    snap = wait_for(on_node, 30, "the node agent's GPUs")
    node = snap["node"]
    (gpu,) = snap["gpus"]
    # The reading came through the srun step: the stand-in is on PATH only inside the
    # job, and names the job and step it ran under; the hello of the step says the same.
    assert gpu["name"] == "Stand-in GPU job %s step 0" % rec["job_id"], gpu
    assert node["via"] == "srun step %s.0 on e3node" % rec["job_id"], node
    assert snap["gpu_source"] == "nvidia-smi via srun step %s.0 on e3node" % rec["job_id"]
    mine = [p for p in snap["processes"] if p["run_id"] == rec["run_id"]]
    assert run["pid"] in [p["pid"] for p in mine], snap["processes"]
    held = {p["pid"]: p["mem"] for p in gpu["processes"]}  # (other tests' runs may hold it too)
    assert held.get(run["pid"]) == GIB, gpu
    say("node: job %s's GPU through %s: %s, %d MiB held by pid %d of the run"
        % (rec["job_id"], node["via"], gpu["name"], held[run["pid"]] >> 20, run["pid"]))
    report = a.call("kill", {"run_id": rec["run_id"], "graces": [5, 5], "gpu_wait": 10}, timeout=120)
    assert report["ok"] and report["gpus_free"] is True, report
    assert report["note"] == "GPU proof read through srun step %s.0 on e3node" % rec["job_id"], report
    assert len(report["gpus"]) == 1, report
    (g,) = report["gpus"]
    assert g["run_mem_before"] == GIB and g["run_mem"] == 0 and g["freed"] == GIB, report
    verdict = view.kill_verdict(KillReport.parse(report))  # what the banner and `eagle3-tui kill` say
    assert verdict.endswith("(GPU proof read through srun step %s.0 on e3node)" % rec["job_id"]), verdict
    say("kill on the node: %s; GPU 0 held %d MiB by the run before, %d after"
        % (verdict, g["run_mem_before"] >> 20, g["run_mem"] >> 20))
    wait_for(in_state(a, rec["run_id"], "killed"), 20, "the killed job")
    snap = a.call("snapshot")  # the run ended: back to the login node's own view
    assert "node" not in snap and snap["gpus"] == [], snap


def test_a_node_agent_that_cannot_start_says_why_in_one_line(login_agent: AgentProc) -> None:
    a = login_agent
    rec = launch(a, "nossh", SLEEPER, gpus=1)
    wait_for(in_state(a, rec["run_id"], "running"), 30, "the job to run")
    marks = a.mark()
    a.call("follow_job", {"run_id": rec["run_id"], "how": "ssh"})  # e3node is no ssh host here

    def said() -> dict | None:
        a.call("snapshot")
        return next((m for m in a.messages[marks:] if m.get("type") == "error"
                     and "no agent on e3node" in m.get("message", "")), None)

    err = wait_for(said, 30, "the node agent's failure")
    assert "\n" not in err["message"] and err["message"].endswith(
        "; GPUs and processes are this login node's"), err
    snap = a.call("snapshot")
    assert snap["node"]["error"] and snap["gpus"] == [] and snap["gpu_error"] == "nvidia-smi not found"
    say("node agent refused: " + err["message"])
    a.call("kill", {"run_id": rec["run_id"], "graces": [1, 1]}, timeout=60)


def test_a_node_name_is_never_an_ssh_option(tmp_path: Path) -> None:
    """`how = "ssh"`: a node name (Slurm's text) went to ssh before `--`, so a node
    called `-oProxyCommand=…` was an option (only the later `-u` made ssh abort). Now
    `--` ends ssh's options, and a name starting with `-` is refused before anything
    runs, in one line. The real ssh and the real NodeAgent."""
    from remote.agent import node as nodeagent

    argv = nodeagent.command("ssh", "r1", "12", "gpu-node7")
    assert argv[argv.index("gpu-node7") - 1] == "--" and argv.index("--") < argv.index("-u")
    mark = tmp_path / "proxied"
    node = nodeagent.NodeAgent("r1", "12", "-oProxyCommand=touch %s" % mark, how="ssh")
    assert node.ended.wait(20)
    assert node.proc is None and node.error == (
        "node name '-oProxyCommand=touch %s' starts with '-'; not passed to ssh" % mark), node.error
    assert not mark.exists()
    node.close()


# ---------------------------------------------------------------- Slurm's own record

def test_sacct_keeps_the_jobs_record_after_squeue_forgot_it(slurm_accounting: Cluster, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    env = dict(slurm_accounting.env, EAGLE3_TUI_GPU_SOURCE="none")
    with AgentProc(env=env) as a:
        a.call("configure", {"interval": 0.5, "runs_dir": str(tmp_path / "runs")})
        a.tmp = tmp_path  # type: ignore[attr-defined]
        rec = launch(a, "acct", "import sys, time\nprint('boom', flush=True)\ntime.sleep(2)\nsys.exit(3)\n",
                     gpus=1)
        wait_for(in_state(a, rec["run_id"], "exited"), 60, "the failing job to end")
    job, run_dir = rec["job_id"], str(tmp_path / "runs" / rec["run_id"])
    monkeypatch.setenv("SLURM_CONF", slurm_accounting.env["SLURM_CONF"])
    monkeypatch.setattr(slurm, "_SQUEUE", {})  # this process's readings of the other cluster
    monkeypatch.setattr(slurm, "_NO_ACCOUNTING", [])
    wait_for(lambda: job not in slurm.squeue(fresh=True) or None, 60, "squeue to forget the job (MinJobAge)")
    acct = wait_for(lambda: slurm.sacct(job), 30, "slurmdbd to have the job")
    # Slurm 22.05's sacct --json gives this failed batch job's exit_code as SUCCESS / 0:
    # taken as unknown; the run dir's exit record has the 3.
    assert (acct["state"], acct["exit_code"], acct["nodes"]) == ("FAILED", None, "e3node"), acct
    assert isinstance(acct["elapsed"], int) and acct["elapsed"] >= 2, acct
    assert isinstance(acct["ended_at"], int) and abs(acct["ended_at"] - time.time()) < 600, acct
    forgotten = slurm.record(run_dir)
    assert (forgotten["state"], forgotten["exit_code"], forgotten["slurm_state"]) == ("exited", 3, "FAILED")
    assert forgotten["nodes"] == "e3node" and forgotten["slurm_note"] is None, forgotten
    shown = view.run_row(RunRecord.parse(forgotten), "", time.time())
    say("sacct after squeue forgot job %s: %s, elapsed %d s, on %s (slurmdbd + MariaDB)"
        % (job, acct["state"], acct["elapsed"], acct["nodes"]))
    say("the run's record from sacct: %s %s" % (shown.state, shown.job))


# ---------------------------------------------------------------- the CLI on `local`


def e3(cluster: Cluster, tmp: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    bindir = tmp / "bin"
    env = dict(cluster.env, EAGLE3_TUI_GPU_SOURCE="nvidia-smi", PYTHONPATH=PYTHONPATH,
               PATH="%s:%s" % (bindir, cluster.env.get("PATH", "/usr/bin:/bin")))
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=timeout)


def slurm_config(tmp: Path, script: str, **keys: str) -> None:
    (tmp / "job.py").write_text(script)
    body = {"name": '"cli"', "command": json.dumps([sys.executable, "-u", str(tmp / "job.py")]),
            "cwd": json.dumps(str(tmp)), "env": '{HOLDS_GPU = "1"}', "graces": "[0.5, 0.5]",
            "gpu_wait": "10", "scheduler": '"slurm"', "partition": '"debug"', "gpus": "2",
            "time": '"5"', "sbatch_args": '["--comment=eagle3-tui test"]'}
    body.update(keys)
    (tmp / "eagle3.toml").write_text(
        '[host]\nruns_dir = %s\n[run]\n%s\n' % (json.dumps(str(tmp / "runs")),
                                              "\n".join("%s = %s" % kv for kv in body.items())))


def test_cli_launch_runs_kill_relaunch_on_slurm(agent: AgentProc, slurm_cluster: Cluster) -> None:
    tmp: Path = agent.tmp  # type: ignore[attr-defined]  # its bin/ holds the nvidia-smi stand-in
    slurm_config(tmp, STUBBORN)
    out = e3(slurm_cluster, tmp, "launch", "local")
    assert out.returncode == 0, out.stderr
    m = re.fullmatch(r"submitted run (\S+) as Slurm job (\d+) PENDING.*, log (/\S+)\n", out.stdout)
    assert m, out.stdout
    run_id, job, log = m.groups()
    assert log == str(tmp / "runs" / run_id / "output.log")

    def listed() -> dict | None:
        got = e3(slurm_cluster, tmp, "runs", "local", "--json")
        runs = json.loads(got.stdout)["runs"] if got.returncode == 0 else []
        rec = next((r for r in runs if r["run_id"] == run_id), None)
        return rec if rec and rec["state"] == "running" else None

    wait_for(listed, 60, "the job to run")
    table = e3(slurm_cluster, tmp, "runs", "local").stdout
    row = next(line for line in table.splitlines() if run_id in line)
    assert row.startswith("*") and " running " in row and "job %s RUNNING on e3node" % job in row, table
    say("CLI runs: " + " ".join(row.split()))
    out = e3(slurm_cluster, tmp, "kill", "local", "--yes")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "scancel --signal=TERM %s at" % job in out.stdout and "scancel %s at" % job in out.stdout
    assert "GPUs free after" in out.stdout, out.stdout
    say("CLI kill: " + out.stdout.splitlines()[0])
    out = e3(slurm_cluster, tmp, "relaunch", "local", "--yes")
    assert out.returncode == 0, out.stderr
    again = re.match(r"submitted run (\S+) as Slurm job (\d+)", out.stdout)
    assert again and again.group(1) != run_id and again.group(2) != job, out.stdout
    say("CLI relaunch: " + out.stdout.strip())
    run_id = again.group(1)
    wait_for(listed, 60, "the resubmitted job to run")
    out = e3(slurm_cluster, tmp, "kill", run_id, "--yes")
    assert out.returncode == 0 and "GPUs free" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("key, value, error", [
    ("scheduler", '"pbs"', 'run.scheduler: must be "local" or "slurm"'),
    ("gpus", "-1", "run.gpus: must be a whole number >= 0"),
    ("time", '"soon"', "run.time: must be a Slurm time limit"),
    ("sbatch_args", '"--exclusive"', "run.sbatch_args: must be a list of strings"),
])
def test_bad_slurm_keys_are_one_line_exit_2(tmp_path: Path, key: str, value: str, error: str) -> None:
    slurm_config(tmp_path, SLEEPER, **{key: value})
    out = subprocess.run([sys.executable, "-m", "tui.cli", "launch", "local"], cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=PYTHONPATH), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert error in out.stderr, out.stderr


# ---------------------------------------------------------------- the dashboard

# Records of the shape the agent sends for Slurm runs (taken from the tier above), fed
# to the real dashboard through the replay client: no cluster needed.
SLURM_RUN: dict[str, object] = {"run_id": "20261201-080000-aa01", "name": "kimi", "state": "running",
             "argv": ["python", "extract.py"], "pid": 4242, "launched_at": time.time() - 90,
             "log": "/shared/runs/20261201-080000-aa01/output.log", "cwd": "/srv", "env": {},
             "scheduler": "slurm", "job_id": "12", "slurm_state": "RUNNING",
             "slurm_reason": None, "nodes": "gpu-node7"}
SLURM_PENDING = dict(SLURM_RUN, run_id="20261201-080100-aa02", state="pending", pid=None,
                     launched_at=time.time() - 30, job_id="13", slurm_state="PENDING",
                     slurm_reason="Resources", nodes=None, name="kimi-2")


async def test_dashboard_shows_jobs_and_kill_names_scancel() -> None:
    from tests.replay import ReplayClient, snapshot
    from tui.services.config import parse_config
    from tui.views.app import make_app
    from tui.views.screens.confirm import ConfirmScreen
    from tui.views.widgets.tables import RunsTable

    cfg = parse_config('[run]\nname = "kimi"\ncommand = ["python", "extract.py"]\n'
                       'scheduler = "slurm"\ngpus = 8\n')
    client = ReplayClient([snapshot(2, runs=[SLURM_RUN, SLURM_PENDING])])
    app = make_app(client, cfg, "login1")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        while app.dashboard.state.seq != 0:
            await pilot.pause(0.02)
        await pilot.press("a")  # show every run, the other config's pending one too
        await pilot.pause(0.1)
        table = app.query_one(RunsTable)
        running = [str(c) for c in table.get_row(str(SLURM_RUN["run_id"]))]
        pending = [str(c) for c in table.get_row(str(SLURM_PENDING["run_id"]))]
        assert "running" in running and running[-1] == "job 12 RUNNING on gpu-node7", running
        assert "pending" in pending and pending[-1] == "job 13 PENDING (Resources)", pending
        await pilot.press("k")
        for _ in range(100):
            if isinstance(app.screen, ConfirmScreen):
                break
            await pilot.pause(0.02)
        body = str(app.screen.query_one("#body").render())
        assert "Slurm job 12: scancel --signal=TERM, then plain scancel after 20 s." in body, body
    # The selected running job is followed to its node, once; the pending one never is.
    follows = [args for op, args in client.requests if op == "follow_job"]
    assert follows == [{"run_id": SLURM_RUN["run_id"], "how": "srun"}], follows


async def test_dashboard_shows_the_jobs_node_gpus() -> None:
    """The agent's snapshot while it follows the job (the shape the tier's
    test_the_jobs_node_through_srun_overlap… reads from the real agent): the GPU box
    names where its GPUs come from."""
    from tests.replay import ReplayClient, snapshot
    from tui.services.config import parse_config
    from tui.views.app import make_app

    client = ReplayClient([snapshot(2, runs=[SLURM_RUN], gpu_source="nvml via srun step 12.0 on gpu-node7")])
    app = make_app(client, parse_config('[run]\nname = "kimi"\nscheduler = "slurm"\n'), "login1")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        while app.dashboard.state.seq != 0:
            await pilot.pause(0.02)
        await pilot.pause(0.1)
        title = str(app.query_one("#gpu-box").border_title)
        assert title == "GPUs (2, nvml via srun step 12.0 on gpu-node7)", title


def test_slurm_keys_without_the_slurm_scheduler_are_a_warning() -> None:
    from tui.services.config import parse_config

    cfg = parse_config('[run]\ncommand = ["x"]\npartition = "gpu"\ngpus = 8\n')
    assert cfg.run.scheduler == "local" and cfg.warnings == (
        'eagle3.toml: run.partition, run.gpus ignored: only used with scheduler = "slurm"',)
    assert parse_config('[run]\nscheduler = "slurm"\ngpus = 8\n').warnings == ()
