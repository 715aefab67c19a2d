"""Shared set-up for the patch CLI and screen tests: a temp site-packages holding the
real speculators 0.3.0 files, found by the "host" Python (sys.executable) through
PYTHONPATH, and the real local agent."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests import spec_wheel
from tui.transport import AgentClient, LocalLink

SET = "speculators-0.3.0-vllm-0.16"
GEN = "data_generation/vllm_hidden_states_generator.py"
WORKER = "data_generation/custom_worker.py"
PY = sys.executable  # the "host" python
HAND_EDIT = (b"MAX_NUM_SEQS = 32", b"MAX_NUM_SEQS = 8  # hand edit")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The unpacked wheel; PYTHONPATH points at it so the agent's host python finds it."""
    site = tmp_path / "site-packages"
    spec_wheel.unpack(site)
    monkeypatch.setenv("PYTHONPATH", str(site))  # the agent and its host python inherit it
    monkeypatch.setenv("EAGLE3_TUI_JOURNAL_DIR", str(tmp_path / "patch-journal"))  # not ~/.cache
    return site


@pytest.fixture
async def client(site: Path, tmp_path: Path) -> AsyncIterator[AgentClient]:
    """The real agent over LocalLink, started."""
    c = AgentClient(LocalLink(runs_dir=str(tmp_path / "runs")), reconnect=False)
    await c.start()
    yield c
    await c.close()


def pkg(site: Path, rel: str) -> Path:
    """A file of the installed speculators package."""
    return site / "speculators" / rel


def hand_edit(site: Path) -> bytes:
    """Edit the generator file by hand (as a user would); returns the new bytes."""
    gen = pkg(site, GEN)
    data = gen.read_bytes()
    assert HAND_EDIT[0] in data
    edited = data.replace(*HAND_EDIT)
    gen.write_bytes(edited)
    return edited
