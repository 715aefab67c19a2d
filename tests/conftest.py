"""Shared fixtures: a real OpenSSH sshd (session-scoped) and a started local agent client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.slurm import LINES as SLURM_LINES
from tests.slurm import Cluster
from tests.slurm import missing as slurm_missing
from tests.sshd import Sshd, sshd_missing
from tui.transport import AgentClient, LocalLink


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A running sshd on 127.0.0.1 with throw-away keys; see tests/sshd.py."""
    reason = sshd_missing()
    if reason:  # never a silent skip: ./tests/run installs it when it can
        pytest.fail(reason, pytrace=False)
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[AgentClient]:
    """The real agent (remote/agent.py) over LocalLink, started; runs go to tmp_path/runs."""
    c = AgentClient(LocalLink(runs_dir=str(tmp_path / "runs")))
    await c.start()
    yield c
    await c.close()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A real single-node Slurm cluster (tests/slurm.py); fails with one line saying what
    to install when slurm-wlm or munge is missing, never skips."""
    why = slurm_missing()
    if why:
        pytest.fail(why, pytrace=False)
    with Cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The Slurm tier's story (submit → pending reason → running → kill → GPUs free; a
    failed job's exit code), printed in every run's summary so CI output shows it."""
    if SLURM_LINES:
        terminalreporter.section("Slurm tier")
        for line in SLURM_LINES:
            terminalreporter.write_line(line)
