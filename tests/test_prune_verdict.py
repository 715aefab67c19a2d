"""`runs prune --dry-run` promises what the real prune does: both go through one decision
(`rundir.prune_verdict`), and a run either prune keeps is listed with its reason. The
real CLI against real run dirs; the run that cannot go holds a mount point (a tmpfs, as
root: CI runs as root) or, as another user, a folder it may not delete from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, check=False, stdin=subprocess.DEVNULL, env=env)


def _ended_run(runs: Path, run_id: str) -> Path:
    d = runs / run_id
    d.mkdir(parents=True, mode=0o700)
    t = time.time() - 3600
    req = {"run_id": run_id, "name": "job", "argv": ["true"], "cwd": "/", "env": {},
           "patch_state": None, "log": None, "launched_at": t}
    (d / "launch.json").write_text(json.dumps(req))
    (d / "manifest.json").write_text(json.dumps(dict(req, pid=None, boot_time=0, start_time=t)))
    (d / "exit.json").write_text(json.dumps({"exit_code": 0, "ended_at": t + 1}))
    return d


def test_dry_run_and_real_prune_agree_and_say_why_a_run_stays(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    plain = _ended_run(runs, "20260101-000000-aaaa")
    stuck = _ended_run(runs, "20260101-000001-bbbb")
    inner = stuck / "scratch"
    inner.mkdir()
    mounted = os.geteuid() == 0
    if mounted:  # a filesystem mounted inside the run dir: removing it would empty it
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(inner)], check=True)
        why = f"{inner} is a mount point; unmount it first"
    else:
        why = f"cannot delete inside {inner}: permission denied"
    (inner / "precious").write_text("keep me")
    if not mounted:
        os.chmod(inner, 0o500)
    (tmp_path / "eagle3.toml").write_text(f'[host]\nruns_dir = "{runs}"\n[run]\nname = "job"\nargv = ["true"]\n')
    try:
        dry = cli("runs", "prune", "local", "--keep", "0", "--dry-run", cwd=tmp_path)
        real = cli("runs", "prune", "local", "--keep", "0", cwd=tmp_path)
        assert dry.returncode == 0 and real.returncode == 0, dry.stderr + real.stderr
        assert dry.stdout.splitlines() == [
            f"would remove {plain.name}  job  exited",
            f"would keep {stuck.name}: {why}",
            "would remove 1 run(s); 1 ended run(s) kept (1 of them for the reason given)"]
        assert real.stdout.splitlines() == [
            f"removed {plain.name}  job  exited",
            f"kept {stuck.name}: {why}",
            "removed 1 run(s); 1 ended run(s) kept (1 of them for the reason given)"]
        assert not plain.exists() and (inner / "precious").read_text() == "keep me"
        again = json.loads(cli("runs", "prune", "local", "--keep", "0", "--dry-run", "--json",
                               cwd=tmp_path).stdout)
        assert again["removed"] == [] and again["skipped"][0]["reason"] == why
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(inner)], check=False)
        else:
            os.chmod(inner, 0o700)


def _set_immutable(path: Path, on: bool) -> None:
    """chattr +i / -i through the ioctl (FS_IOC_SETFLAGS, FS_IMMUTABLE_FL)."""
    import array
    import fcntl

    fd = os.open(path, os.O_RDONLY)
    try:
        flags = array.array("l", [0])
        fcntl.ioctl(fd, 0x80086601, flags, True)  # FS_IOC_GETFLAGS
        flags[0] = flags[0] | 0x10 if on else flags[0] & ~0x10
        fcntl.ioctl(fd, 0x40086602, flags)  # FS_IOC_SETFLAGS
    finally:
        os.close(fd)


@pytest.mark.needs_root("prune: a file made immutable (chattr +i) in a run dir")
def test_a_removal_that_fails_part_way_is_reported_and_prune_goes_on(tmp_path: Path) -> None:
    """A file in a run dir the user made immutable (chattr +i on a checkpoint to keep):
    the verdict cannot see it, the removal fails on it; prune says so for that run, in
    one line naming the file, removes the other runs and does not stop."""
    from remote.run import rundir

    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    first = _ended_run(runs, "20260101-000000-aaaa")
    kept = _ended_run(runs, "20260101-000001-bbbb")
    last = _ended_run(runs, "20260101-000002-cccc")
    precious = kept / "checkpoint.pt"
    precious.write_bytes(b"weights")
    _set_immutable(precious, True)
    try:
        report = rundir.prune_runs(str(runs), keep=0)
    finally:
        _set_immutable(precious, False)
    assert sorted(r["run_id"] for r in report["removed"]) == [first.name, last.name]
    assert [(r["run_id"], r["reason"]) for r in report["skipped"]] == [
        (kept.name, f"removal failed part-way ({precious}: Operation not permitted)")]
    assert not first.exists() and not last.exists() and precious.read_bytes() == b"weights"


def test_a_run_dir_opened_to_others_after_it_was_listed_is_kept_and_prune_goes_on(tmp_path: Path) -> None:
    """The agent lists a run that ended long ago once, then keeps its record without
    looking again (every tick lists the runs). A run dir opened to others since (a chmod
    777 to share a checkpoint) is not ours alone any more: the prune keeps it, saying why,
    and removes the other runs; it never fails part-way with the others half done."""
    from tests.agent_driver import AgentProc

    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    first = _ended_run(runs, "20260101-000000-aaaa")
    shared = _ended_run(runs, "20260101-000001-bbbb")
    last = _ended_run(runs, "20260101-000002-cccc")
    with AgentProc(env={"EAGLE3_TUI_GPU_SOURCE": "none"}, args=["--runs-dir", str(runs)]) as agent:
        assert len(agent.call("runs")["runs"]) == 3
        os.chmod(shared, 0o777)
        report = agent.call("prune", {"keep": 0})
    assert sorted(r["run_id"] for r in report["removed"]) == [first.name, last.name], report
    ((run_id, reason),) = [(r["run_id"], r["reason"]) for r in report["skipped"]]
    assert run_id == shared.name and reason.startswith(f"refusing run dir {shared}: ") and "mode 0777" in reason
    assert shared.is_dir() and not first.exists() and not last.exists()
