"""Shared fixtures: a real OpenSSH sshd (session-scoped) and a started local agent client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

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
