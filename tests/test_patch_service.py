"""tui/services/patches.py against the REAL agent (remote/agent/main.py over LocalLink) and a real
file tree: a temp site-packages holding the real speculators 0.3.0 wheel, found by the
host Python (sys.executable) through PYTHONPATH."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests import spec_wheel
from tests.agent_driver import AgentProc
from tui.services import patches as S
from tui.state import patches as P
from tui.transport import AgentApi, AgentClient, LinkLost

SET = "speculators-0.3.0-vllm-0.16"
GEN = "data_generation/vllm_hidden_states_generator.py"
WORKER = "data_generation/custom_worker.py"
PY = sys.executable  # the "host" python


from tests.patch_fixtures import client, site  # noqa: E402,F401 - shared fixtures


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    return tmp_path / "user-patches"


@pytest.fixture(scope="module")
def pset() -> P.PatchSet:
    return P.load_set_dir(P.bundled_sets_dir() / SET)


@pytest.fixture(scope="module")
def pristine() -> dict[str, bytes]:
    return spec_wheel.pristine_files()


def pkg(site: Path, rel: str) -> Path:
    return site / "speculators" / rel


async def test_status_of_a_fresh_install(client: AgentClient, site: Path, user_dir: Path) -> None:
    st = await S.status(client, SET, PY, user_dir=user_dir)
    assert st["state"] == "pristine" and "version" not in st
    assert st["distribution_version"] == "0.3.0" and st["target"] == "speculators 0.3.0"
    assert st["files"][GEN]["abs_path"] == str(pkg(site, GEN))
    assert st["files"][WORKER]["state"] == "pristine,v1,v2"
    assert not st["files"][GEN]["backup"]


async def test_push_versions_then_rollback(client: AgentClient, site: Path, user_dir: Path,
                                           pset: P.PatchSet, pristine: dict[str, bytes]) -> None:
    gen, backup = pkg(site, GEN), Path(str(pkg(site, GEN)) + S.BACKUP_SUFFIX)
    mode = gen.stat().st_mode
    rep = await S.push(client, SET, "v1", PY, user_dir=user_dir)
    assert rep["state"] == "v1" and rep["previous_state"] == "pristine" and rep["written"] == [GEN]
    assert backup.read_bytes() == pristine[GEN]  # backed up once, from the pristine file
    assert not Path(str(pkg(site, WORKER)) + S.BACKUP_SUFFIX).exists()  # untouched file
    rep = await S.push(client, SET, "latest", PY, user_dir=user_dir)
    assert rep["state"] == rep["version"] == "v5" and rep["written"] == [GEN, WORKER]
    assert gen.read_bytes() == P.build_version(pset, "v5", pristine)[GEN]
    assert gen.stat().st_mode == mode
    assert backup.read_bytes() == pristine[GEN]  # still the pristine file, not v1
    again = await S.push(client, SET, "v5", PY, user_dir=user_dir)
    assert again["written"] == []  # already there: nothing rewritten
    rep = await S.rollback(client, SET, PY, to="v3", user_dir=user_dir)
    assert rep["state"] == "v3" and rep["written"] == [GEN]
    rep = await S.rollback(client, SET, PY, user_dir=user_dir)
    assert rep["state"] == "pristine"
    assert {r: pkg(site, r).read_bytes() for r in pristine} == pristine


async def test_hand_edit_is_refused_then_forced(client: AgentClient, site: Path, user_dir: Path,
                                                pset: P.PatchSet, pristine: dict[str, bytes]) -> None:
    await S.push(client, SET, "v2", PY, user_dir=user_dir)
    gen = pkg(site, GEN)
    edited = gen.read_bytes().replace(b"MAX_NUM_SEQS = 32", b"MAX_NUM_SEQS = 8  # hand edit")
    gen.write_bytes(edited)
    assert (await S.status(client, SET, PY, user_dir=user_dir))["state"] == "unknown"
    with pytest.raises(S.PatchServiceError) as info:
        await S.push(client, SET, "latest", PY, user_dir=user_dir)
    assert "edited by hand" in str(info.value) and "\n" not in str(info.value)
    assert "+MAX_NUM_SEQS = 8  # hand edit" in info.value.detail
    assert "-MAX_NUM_SEQS = 32" in info.value.detail
    assert gen.read_bytes() == edited  # untouched
    rep = await S.push(client, SET, "latest", PY, force=True, user_dir=user_dir)
    assert rep["state"] == "v5" and rep["forced"]
    assert gen.read_bytes() == P.build_version(pset, "v5", pristine)[GEN]


async def test_capture_a_hand_edit_as_a_new_version(client: AgentClient, site: Path,
                                                    user_dir: Path, pset: P.PatchSet) -> None:
    await S.push(client, SET, "latest", PY, user_dir=user_dir)
    gen = pkg(site, GEN)
    edited = gen.read_bytes().replace(b"CACHE_MEMORY_FRACTION = 0.2", b"CACHE_MEMORY_FRACTION = 0.3")
    gen.write_bytes(edited)
    rep = await S.capture(client, SET, PY, "v6", "KV cache fraction 0.3", user_dir=user_dir)
    assert Path(rep["diff_file"]).is_file()
    mine = P.load_set(SET, user_dir=user_dir)
    assert mine.user and P.version_order(mine) == P.version_order(pset) + ["v6"]
    st = await S.status(client, SET, PY, user_dir=user_dir)
    assert st["state"] == "v6"
    await S.push(client, SET, "v4", PY, user_dir=user_dir)
    await S.push(client, SET, "v6", PY, user_dir=user_dir)
    assert gen.read_bytes() == edited
    with pytest.raises(S.PatchServiceError, match="nothing to capture: the host files are v6"):
        await S.capture(client, SET, PY, "v7", "again", user_dir=user_dir)
    # The bundled set is untouched.
    assert P.version_order(P.load_set_dir(P.bundled_sets_dir() / SET)) == P.version_order(pset)


class EditsBeforeApply(AgentApi):
    """The real client, but a second writer changes `victim` just before the push's
    writes reach the host (after every file was read and compiled)."""

    def __init__(self, client: AgentClient, victim: Path) -> None:
        self.client, self.victim = client, victim

    async def request(self, op: str, **args: Any) -> dict[str, Any]:
        if op == "patch_apply":
            self.victim.write_bytes(self.victim.read_bytes() + b"# someone else\n")
        return await self.client.request(op, **args)


async def test_a_file_changed_before_the_writes_refuses_the_whole_push(
        client: AgentClient, site: Path, user_dir: Path, pristine: dict[str, bytes]) -> None:
    """Every hash is checked on the host before the first write: nothing is written."""
    worker = pkg(site, WORKER)
    with pytest.raises(S.PatchServiceError) as info:
        await S.push(EditsBeforeApply(client, worker), SET, "latest", PY, user_dir=user_dir)
    msg = str(info.value)
    assert f"{worker} changed" in msg and "nothing was written" in msg
    assert pkg(site, GEN).read_bytes() == pristine[GEN]  # never written
    assert worker.read_bytes() == pristine[WORKER] + b"# someone else\n"  # theirs, kept


class HoldsApply(AgentApi):
    """The real client, but the push's `patch_apply` is held: before it reaches the agent
    (`after=False`) or after the agent has answered it (`after=True`)."""

    def __init__(self, client: AgentClient, after: bool) -> None:
        self.client, self.after = client, after
        self.holding, self.release = asyncio.Event(), asyncio.Event()

    async def request(self, op: str, **args: Any) -> dict[str, Any]:
        if op != "patch_apply":
            return await self.client.request(op, **args)
        if not self.after:
            self.holding.set()
            await self.release.wait()
        result = await self.client.request(op, **args)
        if self.after:
            self.holding.set()
            await self.release.wait()
        return result


@pytest.mark.parametrize("after", [False, True], ids=["before-agent", "after-agent"])
async def test_cancelled_push_is_all_or_nothing(
        client: AgentClient, site: Path, user_dir: Path, pset: P.PatchSet,
        pristine: dict[str, bytes], after: bool) -> None:
    """Cancelling a push (a dismissed screen, Ctrl-C) waits for its one request: the host
    is then wholly pristine or wholly the version, never a mix."""
    held = HoldsApply(client, after)
    task = asyncio.create_task(S.push(held, SET, "latest", PY, user_dir=user_dir))
    await asyncio.wait_for(held.holding.wait(), 20)
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done()  # the cancellation waits for the request
    held.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    now = {r: pkg(site, r).read_bytes() for r in pristine}
    assert now == P.build_version(pset, P.latest(pset).name, pristine)
    assert (await S.status(client, SET, PY, user_dir=user_dir))["state"] == P.latest(pset).name


class DropsOnWrite(AgentApi):
    """The real client, but the link drops when the push would write (nothing written)."""

    def __init__(self, client: AgentClient) -> None:
        self.client = client

    async def request(self, op: str, **args: Any) -> dict[str, Any]:
        if op in ("file_write", "patch_apply"):
            raise LinkLost("connection to gpu-box lost")
        return await self.client.request(op, **args)


async def test_would_refuse_reads_but_never_writes(
        client: AgentClient, site: Path, user_dir: Path, pristine: dict[str, bytes]) -> None:
    """The dry run answers None when a push would go ahead, the refusal (with its
    hand-edit diff) when not, and never sends a write."""
    no_writes = DropsOnWrite(client)
    assert await S.would_refuse(no_writes, SET, "latest", PY, user_dir=user_dir) is None
    assert await S.would_refuse(no_writes, SET, P.PRISTINE, PY, user_dir=user_dir) is None
    assert {r: pkg(site, r).read_bytes() for r in pristine} == pristine
    await S.push(client, SET, "v2", PY, user_dir=user_dir)  # leaves the pristine backup
    gen = pkg(site, GEN)
    edited = gen.read_bytes().replace(b"MAX_NUM_SEQS = 32", b"MAX_NUM_SEQS = 8  # hand edit")
    gen.write_bytes(edited)
    for goal in ("v1", P.PRISTINE):
        refused = await S.would_refuse(no_writes, SET, goal, PY, user_dir=user_dir)
        assert refused is not None and "edited by hand" in str(refused)
        assert "+MAX_NUM_SEQS = 8  # hand edit" in refused.detail
    assert await S.would_refuse(no_writes, SET, "v1", PY, force=True, user_dir=user_dir) is None
    assert gen.read_bytes() == edited


async def test_rollback_without_backup_reverses_the_known_version(
        client: AgentClient, site: Path, user_dir: Path, pristine: dict[str, bytes]) -> None:
    await S.push(client, SET, "latest", PY, user_dir=user_dir)
    for rel in pristine:
        Path(str(pkg(site, rel)) + S.BACKUP_SUFFIX).unlink()
    rep = await S.rollback(client, SET, PY, user_dir=user_dir)
    assert rep["state"] == "pristine"
    assert {r: pkg(site, r).read_bytes() for r in pristine} == pristine


async def test_hand_edit_without_backup_cannot_be_forced(client: AgentClient, site: Path,
                                                         user_dir: Path) -> None:
    gen = pkg(site, GEN)
    gen.write_bytes(gen.read_bytes() + b"# edit\n")
    with pytest.raises(S.PatchServiceError, match="no pristine copy"):
        await S.push(client, SET, "latest", PY, force=True, user_dir=user_dir)


async def test_missing_package_and_bad_version(client: AgentClient, user_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(P.PatchError, match="no version 'v9'"):
        await S.push(client, SET, "v9", PY, user_dir=user_dir)
    with pytest.raises(Exception, match="not found"):
        await S.status(client, SET, "/nonexistent/python3", user_dir=user_dir)


def test_killed_writer_leaves_old_or_new_never_half(site: Path) -> None:
    """SIGKILL the agent while it writes (its temp file exists, the rename has not
    happened): the target is the old file or the new one, never a mix."""
    target = pkg(site, GEN)
    old = target.read_bytes()
    new = (b"# new\n" * 2_000_000)[: 12 << 20]  # 12 MiB: the write takes a while
    tmp_prefix = "." + target.name + "."
    killed_mid_write = 0
    for _ in range(5):
        before = target.read_bytes()
        with AgentProc() as agent:
            agent.send("file_write", {"path": str(target), "b64": base64.b64encode(new).decode(),
                                      "expect_sha256": P.sha256(before), "backup": None})
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if any(n.startswith(tmp_prefix) for n in os.listdir(target.parent)):
                    os.kill(agent.proc.pid, signal.SIGKILL)
                    break
                if target.read_bytes() != before:
                    break  # finished before we saw the temp file
            agent.proc.wait(timeout=10)
        after = target.read_bytes()
        assert after in (old, new)
        if after == before and any(n.startswith(tmp_prefix) for n in os.listdir(target.parent)):
            killed_mid_write += 1
        if after == new:
            target.write_bytes(old)
    assert killed_mid_write >= 1  # the kill really landed between temp write and rename


class WrongBytesAfterWrite(AgentApi):
    """The real client, but right after the agent reports the write of ``victim`` done,
    the file holds other bytes (a file system or a second writer that loses the write):
    the write said ok, the host has the wrong file."""

    def __init__(self, client: AgentClient, victim: Path) -> None:
        self.client, self.victim = client, victim

    async def request(self, op: str, **args: Any) -> dict[str, Any]:
        r = await self.client.request(op, **args)
        if op == "patch_apply" or (op == "file_write" and args.get("path") == str(self.victim)):
            self.victim.write_bytes(self.victim.read_bytes().replace(b"def ", b"def  ", 1))
        return r


async def test_a_write_that_says_ok_but_leaves_wrong_bytes_fails_the_push(
        client: AgentClient, site: Path, user_dir: Path) -> None:
    """The push reads back what it wrote: a file that does not have the version's bytes
    fails it, naming the file, however the writes answered."""
    worker = pkg(site, WORKER)
    with pytest.raises(S.PatchServiceError, match="verification failed after writing") as info:
        await S.push(WrongBytesAfterWrite(client, worker), SET, "latest", PY, user_dir=user_dir)
    assert str(worker) in str(info.value)


async def test_a_user_version_whose_diff_no_longer_applies_is_refused_in_one_line(
        client: AgentClient, site: Path, user_dir: Path) -> None:
    """The user's captured version, its diff file edited by hand afterwards so that it no
    longer applies to the pristine files: the push is refused with one line naming the
    file and hunk (the CLI and the screen show it), and nothing on the host changes."""
    await S.push(client, SET, "latest", PY, user_dir=user_dir)
    gen = pkg(site, GEN)
    gen.write_bytes(gen.read_bytes().replace(b"CACHE_MEMORY_FRACTION = 0.2", b"CACHE_MEMORY_FRACTION = 0.3"))
    rep = await S.capture(client, SET, PY, "v6", "KV cache fraction 0.3", user_dir=user_dir)
    await S.push(client, SET, "v5", PY, user_dir=user_dir)
    before = {r: pkg(site, r).read_bytes() for r in (GEN, WORKER)}
    diff = Path(rep["diff_file"])
    diff.write_text(diff.read_text().replace("CACHE_MEMORY_FRACTION = 0.2", "CACHE_MEMORY_FRACTION = 0.25"))
    with pytest.raises(S.PatchServiceError) as info:
        await S.push(client, SET, "v6", PY, user_dir=user_dir)
    assert str(info.value) == f"{GEN}: hunk 1 (at line 27) does not match the file"
    assert {r: pkg(site, r).read_bytes() for r in (GEN, WORKER)} == before
