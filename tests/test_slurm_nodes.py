"""A Slurm job on two nodes, on a real two-node cluster: each node's GPUs and the
job's processes through its own `srun --overlap` step, the kill's GPU-free proof
read on both, and a node whose step cannot start said in one line while the other
node is still shown.

The two nodes are two real slurmd daemons on this machine (tests/slurm.py
`Cluster(nodes=2)`: Debian's slurmd runs one per `-N name`, each with its own port,
spool and log); jobs, steps, `--overlap` and scancel are Slurm's own. Stand-ins:
the GPUs (tests/slurm.py NODE_SMI: each node's `nvidia-smi` lists the processes of
its own node, told apart by SLURMD_NODENAME, since both nodes share one kernel), and
for the same reason each node's process table shows the other node's processes
too; the assertions read processes from each node's GPU listing.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_driver import AgentProc
from tests.slurm import Cluster, missing
from tests.test_slurm import GIB, e3, in_state, login_agent_on, say, wait_for
from tui.protocol.ops import KillReport
from tui.state import view

WORKER = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    why = missing()
    if why:
        pytest.fail(why, pytrace=False)
    with Cluster(tmp_path_factory.mktemp("slurm2"), nodes=2) as cluster:
        yield cluster


@pytest.fixture()
def login(two_nodes: Cluster, tmp_path: Path) -> Iterator[AgentProc]:
    """The agent as on a login node: no GPU of its own."""
    yield from login_agent_on(two_nodes, tmp_path)


def launch_on_two(a: AgentProc, name: str) -> dict:
    """A run whose job spans both nodes (`--gpus=2` for the job, one GPU a node): its
    batch script runs `srun`, one worker a node, each holding its node's GPU."""
    rec = a.call("launch", {"name": name, "argv": ["srun", "--ntasks-per-node=1", sys.executable, "-u", "-c", WORKER],
                            "cwd": str(a.tmp), "env": {"HOLDS_GPU": "1"},  # type: ignore[attr-defined]
                            "scheduler": {"kind": "slurm", "partition": "debug", "gpus": 2, "time": "10",
                                          "sbatch_args": ["--nodes=2", "--ntasks-per-node=1"]}})
    run = wait_for(in_state(a, rec["run_id"], "running"), 30, "the job to run on both nodes")
    assert run["nodes"] == "e3node[1-2]" and run["node_gpus"] == [1, 1], run
    wait_for(lambda: Path(run["log"]).exists() and Path(run["log"]).read_text().count("up") == 2 or None,
             30, "both workers' first line")
    return run


def held(gpu: dict) -> dict[int, int]:
    return {p["pid"]: p["mem"] for p in gpu["processes"]}


def test_a_two_node_job_shows_each_nodes_gpus_and_the_kill_proves_both(login: AgentProc) -> None:
    a = login
    run = launch_on_two(a, "twonode")
    job = run["job_id"]
    a.call("follow_job", {"run_id": run["run_id"]})

    def both() -> dict | None:
        snap = a.call("snapshot")
        up = [n for n in snap.get("job_nodes") or [] if n["error"] is None]
        return snap if len(up) == 2 and len(snap["gpus"]) == 2 else None

    snap = wait_for(both, 40, "both nodes' agents")
    assert [n["node"] for n in snap["job_nodes"]] == ["e3node1", "e3node2"], snap["job_nodes"]
    assert snap["gpu_source"] == "nvidia-smi via srun on 2 of 2 nodes", snap["gpu_source"]
    by_node = {g["node"]: g for g in snap["gpus"]}
    for node, info in zip(("e3node1", "e3node2"), snap["job_nodes"]):
        gpu = by_node[node]
        # Read inside a step of the job on that node: the stand-in names job and step.
        assert gpu["name"].startswith("Stand-in GPU job %s step " % job), gpu
        assert info["via"].startswith("srun step %s." % job) and info["via"].endswith(" on " + node), info
        assert list(held(gpu).values()) and all(m == GIB for m in held(gpu).values()), gpu
        say("two nodes: %s's GPU through %s: %s, run pids %s"
            % (node, info["via"], gpu["name"], sorted(held(gpu))))
    assert not set(held(by_node["e3node1"])) & set(held(by_node["e3node2"])), snap["gpus"]
    assert {p["node"] for p in snap["processes"]} == {"e3node1", "e3node2"}, snap["processes"]

    report = a.call("kill", {"run_id": run["run_id"], "graces": [5, 5], "gpu_wait": 15}, timeout=120)
    assert report["ok"] and report["gpus_free"] is True, report
    assert report["note"] == "GPU proof read on 2 of 2 nodes", report
    assert [(p["node"], p["gpus_free"]) for p in report["node_proofs"]] == [("e3node1", True), ("e3node2", True)]
    assert sorted(g["node"] for g in report["gpus"]) == ["e3node1", "e3node2"], report
    assert all(g["run_mem_before"] == g["freed"] and g["run_mem"] == 0 for g in report["gpus"]), report
    lines = view.describe_kill(KillReport.parse(report))
    say("two nodes: kill: " + " | ".join(lines))
    assert any(line.startswith("e3node1 GPU 0: ") for line in lines), lines
    assert any(line.startswith("e3node2 GPU 0: ") for line in lines), lines
    wait_for(in_state(a, run["run_id"], "killed"), 30, "the killed job")
    assert "job_nodes" not in a.call("snapshot")


