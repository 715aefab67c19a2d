"""A patch push is one transaction on the host (remote/journal.py): the real agent over
LocalLink, the real speculators files, and the agent SIGKILLed at EVERY step of a push
(its test hook EAGLE3_TUI_TEST_KILL_AT=N). After a restart the status is exactly
"pristine" or the pushed version, never "edited by hand" (unknown)."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from remote import journal
from tests import spec_wheel
from tests.patch_fixtures import GEN, PY, SET, WORKER, pkg, site  # noqa: F401 - fixture
from tui.services import patches as S
from tui.state import patches as P
from tui.transport import AgentApi, AgentClient, LocalLink


@pytest.fixture
def jdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "journal"
    monkeypatch.setenv(journal.JOURNAL_ENV, str(d))  # the agents inherit it
    return d


async def _client(tmp_path: Path) -> AgentClient:
    c = AgentClient(LocalLink(runs_dir=str(tmp_path / "runs")), reconnect=False)
    await c.start()
    return c


def _on_disk(site: Path, pristine: dict[str, bytes], v5: dict[str, bytes]) -> str:
    """What the files are right after the kill, before any agent starts again."""
    names = {}
    for rel in pristine:
        data = pkg(site, rel).read_bytes()
        names[rel] = "pristine" if data == pristine[rel] else "v5" if data == v5[rel] else "other"
    kinds = set(names.values())
    if len(kinds) == 1:
        return kinds.pop()
    return "MIXED " + ", ".join(f"{os.path.basename(r)}={k}" for r, k in names.items())


async def test_push_killed_at_every_step_is_pristine_or_the_version_after_restart(
        site: Path, jdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    pset = P.load_set_dir(P.bundled_sets_dir() / SET)
    pristine = spec_wheel.pristine_files()
    v5 = P.build_version(pset, "v5", pristine)
    user_dir = tmp_path / "user"
    rows = []
    mixed_seen = 0
    for n in range(1, 40):
        for rel, data in pristine.items():  # start each round pristine, no backups
            pkg(site, rel).write_bytes(data)
            Path(str(pkg(site, rel)) + S.BACKUP_SUFFIX).unlink(missing_ok=True)
        monkeypatch.setenv(journal.KILL_AT_ENV, str(n))
        client = await _client(tmp_path)
        monkeypatch.delenv(journal.KILL_AT_ENV)
        try:
            await S.push(client, SET, "v5", PY, user_dir=user_dir)
            finished = True
        except S.PatchServiceError as exc:
            finished, said = False, str(exc)
            assert "never half-patched" in said and "COULD NOT" not in said
        await client.close()
        if finished:
            rows.append((n, "(no step left: the push completed)", "v5", "v5"))
            break
        disk = _on_disk(site, pristine, v5)
        mixed_seen += disk.startswith("MIXED")
        assert (jdir / "journal.json").exists() or disk in ("pristine", "v5")
        client = await _client(tmp_path)  # a new agent: rolls the journal back first
        try:
            st = await S.status(client, SET, PY, user_dir=user_dir)
        finally:
            await client.close()
        assert st["state"] in ("pristine", "v5"), (n, st)
        assert not (jdir / "journal.json").exists()
        # and a push works again at once, without --force
        client = await _client(tmp_path)
        try:
            assert (await S.push(client, SET, "v5", PY, user_dir=user_dir))["state"] == "v5"
        finally:
            await client.close()
        rows.append((n, _step_name(said, tmp_path, n), disk, st["state"]))
    else:
        pytest.fail("the push never completed")
    # the kills landed where it matters: between the two files' writes
    assert mixed_seen >= 1, rows
    width = max(len(r[1]) for r in rows)
    text = "\n".join(
        [f"{'step':>4}  {'killed after':<{width}}  {'files on disk after the kill':<42}  status after restart"]
        + [f"{n:>4}  {name:<{width}}  {disk:<42}  {state}" for n, name, disk, state in rows]) + "\n"
    print("\n" + text)  # the table: step killed -> status after restart (pytest -s)


def _step_name(said: str, tmp_path: Path, n: int) -> str:
    """The step the agent named on stderr as it killed itself (the link error quotes it)."""
    m = re.search(rf"killed at step {n}: ([\w .-]*?)(?:\)|$|\.(?: |$))", said)
    return m.group(1).replace(str(tmp_path), "…") if m else f"step {n} ({said[:80]})"


async def test_a_journal_left_by_a_dead_agent_is_rolled_back_and_reported(
        site: Path, jdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    pset = P.load_set_dir(P.bundled_sets_dir() / SET)
    pristine = spec_wheel.pristine_files()
    monkeypatch.setenv(journal.KILL_AT_ENV, "5")  # after the first file's write
    client = await _client(tmp_path)
    monkeypatch.delenv(journal.KILL_AT_ENV)
    with pytest.raises(S.PatchServiceError):
        await S.push(client, SET, "v5", PY, user_dir=tmp_path / "u")
    await client.close()
    assert pkg(site, GEN).read_bytes() == P.build_version(pset, "v5", pristine)[GEN]  # half done
    assert json.loads((jdir / "journal.json").read_text())["target"] == "v5"
    from tests.agent_driver import AgentProc

    with AgentProc(env={"EAGLE3_TUI_GPU_SOURCE": "none"}) as agent:
        rec = agent.hello["patch_recovered"]
        assert rec["target"] == "v5" and rec["restored"] == [str(pkg(site, GEN))]
        agent.wait_for(lambda m: m["type"] == "error" and m["message"]
                       == f"an interrupted patch push to v5 was rolled back: {pkg(site, GEN)}")
    assert {r: pkg(site, r).read_bytes() for r in pristine} == pristine


@pytest.mark.needs_root("trust: a patch journal another user owns (chown to nobody)")
def test_a_planted_journal_is_refused(site: Path, jdir: Path, tmp_path: Path) -> None:  # noqa: F811
    """Someone else's journal would have the agent "restore" any file: never used."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"mine\n")
    jdir.mkdir(mode=0o700)
    (jdir / "orig-0").write_bytes(b"theirs\n")
    (jdir / "journal.json").write_text(json.dumps({"target": "v1", "files": [{
        "path": str(victim), "orig_sha256": P.sha256(b"theirs\n"), "new_sha256": None}]}))
    for p in (jdir / "orig-0", jdir / "journal.json"):
        os.chown(p, 65534, 65534)
    from tests.agent_driver import AgentProc

    with AgentProc(env={"EAGLE3_TUI_GPU_SOURCE": "none"}) as agent:
        rec = agent.hello["patch_recovered"]
        assert "cannot roll back" in rec["error"] and "nobody (uid 65534)" in rec["error"]
    assert victim.read_bytes() == b"mine\n"
    assert sys.executable


