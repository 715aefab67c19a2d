"""The real `eagle3-tui` command, end to end: on `local` and over SSH to a real OpenSSH
sshd on 127.0.0.1. Each call is a new client process, so a run launched by one call and
seen by the next has outlived its client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests import checkout
from tests.sshd import Sshd

RUN_SCRIPT = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)   # a worker that ignores SIGTERM, like a stuck rank
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.write(1, b"worker %d\\n" % os.getpid())  # one write: the two lines never interleave
    while True:
        time.sleep(1)
os.write(1, b"parent %d\\n" % os.getpid())
while True:
    time.sleep(1)
"""


def e3(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tui.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=checkout.env(),
    )


def write_config(tmp: Path, marker: str, command: list[str] | None = None) -> Path:
    script = tmp / "job.py"
    script.write_text(RUN_SCRIPT)
    cmd = command or [sys.executable, str(script), marker]
    cfg = tmp / "eagle3.toml"
    cfg.write_text(
        f'[host]\nruns_dir = "{tmp / "runs"}"\npython = "{sys.executable}"\n'
        f'[run]\nname = "e2e"\ncommand = {json.dumps(cmd)}\ncwd = "{tmp}"\nmatch = "{marker}"\n'
        "graces = [0.5, 0.5]\ngpu_wait = 0\n"
    )
    return cfg


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