def test_the_kill_command_proves_both_nodes_free(login: AgentProc, two_nodes: Cluster) -> None:
    # `eagle3-tui kill` (no dashboard following the job) reads the proof on every node too.
    run = launch_on_two(login, "clikill")
    tmp: Path = login.tmp  # type: ignore[attr-defined]
    (tmp / "eagle3.toml").write_text('[host]\nruns_dir = "%s"\n[run]\ngraces = [5, 5]\ngpu_wait = 15\n'
                                     % (tmp / "runs"))
    out = e3(two_nodes, tmp, "kill", run["run_id"], "--yes", timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    first = out.stdout.splitlines()[0]
    assert "GPUs free after" in first and "(GPU proof read on 2 of 2 nodes)" in first, out.stdout
    assert "e3node1: GPUs free" in out.stdout and "e3node2: GPUs free" in out.stdout, out.stdout
    say("two nodes: CLI kill: " + first)


def test_a_node_whose_step_cannot_start_is_one_line_and_the_other_node_stays(
        login: AgentProc, two_nodes: Cluster) -> None:
    a = login
    run = launch_on_two(a, "halfway")
    two_nodes.stop_slurmd("e3node2")  # the node stops answering; its worker goes on
    try:
        marks = a.mark()
        a.call("follow_job", {"run_id": run["run_id"]})

        def said() -> dict | None:
            a.call("snapshot")
            return next((m for m in a.messages[marks:] if m.get("type") == "error"
                         and "no agent on e3node2" in m.get("message", "")), None)

        err = wait_for(said, 60, "the failure on e3node2")

        def one_up() -> dict | None:
            snap = a.call("snapshot")
            return snap if snap["gpus"] and snap["job_nodes"][0]["error"] is None else None

        snap = wait_for(one_up, 40, "e3node1's agent")
    finally:
        two_nodes.start_slurmd("e3node2")
    assert "\n" not in err["message"] and err["message"].endswith(
        "; its GPUs are not shown, the job's other nodes are"), err
    assert [g["node"] for g in snap["gpus"]] == ["e3node1"], snap["gpus"]
    assert snap["job_nodes"][1]["node"] == "e3node2" and snap["job_nodes"][1]["error"], snap["job_nodes"]
    say("two nodes, one down: " + err["message"])
    wait_for(lambda: subprocess.run(["scontrol", "ping"], env=two_nodes.env, capture_output=True).returncode == 0
             or None, 30, "slurmctld")
    report = a.call("kill", {"run_id": run["run_id"], "graces": [5, 5], "gpu_wait": 15}, timeout=150)
    assert report["gpus_free"] is None and report["note"].startswith(
        "GPU proof read on 1 of 2 nodes; none from e3node2 ("), report
    assert [(p["node"], p["gpus_free"]) for p in report["node_proofs"]] == [("e3node1", True), ("e3node2", None)]
    say("two nodes, one down: kill: " + view.kill_verdict(KillReport.parse(report)))
