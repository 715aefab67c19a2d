"""`squeue --json` and `sacct --json` as real clusters printed them, Slurm 23.02 to
25.05 (tests/fixtures/slurm, README there names each file's source): state as a
string or a list, exit_code as a wait status, a number object or {status,
return_code, signal} with number objects inside, node lists, state reasons, and
gres_detail's GPUs on each node of a job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remote.run import slurm

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "slurm"


def squeue(version: str) -> dict[str, dict]:
    return slurm.parse_squeue((FIXTURES / f"squeue-{version}.json").read_text())


def sacct(version: str, job: int) -> dict | None:
    return slurm.parse_sacct((FIXTURES / f"sacct-{version}.json").read_text(), str(job))


def fields(rec: dict, *keys: str) -> tuple:
    return tuple(rec[k] for k in keys)


# (version, job id, state, reason, nodes, exit code, signal, GPUs on each node)
SQUEUE = [
    ("23.02", 307, "COMPLETED", "None", "cn[001-050,052-065]", 0, None, []),  # state a string
    ("23.02", 310, "RUNNING", "None", "cn[052-067]", 0, None, []),  # exit_code a number object
    ("23.02", 326, "PENDING", "Resources", None, 0, None, []),  # nodes "" while pending
    ("23.11", 717, "COMPLETED", "None", "cn3", 0, None, []),  # state a list from here on
    ("23.11", 671, "PENDING", "Priority", None, 0, None, []),
    ("24.05", 649717, "TIMEOUT", "TimeLimit", "cn001", None, "SIGTERM", []),  # signal.id a number object
    ("24.05", 649719, "FAILED", "NonZeroExitCode", "cn001", 1, None, []),
    ("24.05", 649728, "RUNNING", "None", "cn[004-006]", 0, None, []),
    ("24.05", 649730, "PENDING", "BeginTime", None, 0, None, []),
    ("24.05", 11, "RUNNING", "None", "gpu[1-2]", 0, None, [4, 4]),  # --gpus=8 over two nodes
    ("24.11", 6355, "CANCELLED", "None", "ia1", None, "SIGTERM", []),
    ("24.11", 6359, "FAILED", "NonZeroExitCode", "cn1", 1, None, []),
    ("24.11", 6371, "RUNNING", "None", "ia[1-2]", 0, None, [6, 6]),  # two GPU types on each node
    ("24.11", 6356, "RUNNING", "None", "ia1", 0, None, [2]),
    ("25.05", 4730, "TIMEOUT", "TimeLimit", "cn1", None, "SIGTERM", []),
    ("25.05", 4732, "FAILED", "NonZeroExitCode", "cn1", 1, None, []),
    ("25.05", 4734, "RUNNING", "None", "cn[1-3]", 0, None, []),
    ("25.05", 4741, "PENDING", "Resources", None, 0, None, []),
    ("25.05", 4746, "RUNNING", "None", "gpu[1-2]", 0, None, [4, 4]),
]


@pytest.mark.parametrize("version,job,state,reason,nodes,code,sig,gpus", SQUEUE,
                         ids=[f"{v}-{j}-{s}" for v, j, s, *_ in SQUEUE])
def test_squeue_json_of_real_clusters(version: str, job: int, state: str, reason: str, nodes: str | None,
                                      code: int | None, sig: str | None, gpus: list[int]) -> None:
    got = squeue(version)[str(job)]
    assert fields(got, "state", "reason", "nodes", "exit_code", "signal", "node_gpus") == (
        state, reason, nodes, code, sig, gpus), got


# (version, job id, state, nodes, exit code, signal, elapsed s)
SACCT = [
    ("23.02", 307, "COMPLETED", "cn[001-050,052-065]", 0, None, 360),  # {status, return_code: 0}
    ("24.05", 649719, "FAILED", "cn001", 1, None, 1),
    ("24.05", 649717, "TIMEOUT", "cn001", None, None, 83),  # sacct says SUCCESS / 0 for it
    ("24.11", 6359, "FAILED", "cn1", 1, None, 1),
    ("24.11", 6357, "TIMEOUT", "cn1", None, None, 65),
    ("25.05", 4732, "FAILED", "cn1", 1, None, 2),
    ("25.05", 4730, "TIMEOUT", "cn1", None, None, 63),
    ("25.05", 4746, "RUNNING", "gpu[1-2]", None, None, 1),
]


@pytest.mark.parametrize("version,job,state,nodes,code,sig,elapsed", SACCT,
                         ids=[f"{v}-{j}-{s}" for v, j, s, *_ in SACCT])
def test_sacct_json_of_real_clusters(version: str, job: int, state: str, nodes: str, code: int | None,
                                     sig: str | None, elapsed: int) -> None:
    got = sacct(version, job)
    assert got is not None
    assert fields(got, "state", "nodes", "exit_code", "signal", "elapsed") == (state, nodes, code, sig, elapsed), got


def test_every_fixture_is_named_in_the_readme_with_its_source() -> None:
    readme = (FIXTURES / "README.md").read_text()
    for f in sorted(FIXTURES.glob("*.json")):
        assert f"`{f.name}`" in readme, f.name
        meta = json.loads(f.read_text())["meta"]
        assert meta["slurm"]["release"] in readme, (f.name, meta["slurm"]["release"])


@pytest.mark.parametrize("detail,want", [
    (["gpu:2(IDX:0-1)", "gpu:1(IDX:0)"], [2, 1]),  # --gpus=3 over two nodes (this machine's 22.05)
    (["gpu:a100:3(IDX:0-1,4)"], [3]),  # a comma inside the index list is no second gres
    (["gpu:h100:2(IDX:0-1),gpu:h200:4(IDX:2-5)"], [6]),
    (["nvme:1,gpu:1(IDX:0)"], [1]),
    ([""], [0]),
    ("gpu:1", None),  # not a list: squeue did not say
])
def test_node_gpus_reads_each_nodes_gres(detail: object, want: list[int] | None) -> None:
    assert slurm.node_gpus(detail) == want


def test_the_job_node_lists_expand_without_scontrol_for_one_name() -> None:
    assert slurm.hostnames("gpu7") == ["gpu7"]