def wait_until(cond: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


@pytest.fixture
def decoy(tmp_path: Path) -> Any:
    """A process with the run's exact command line, started outside any run."""
    marker = f"e2e-{uuid.uuid4().hex[:8]}"
    write_config(tmp_path, marker)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "job.py"), marker], stdout=subprocess.DEVNULL)
    yield marker, proc
    proc.kill()
    proc.wait()
    for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_status_local_json_finds_a_matching_process(tmp_path: Path, decoy: Any) -> None:
    marker, proc = decoy
    res = e3("status", "local", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    snap = json.loads(res.stdout)
    assert {"host", "gpus", "processes", "runs"} <= snap.keys()
    assert isinstance(snap["gpus"], list)
    assert proc.pid in [p["pid"] for p in snap["processes"]]


def test_status_over_ssh_alias(tmp_path: Path, sshd: Sshd, decoy: Any) -> None:
    marker, proc = decoy
    res = e3("-F", str(sshd.ssh_config), "status", sshd.alias, "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    snap = json.loads(res.stdout)
    assert proc.pid in [p["pid"] for p in snap["processes"]]
    assert snap["host"]["hostname"]


def test_unknown_host_key_is_refused_in_one_line(tmp_path: Path, sshd: Sshd) -> None:
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        sshd.ssh_config.read_text().replace(str(sshd.known_hosts), str(tmp_path / "empty_known_hosts"))
    )
    res = e3("-F", str(cfg), "status", sshd.alias, cwd=tmp_path)
    assert res.returncode == 3
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "SHA256:" in lines[0] and "--accept-new-host-key" in lines[0]
    assert "Traceback" not in res.stderr


def test_bad_config_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "eagle3.toml").write_text("[run]\ncommand = 'python x.py'\n")
    res = e3("status", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "run.command: must be a list" in res.stderr


@pytest.mark.parametrize("where", ["local", "ssh"])
def test_launch_runs_kill_relaunch(tmp_path: Path, sshd: Sshd, decoy: Any, where: str) -> None:
    marker, decoy_proc = decoy
    target = ["local"] if where == "local" else [sshd.alias]
    pre = [] if where == "local" else ["-F", str(sshd.ssh_config)]

    res = e3(*pre, "launch", *target, "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run = json.loads(res.stdout)
    log = Path(run["log"])
    wait_until(lambda: log.exists() and b"worker" in log.read_bytes())
    pids = [int(line.split()[1]) for line in log.read_text().splitlines() if line.split()[0] in ("parent", "worker")]
    assert len(pids) == 2 and all(alive(p) for p in pids)  # the launching client is gone; the run is not

    runs = json.loads(e3(*pre, "runs", *target, "--json", cwd=tmp_path).stdout)["runs"]
    assert [r["state"] for r in runs if r["run_id"] == run["run_id"]] == ["running"]

    refused = e3(*pre, "relaunch", *target, cwd=tmp_path)
    assert refused.returncode == 1 and "still running" in refused.stderr

    t0 = time.monotonic()
    killed = e3(*pre, "kill", *target, "--yes", "--json", cwd=tmp_path)
    assert killed.returncode == 0, killed.stderr
    assert time.monotonic() - t0 < 0.5 + 0.5 + 1 + 3  # graces + 1 s, plus the client's start-up
    report = json.loads(killed.stdout)
    assert report["ok"] and report["remaining"] == []
    assert not any(alive(p) for p in pids)
    assert alive(decoy_proc.pid)  # same command line, not of the run: untouched

    again = e3(*pre, "relaunch", *target, "--yes", "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["run_id"] != run["run_id"] and second["argv"] == run["argv"]
    runs = json.loads(e3(*pre, "runs", *target, "--json", cwd=tmp_path).stdout)["runs"]
    states = {r["run_id"]: r["state"] for r in runs}
    assert states[run["run_id"]] == "killed" and states[second["run_id"]] == "running"
    assert e3(*pre, "kill", *target, second["run_id"], "--yes", cwd=tmp_path).returncode == 0


def test_exit_status_is_recorded_with_no_client(tmp_path: Path) -> None:
    write_config(tmp_path, "e2e-exit", [sys.executable, "-c", "import time; time.sleep(1); raise SystemExit(7)"])
    run = json.loads(e3("launch", "local", "--json", cwd=tmp_path).stdout)

    def ended() -> bool:
        runs = json.loads(e3("runs", "local", "--json", cwd=tmp_path).stdout)["runs"]
        return any(r["run_id"] == run["run_id"] and r["state"] == "exited" and r["exit_code"] == 7 for r in runs)

    wait_until(ended, timeout=20)


def test_patch_status_push_rollback_over_ssh(tmp_path: Path, sshd: Sshd, monkeypatch: pytest.MonkeyPatch) -> None:
    """The patch commands through sshd, on a real speculators 0.3.0 in a venv on the 'host'."""
    from tests import spec_wheel
    from tests.patch_fixtures import GEN
    from tui.services.demo import ensure_speculators_venv

    wheel = spec_wheel.wheel_path()  # skips, or fails under CI, when it cannot be had
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheel.parent))
    python, why = ensure_speculators_venv(tmp_path / "venv", sys.executable)
    assert python is not None, why
    cfg = tmp_path / "eagle3.toml"
    cfg.write_text(f'[host]\npython = "{python}"\n[patches]\nset = "speculators-0.3.0-vllm-0.16"\n')
    pre = ["-F", str(sshd.ssh_config)]
    gen = next((tmp_path / "venv").rglob(GEN))
    pristine = gen.read_bytes()

    def patch(*args: str) -> subprocess.CompletedProcess[str]:
        return e3(*pre, "patch", *args, cwd=tmp_path)

    assert patch("status", sshd.alias).stdout.splitlines()[0] == "pristine"
    pushed = patch("push", "latest", sshd.alias, "--yes")
    assert pushed.returncode == 0, pushed.stderr
    assert patch("status", sshd.alias).stdout.splitlines()[0] == "v5"
    compile(gen.read_bytes(), str(gen), "exec")
    back = patch("rollback", sshd.alias, "--yes")
    assert back.returncode == 0, back.stderr
    assert gen.read_bytes() == pristine
    gen.write_bytes(pristine + b"\n# edited by hand\n")
    refused = patch("push", "v1", sshd.alias, "--yes")
    last = refused.stderr.strip().splitlines()[-1]  # the diff against pristine comes first
    assert refused.returncode == 1 and last.startswith("eagle3-tui:") and "without --force" in last
    assert "+# edited by hand" in refused.stderr
    assert gen.read_bytes() == pristine + b"\n# edited by hand\n"  # untouched
