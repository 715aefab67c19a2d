"""Every key the host writes is a key the client reads, and back (tui/protocol/records.py).

The host's own writers run here: the real agent as a subprocess (its snapshots, `runs`,
`kill` and `prune` replies) with the stand-in ``nvidia-smi`` of tests/jobs/standin_smi.py
as its GPU source, NVML through a stand-in ``pynvml`` module in this process (no GPU
here), a Slurm run's record (remote/run/slurm.py, with squeue's answer handed in) and a job
node's view (remote/agent/node.py). Each record's keys are compared with its `KEYS` (read)
and `UNREAD` (left on purpose): a key the host writes that the client neither reads nor
names fails, and so does a key the client reads that no writer writes (a typo would
show N/A forever).
"""

from __future__ import annotations

import json
import os
import sys
import time
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from remote.agent import node as nodeagent
from remote.base import procfs
from remote.base.gpus import Gpus, host_info
from remote.run import slurm
from tests.agent_driver import AgentCallError, AgentProc
from tui.protocol import parse_message
from tui.protocol.ops import KillReport
from tui.protocol.records import (
    GpuFreed,
    GpuProcReading,
    GpuReading,
    HostReading,
    JobNode,
    KillStage,
    ProcReading,
    PruneEntry,
    RunRecord,
)
from tui.services.config import parse_config
from tui.services.restartpolicy import compile_policy

JOBS = Path(__file__).parent / "jobs"
MIB = 2**20
# written by the host, not read by the client (beside each record's own UNREAD)
GPU_UNREAD: tuple[str, ...] = ()
PROC_UNREAD: tuple[str, ...] = ()
JOB_NODE_UNREAD = ("run_id", "job_id", "how", "hostname")  # the client shows where and why, by node
NODE = {"node": "remote/agent/node.py"}  # a job node's GPUs and processes name it (test below)


def keys(objs: Iterable[Any]) -> set[str]:
    return {k for o in objs if isinstance(o, dict) for k in o}


ROOT = Path(__file__).resolve().parents[1]


def same_keys(written: set[str], read: tuple[str, ...], unread: tuple[str, ...], what: str,
              elsewhere: dict[str, str] | None = None) -> None:
    """`elsewhere`: a key only a path this test cannot take writes (a Slurm job's, a job
    node's), with the host file that writes it (checked to spell it so)."""
    for key, path in (elsewhere or {}).items():
        text = (ROOT / path).read_text()
        assert f'"{key}"' in text or f"{key}=" in text, f"{path} does not write {key!r}"
    written = written | set(elsewhere or ())
    unknown = written - set(read) - set(unread)
    assert not unknown, f"{what}: the host writes {sorted(unknown)}, which the client neither reads nor names"
    never = set(read) - written
    assert not never, f"{what}: the client reads {sorted(never)}, which no host writer wrote here"


def wait(pred: Any, timeout: float = 30.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError("timed out")


class _Nv:
    """A stand-in pynvml: one card, one process on it (remote/base/gpus.py's NVML path)."""

    @staticmethod
    def module() -> types.ModuleType:
        nv = types.ModuleType("pynvml")
        proc = types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=512 * MIB)
        funcs = {
            "nvmlInit": lambda: None, "nvmlDeviceGetCount": lambda: 1,
            "nvmlDeviceGetHandleByIndex": lambda i: i, "nvmlDeviceGetName": lambda h: b"NVIDIA H200",
            "nvmlDeviceGetUUID": lambda h: "GPU-0",
            "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=7),
            "nvmlDeviceGetPowerUsage": lambda h: 100_000, "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700_000,
            "nvmlDeviceGetTemperature": lambda h, s: 30,
            "nvmlDeviceGetComputeRunningProcesses": lambda h: [proc],
            "nvmlDeviceGetGraphicsRunningProcesses": lambda h: [],
            "nvmlDeviceGetMemoryInfo": lambda h, *v: types.SimpleNamespace(used=MIB, total=80 * 1024 * MIB),
        }
        for name, fn in funcs.items():
            setattr(nv, name, fn)
        nv.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
        return nv


def test_nvml_and_nvidia_smi_write_the_gpu_keys_the_client_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _Nv.module())
    monkeypatch.setenv("EAGLE3_TUI_GPU_SOURCE", "nvml")
    nvml, err = Gpus().read()
    assert err is None and nvml
    smi_env(tmp_path, monkeypatch)
    (tmp_path / "gpu" / str(os.getpid())).write_text("512")
    smi, err = Gpus().read()
    assert err is None and smi
    for what, gpus in (("nvml", nvml), ("nvidia-smi", smi)):
        same_keys(keys(gpus), GpuReading.KEYS, GPU_UNREAD, f"GPU ({what})", NODE)
        same_keys(keys(p for g in gpus for p in g["processes"]), GpuProcReading.KEYS, (), f"GPU process ({what})")
        assert all(GpuReading.parse(g, 0).mem_total for g in gpus)


def test_host_info_writes_the_keys_the_client_reads() -> None:
    same_keys(set(host_info()), HostReading.KEYS, (), "host")


