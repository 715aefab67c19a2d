"""The host acts on waste with no client connected (issue 37): ``[watch] on_diverge`` and
``on_idle`` = "kill", run by the restart supervisor (remote/run/restart.py) from the shim's
pace, a kill proved as a kill is (the GPUs free), never restarted, and ``runs show``
telling the GPU-hours spent after the moment the timeline marks.

Real processes end to end: ``eagle3-tui launch`` (the real CLI, the real agent, shim and
supervisor) of a real PyTorch loop made to diverge (SGD at lr 1e6,
tests/jobs/diverge_train.py) and of a run that goes idle holding its GPU memory
(tests/jobs/idle_after_load.py); the CLI exits at once, so nothing of the client watches.
One stand-in: ``nvidia-smi`` (tests/jobs/standin_smi.py), one card held by the pids the
jobs register, at 0 % utilisation: this machine has no GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from remote.run.restartpolicy import decide
from tests import checkout
from tui.protocol.records import RunRecord
from tui.services import timeline
from tui.services.config import ConfigError, parse_config
from tui.services.restartpolicy import compile_policy

JOBS = Path(__file__).parent / "jobs"


def _env(tmp: Path) -> dict[str, str]:
    bindir, gpu = tmp / "bin", tmp / "gpu"
    bindir.mkdir()
    gpu.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(f"#!{sys.executable}\n" + (JOBS / "standin_smi.py").read_text())
    smi.chmod(0o755)
    env = checkout.env()
    env.update(PATH=f"{bindir}:{env.get('PATH', '')}", EAGLE3_TUI_GPU_SOURCE="nvidia-smi",
               EAGLE3_STANDIN_GPU_DIR=str(gpu), EAGLE3_TUI_PACE_S="0.5", EAGLE3_TUI_TIMELINE_S="1")
    return env


def e3(tmp: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=120)


def _config(tmp: Path, job: list[str], watch: str) -> None:
    (tmp / "eagle3.toml").write_text(
        f'[host]\nruns_dir = "{tmp / "runs"}"\npython = "{sys.executable}"\n'
        f'[run]\nname = "waste"\ncommand = {json.dumps([sys.executable, *job])}\ncwd = "{tmp}"\n'
        'graces = [2.0, 2.0]\ngpu_wait = 10\nrestart = "on-failure"\nrestart_delay = 0.2\n'
        f"[watch]\n{watch}")


def _until_ended(tmp: Path, env: dict[str, str], timeout: float = 90.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = e3(tmp, env, "runs", "show", "--json")
        assert out.returncode == 0, out.stderr
        shown = json.loads(out.stdout)
        if shown["state"] not in ("running", "pending"):
            return dict(shown)
        time.sleep(0.5)
    raise AssertionError("the run never ended")


@pytest.fixture()
def no_strays(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    for pid_file in (tmp_path / "gpu").glob("*") if (tmp_path / "gpu").exists() else []:
        try:
            os.kill(int(pid_file.name), 9)
        except (OSError, ValueError):
            pass


def test_a_run_that_diverges_is_killed_by_the_host_and_its_waste_counted(tmp_path: Path, no_strays: None) -> None:
    env = _env(tmp_path)
    _config(tmp_path, [str(JOBS / "diverge_train.py"), "1e6"], 'on_diverge = "kill"\n')
    launched = e3(tmp_path, env, "launch")
    assert launched.returncode == 0, launched.stderr  # the CLI is gone: no client from here on
    shown = _until_ended(tmp_path, env)
    assert shown["outcome"] == "diverged: stopped (on_diverge = kill)", shown
    stop = shown["stopped"]
    assert stop["what"] == "diverged" and stop["gpus_free"] is True, stop
    assert stop["gpus"][0]["run_mem_before"] == 20480 * 2 ** 20 and stop["gpus"][0]["run_mem"] == 0
    assert shown["attempts"] == 1 and shown["restarts"] == 0  # never restarted, restart = "on-failure"
    w = shown["wasted"]
    assert w["after"] == "divergence" and "nan" in w["line"], w
    assert 0 < w["gpu_hours"] <= shown["gpu_hours"]
    assert [p["phase"] for p in shown["phases"]][-1] == "diverged"
    text = e3(tmp_path, env, "runs", "show").stdout
    assert "wasted" in text and "GPU-hours after divergence" in text and "GPUs free (proved)" in text, text
    assert not list((tmp_path / "gpu").iterdir()) or all(
        not Path(f"/proc/{p.name}").exists() for p in (tmp_path / "gpu").iterdir())
    inspect = json.loads(e3(tmp_path, env, "inspect", "--json", *_log(tmp_path)).stdout)
    assert inspect["phase"] == "diverged" and inspect["root_cause"]["id"] == "training-diverged"


def _log(tmp: Path) -> list[str]:
    return [str(next((tmp / "runs").glob("*/output.log")))]


def test_a_run_idle_on_its_gpus_is_killed_by_the_host(tmp_path: Path, no_strays: None) -> None:
    env = _env(tmp_path)
    _config(tmp_path, [str(JOBS / "idle_after_load.py")], 'on_idle = "kill"\nidle_s = 3\n')
    launched = e3(tmp_path, env, "launch")
    assert launched.returncode == 0, launched.stderr
    shown = _until_ended(tmp_path, env)
    assert shown["outcome"] == "idle: stopped (on_idle = kill)", shown
    stop = shown["stopped"]
    assert stop["what"] == "idle" and stop["gpus_free"] is True and "30.0 GiB" in stop["detail"], stop
    assert shown["restarts"] == 0
    w = shown["wasted"]
    assert w["after"] == "idle" and 0 < w["gpu_hours"] <= shown["gpu_hours"], w
    assert shown["duration_s"] - w["after_s"] >= 3.0  # idle for idle_s before it was stopped


def test_idle_without_a_gpu_source_is_never_killed(tmp_path: Path, no_strays: None) -> None:
    """CPU and log quiet alone is a hang's evidence, not waste of GPUs: on_idle needs a
    reading that the run holds GPU memory."""
    env = _env(tmp_path)
    env["EAGLE3_TUI_GPU_SOURCE"] = "none"
    _config(tmp_path, [str(JOBS / "idle_after_load.py")], 'on_idle = "kill"\nidle_s = 1\n')
    assert e3(tmp_path, env, "launch").returncode == 0
    time.sleep(6)
    shown = json.loads(e3(tmp_path, env, "runs", "show", "--json").stdout)
    assert shown["state"] == "running" and shown["stopped"] is None, shown
    assert e3(tmp_path, env, "kill", "--yes").returncode == 0


# ---------------------------------------------------------------- the policy and the count


def test_the_watch_keys_compile_into_the_hosts_policy() -> None:
    assert compile_policy(parse_config("")) is None
    p = compile_policy(parse_config('[watch]\non_diverge = "kill"\non_idle = "kill"\nidle_s = 60\n'))
    assert p is not None and (p["on_diverge"], p["on_idle"], p["idle_s"]) == ("kill", "kill", 60.0)
    assert compile_policy(parse_config('[watch]\non_idle = "kill"\n'))["idle_s"] == 1800.0  # type: ignore[index]
    with pytest.raises(ConfigError, match='watch.on_diverge: must be "notify" or "kill", not .restart.'):
        parse_config('[watch]\non_diverge = "restart"\n')
    with pytest.raises(ConfigError, match="watch.idle_s"):
        parse_config('[watch]\nidle_s = -1\n')


def test_a_diverged_attempt_is_never_restarted() -> None:
    policy = {"restart": "on-failure", "max_restarts": 5, "thrash_failures": 0}
    transient = {"id": "nccl-timeout", "title": "NCCL", "class": "transient"}
    died = {"exit_code": 1, "cause": transient, "progress": {"batch": 9}}
    assert decide(policy, [], died, 0.0)[0] is True
    assert decide(policy, [], dict(died, diverged=True), 0.0) == (False, "diverged: not restarted")
    assert decide(policy, [], dict(died, diverged=True, stopped="diverged"), 0.0) == (
        False, "diverged: stopped (on_diverge = kill)")
    assert decide(dict(policy, on_hang="restart"), [], dict(died, exit_code=0, diverged=True), 0.0)[0] is False
    assert decide(policy, [], dict(died, stopped="idle"), 0.0) == (False, "idle: stopped (on_idle = kill)")


def _tl(lines: list[dict[str, Any]]) -> timeline.Timeline:
    return timeline.Timeline(header={"v": 1, "t0": 1000.0, "launched_at": 1000.0}, lines=lines)


def test_wasted_gpu_hours_count_from_the_mark_to_the_end() -> None:
    lines = [{"t": 0.0, "c": [0, 1], "h": 1}, {"t": 3600.0, "e": "diverged", "why": "w", "line": "l"},
             {"t": 5400.0, "c": [0], "h": 1}, {"t": 7200.0, "e": "exit", "code": 0}]
    s = timeline.summary(_tl(lines), RunRecord.parse({"state": "exited", "exit_code": 0}))
    assert s["gpu_hours"] == 2 * 1.5 + 0.5
    assert s["wasted"] == {"after": "divergence", "after_s": 3600.0, "gpu_hours": 2 * 0.5 + 0.5,
                           "why": "w", "line": "l"}
    idle = [{"t": 0.0, "c": [0], "h": 1}, {"t": 10.0, "e": "idle"},
            {"t": 1810.0, "e": "attempts", "stopped": "idle", "idle_since": 1010.0, "note": "idle: stopped"},
            {"t": 1810.0, "e": "exit", "signal": "SIGINT"}]
    s = timeline.summary(_tl(idle), RunRecord.parse({"state": "exited"}))
    assert s["wasted"]["after"] == "idle" and s["wasted"]["gpu_hours"] == 0.5
    assert timeline.summary(_tl(lines[:1] + lines[2:]), RunRecord.parse({}))["wasted"] is None
