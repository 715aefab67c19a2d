"""Shared fixtures: a real OpenSSH sshd (session-scoped)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.sshd import Sshd, sshd_missing


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A running sshd on 127.0.0.1 with throw-away keys; see tests/sshd.py."""
    reason = sshd_missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail("sshd missing: .ci/run must install openssh-server")
        pytest.skip(reason)
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    server.start()
    yield server
    server.stop()