def smi_env(tmp: Path, monkeypatch: pytest.MonkeyPatch | None = None) -> dict[str, str]:
    """The stand-in nvidia-smi on PATH as the GPU source; a file in gpu/ per holding pid."""
    bindir, gpu = tmp / "bin", tmp / "gpu"
    bindir.mkdir(exist_ok=True)
    gpu.mkdir(exist_ok=True)
    smi = bindir / "nvidia-smi"
    smi.write_text(f"#!{sys.executable}\n" + (JOBS / "standin_smi.py").read_text())
    smi.chmod(0o755)
    env = {"PATH": f"{bindir}:{os.environ.get('PATH', '')}", "EAGLE3_TUI_GPU_SOURCE": "nvidia-smi",
           "EAGLE3_STANDIN_GPU_DIR": str(gpu), "EAGLE3_TUI_PACE_S": "0.5"}
    for k, v in env.items() if monkeypatch is not None else ():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[AgentProc, Path]]:
    """The real agent with the stand-in GPU, its runs under tmp_path/runs."""
    with AgentProc(env=smi_env(tmp_path)) as a:
        yield a, tmp_path


def test_the_agents_snapshots_runs_kill_and_prune_write_the_keys_the_client_reads(
        host: tuple[AgentProc, Path]) -> None:
    a, tmp = host
    runs_dir, marker = str(tmp / "runs"), f"adoptme{os.getpid()}"
    a.call("configure", {"interval": 0.2, "match": marker, "runs_dir": runs_dir})
    policy = compile_policy(parse_config('[run]\nrestart = "on-failure"\nrestart_delay = 0.2\nmax_restarts = 1\n'))
    gpu = tmp / "gpu"
    hold = ("import os, sys, time; open(os.path.join(sys.argv[1], str(os.getpid())), 'w').write('256');"
            " print('step 1 loss 0.5', flush=True); time.sleep(120)")
    live = a.call("launch", {"name": "live", "argv": [sys.executable, "-c", hold, str(gpu)], "cwd": str(tmp),
                             "env": {}})
    failing = a.call("launch", {"name": "fails", "argv": [sys.executable, "-c", "raise SystemExit(3)"],
                                "cwd": str(tmp), "env": {}, "restart": policy})
    with pytest.raises(AgentCallError, match="did not start"):  # its record says why: `runs` lists it
        a.call("launch", {"name": "nowhere", "argv": ["/nonexistent/e3-binary"], "cwd": str(tmp), "env": {}})
    adopted = __import__("subprocess").Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        def snap() -> dict[str, Any] | None:
            s = a.call("snapshot")
            by = {r["run_id"]: r for r in s["runs"]}
            ok = (by.get(live["run_id"], {}).get("pace") and any(r.get("external") for r in s["runs"])
                  and by.get(failing["run_id"], {}).get("attempts") and any(g["processes"] for g in s["gpus"]))
            return s if ok else None

        s = wait(snap)
        records = s["runs"] + a.call("runs")["runs"] + [live, failing]
        run_dir = os.path.join(runs_dir, failing["run_id"])  # a Slurm run's record, squeue's word handed in
        (Path(run_dir) / slurm.SLURM_FILE).write_text(json.dumps({"job_id": "12"}))
        records.append(slurm.record(run_dir, {"12": {"state": "PENDING", "reason": "Resources", "nodes": "n1"}}))
        same_keys(keys(records), RunRecord.KEYS, RunRecord.UNREAD, "run record")
        same_keys(keys(s["processes"]), ProcReading.KEYS, PROC_UNREAD, "process", NODE)
        assert parse_message(dict(s, type="snapshot"))

        report = a.call("kill", {"run_id": live["run_id"], "graces": [0.5, 0.5], "gpu_wait": 5}, timeout=60)
        assert KillReport.parse(report).gpus_free is True
        same_keys(keys(report["stages"]), KillStage.KEYS, (), "kill stage", {"job_id": "remote/run/slurmkill.py"})
        same_keys(keys(report["gpus"]), GpuFreed.KEYS, (), "kill's GPU", {"node": "remote/run/slurmkill.py"})
        pruned = a.call("prune", {"keep": 0, "dry_run": True})
        same_keys(keys(pruned["removed"] + pruned["skipped"]), PruneEntry.KEYS, (), "prune",
                  {"reason": "remote/run/rundir.py"})  # a kept run's only (one not ours: tests/test_host_trust.py)
    finally:
        adopted.kill()
        adopted.wait()


def test_a_job_nodes_view_writes_the_keys_the_client_reads() -> None:
    node = nodeagent.NodeAgent("r1", "12", "gpu-node3", how="no-such-way")  # ends at once: says why
    down = node.info()
    node.error, node.latest = None, {"host": host_info(), "gpus": [{"index": 0, "processes": []}],
                                     "processes": [{"pid": 1, "run_id": "r1", "why": ["run"]}]}
    node.ended.clear()
    up, shown = node.info(), node.shown()
    same_keys(keys([down, up]), JobNode.KEYS, JOB_NODE_UNREAD, "job node")
    assert "node" in keys(shown["gpus"]) and "node" in keys(shown["processes"])
    assert procfs.boot_time() > 0