class KillsAgentAfterFirstWrite(AgentApi):
    """The real client; the agent is SIGKILLed as soon as a write of the push has
    answered (the reported case: the agent dies between two file writes). With one
    transaction there is one write request, so the kill lands after it."""

    def __init__(self, client: AgentClient, pid: int) -> None:
        self.client, self.pid = client, pid

    async def request(self, op: str, **args: object) -> dict:
        result = await self.client.request(op, **args)
        if op in ("file_write", "patch_apply"):
            os.kill(self.pid, signal.SIGKILL)
        return result


async def test_agent_killed_between_the_writes_of_a_push_is_never_edited_by_hand(
        site: Path, jdir: Path, tmp_path: Path) -> None:  # noqa: F811
    client = AgentClient(LocalLink(runs_dir=str(tmp_path / "runs")), reconnect=False)
    hello = await client.start()
    try:
        await S.push(KillsAgentAfterFirstWrite(client, hello.pid), SET, "v5", PY, user_dir=tmp_path / "u")
    except Exception as exc:  # noqa: BLE001 - the push's error, or the link lost right after it
        assert "COULD NOT" not in str(exc)
    await client.close()
    client = await _client(tmp_path)
    try:
        st = await S.status(client, SET, PY, user_dir=tmp_path / "u")
        assert st["state"] in ("pristine", "v5"), st["state"]
        assert (await S.push(client, SET, "v5", PY, user_dir=tmp_path / "u"))["state"] == "v5"  # no --force
    finally:
        await client.close()


def test_a_write_that_fails_mid_push_is_rolled_back_on_the_host(jdir: Path, tmp_path: Path) -> None:
    """The second file cannot be written (its folder is gone): the agent puts the first
    back from the journal before it answers, and says so; no journal is left."""
    from remote.wire import BadRequest

    first = tmp_path / "a.py"
    first.write_bytes(b"old\n")
    gone = tmp_path / "missing-dir" / "b.py"
    files = [{"path": str(first), "data": b"new\n", "expect_sha256": P.sha256(b"old\n"), "backup": None},
             {"path": str(gone), "data": b"x\n", "expect_sha256": None, "backup": None}]
    with pytest.raises(BadRequest, match=rf"patch push to v9 failed \(FileNotFoundError: \[Errno 2\] .*\); rolled back {first}$"):
        journal.apply(files, "v9")
    assert first.read_bytes() == b"old\n" and not (jdir / "journal.json").exists()
    assert sorted(p.name for p in jdir.iterdir()) == [".lock"]


def test_a_push_waits_for_another_agents_push_to_finish(jdir: Path, tmp_path: Path) -> None:
    """Two agents of one user on a host (two terminals): a push that finds the other's
    push under way waits for it (the lock is held only for the seconds a push takes),
    and then goes ahead, instead of refusing at once."""
    import fcntl
    import threading
    import time

    target = tmp_path / "a.py"
    target.write_bytes(b"old\n")
    jdir.mkdir(mode=0o700)
    held = os.open(jdir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # the other agent's push, under way
    threading.Timer(0.5, lambda: os.close(held)).start()
    t0 = time.monotonic()
    journal.apply([{"path": str(target), "data": b"new\n", "expect_sha256": P.sha256(b"old\n"),
                    "backup": None}], "v2")
    assert time.monotonic() - t0 >= 0.4
    assert target.read_bytes() == b"new\n"


def test_a_file_changed_on_the_host_is_named_with_both_hashes(jdir: Path, tmp_path: Path) -> None:
    """A file another hand changed, or removed, since the client read it: the refusal says
    which file and what the host has now against what the client read, so the user can
    tell a colleague's edit from a removed install; nothing is written."""
    from remote.wire import BadRequest

    edited, removed, made = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    edited.write_bytes(b"theirs\n")
    made.write_bytes(b"theirs\n")  # a file the push adds, made meanwhile by someone else
    theirs, old = P.sha256(b"theirs\n")[:12], P.sha256(b"old\n")
    for path, expect, now, was in ((edited, old, theirs, old[:12]),
                                   (removed, old, "none (missing)", old[:12]),
                                   (made, None, theirs, "none (must not exist)")):
        files = [{"path": str(path), "data": b"new\n", "expect_sha256": expect, "backup": None}]
        with pytest.raises(BadRequest) as info:
            journal.apply(files, "v2")
        assert str(info.value) == f"{path} changed: current sha256 {now}, expected {was}; nothing was written"
    assert edited.read_bytes() == made.read_bytes() == b"theirs\n" and not removed.exists()
