"""A patch push is one transaction on the host (remote/agent/journal.py): the real agent over
LocalLink, the real speculators files, and the agent SIGKILLed at EVERY step of a push
(its test hook EAGLE3_TUI_TEST_KILL_AT=N). After a restart the status is exactly
"pristine" or the pushed version, never "edited by hand" (unknown)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from remote.agent import journal
from tests import checkout, spec_wheel
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
    # the pristine backup the push made went with it: a whole rollback leaves no trace
    assert not Path(str(pkg(site, GEN)) + S.BACKUP_SUFFIX).exists()


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
    from remote.base.wire import BadRequest

    first = tmp_path / "a.py"
    first.write_bytes(b"old\n")
    gone = tmp_path / "missing-dir" / "b.py"
    files = [{"path": str(first), "data": b"new\n", "expect_sha256": P.sha256(b"old\n"), "backup": None},
             {"path": str(gone), "data": b"x\n", "expect_sha256": None, "backup": None}]
    with pytest.raises(BadRequest,
                       match=rf"patch push to v9 failed \(FileNotFoundError: \[Errno 2\] .*\); rolled back {first}$"):
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
    from remote.base.wire import BadRequest

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


# ---- a rollback undoes only the push's own writes (someone may edit while the agent lies dead)

async def _killed_after_first_write(site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Push v5 with the real agent SIGKILLed right after it wrote the generator file (step
    5): the generator is v5 (and has its new pristine backup), the worker still pristine."""
    monkeypatch.setenv(journal.KILL_AT_ENV, "5")
    client = await _client(tmp_path)
    monkeypatch.delenv(journal.KILL_AT_ENV)
    with pytest.raises(S.PatchServiceError, match="killed at step 5: wrote vllm_hidden_states_generator.py"):
        await S.push(client, SET, "v5", PY, user_dir=tmp_path / "u")
    await client.close()


def _patch_status(tmp_path: Path) -> tuple[int, str, str]:
    """`eagle3-tui patch status` as a user runs it (a new process, a new agent)."""
    import subprocess

    from tests.test_cli_patch import ENTRY

    cfg = tmp_path / "eagle3.toml"
    cfg.write_text(f'[host]\npython = {json.dumps(PY)}\nruns_dir = {json.dumps(str(tmp_path / "runs"))}\n'
                   f'[patches]\nset = "{SET}"\n')
    r = subprocess.run([sys.executable, "-c", ENTRY, "--config", str(cfg), "patch", "status"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env=checkout.env(XDG_CONFIG_HOME=str(tmp_path / "xdg")))
    return r.returncode, r.stdout, r.stderr


async def test_a_file_the_push_had_not_written_yet_and_someone_edited_is_left_and_named(
        site: Path, jdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The reported case: after the agent died mid-push, a user edited the worker (which
    the push had not reached); the next `patch status` put it back to pristine, silently.
    Now the generator (the push's write) is put back, the worker keeps the user's edit,
    and `patch status` says so, one line for the file."""
    pristine = spec_wheel.pristine_files()
    await _killed_after_first_write(site, tmp_path, monkeypatch)
    theirs = pristine[WORKER] + b"# my fix, made while the agent lay dead\n"
    pkg(site, WORKER).write_bytes(theirs)
    code, out, err = _patch_status(tmp_path)
    assert code == 0, err
    assert pkg(site, WORKER).read_bytes() == theirs  # the user's edit survives
    assert pkg(site, GEN).read_bytes() == pristine[GEN]  # the push's write is undone
    assert err.splitlines() == [
        f"an interrupted patch push to v5 was rolled back: {pkg(site, GEN)}",
        f"{pkg(site, WORKER)} was changed by someone else after the interrupted push began; left as it is"]
    assert out.splitlines()[0] == "unknown (edited by hand)", out  # the worker is the user's
    assert not (jdir / "journal.json").exists()


async def test_a_pushed_file_edited_after_the_death_is_left_and_the_dashboard_says_so(
        site: Path, jdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """A file the push wrote, then edited by a user before any agent came back: not the
    push's bytes any more, so not the push's to undo. It is left, named in the agent's
    error message (the dashboard's toast) and in its hello; the pristine backup the push
    made is kept, so the user can still force a rollback to pristine."""
    pset = P.load_set_dir(P.bundled_sets_dir() / SET)
    pristine = spec_wheel.pristine_files()
    await _killed_after_first_write(site, tmp_path, monkeypatch)
    theirs = P.build_version(pset, "v5", pristine)[GEN] + b"# tuned by hand\n"
    pkg(site, GEN).write_bytes(theirs)
    client = await _client(tmp_path)
    try:
        assert client.hello is not None
        assert client.hello.patch_recovery == (
            "an interrupted patch push to v5 was rolled back: nothing had changed yet",
            f"{pkg(site, GEN)} was changed by someone else after the interrupted push began; left as it is")
        toast = await asyncio.wait_for(_next_agent_error(client), 10)
        assert toast == "\n".join(client.hello.patch_recovery)
        assert pkg(site, GEN).read_bytes() == theirs and pkg(site, WORKER).read_bytes() == pristine[WORKER]
        backup = Path(str(pkg(site, GEN)) + S.BACKUP_SUFFIX)
        assert backup.read_bytes() == pristine[GEN]
        done = await S.rollback(client, SET, PY, force=True, user_dir=tmp_path / "u")
        assert done["state"] == "pristine"
    finally:
        await client.close()


async def _next_agent_error(client: AgentClient) -> str:
    from tui.protocol import AgentError

    async for event in client.events():
        if isinstance(event, AgentError):
            return event.message
    raise AssertionError("no agent error")


@pytest.mark.parametrize("edited", [False, True])
async def test_a_file_an_interrupted_push_created_is_removed_unless_someone_changed_it(
        jdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edited: bool) -> None:
    """A push that creates a file (expect_sha256 None), its agent killed right after the
    write: the next agent removes the file -- it did not exist before the push -- but
    only while it is what the push wrote; one someone changed since is theirs now."""
    from tui.protocol.ops import PatchFile

    old, made = tmp_path / "old.py", tmp_path / "made.py"
    old.write_bytes(b"x = 1\n")
    files = [PatchFile(str(old), b"x = 2\n", P.sha256(b"x = 1\n")), PatchFile(str(made), b"y = 1\n", None)]
    monkeypatch.setenv(journal.KILL_AT_ENV, "5")  # locked, saved, journal, old.py, made.py
    client = await _client(tmp_path)
    monkeypatch.delenv(journal.KILL_AT_ENV)
    with pytest.raises(Exception, match="killed at step 5: wrote made.py"):
        await client.patch_apply(files, "v9")
    await client.close()
    assert made.read_bytes() == b"y = 1\n" and old.read_bytes() == b"x = 2\n"
    if edited:
        made.write_bytes(b"y = 1  # someone's\n")
    client = await _client(tmp_path)
    await client.close()
    assert old.read_bytes() == b"x = 1\n"
    assert client.hello is not None
    if edited:
        assert made.read_bytes() == b"y = 1  # someone's\n"
        assert client.hello.patch_recovery[1:] == (
            f"{made} was changed by someone else after the interrupted push began; left as it is",)
    else:
        assert not made.exists()
        assert client.hello.patch_recovery == (f"an interrupted patch push to v9 was rolled back: {old}, {made}",)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp files


def test_the_hello_recovery_lines_are_cleaned_bounded_and_never_a_crash() -> None:
    """The lines come from the host (its paths): each one cleaned to one line, at most
    50 of 500 characters; a hello with a malformed `patch_recovered` is no recovery."""
    from tui.protocol import parse_message

    def lines(rec: object) -> tuple[str, ...]:
        msg = parse_message({"type": "hello", "protocol": 1, "patch_recovered": rec})
        return msg.patch_recovery  # type: ignore[union-attr]

    assert lines({"lines": ["/x/a\x1bc.py was changed\n\x1b]52;c;aGk=\x07", 7, "y" * 900] + ["z"] * 60}) == (
        "/x/a.py was changed ", "7", "y" * 500, *["z"] * 47)
    assert lines({"error": "cannot roll back \x9b2J"}) == ("cannot roll back ",)
    assert lines(None) == lines([]) == lines({"lines": "nope"}) == ()


async def test_the_dashboard_toasts_the_rollback_and_each_file_someone_changed(
        site: Path, jdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The dashboard whose agent did the rollback (Textual pilot, the real local agent):
    one toast, the rollback on its first line and the file someone changed on the next."""
    from tui.services.config import parse_config
    from tui.views.app import make_app

    pristine = spec_wheel.pristine_files()
    await _killed_after_first_write(site, tmp_path, monkeypatch)
    pkg(site, WORKER).write_bytes(pristine[WORKER] + b"# mine\n")
    client = AgentClient(LocalLink(runs_dir=str(tmp_path / "runs")), reconnect=False)
    app = make_app(client, parse_config(f'[host]\nruns_dir = {json.dumps(str(tmp_path / "runs"))}\n'), "local")
    want = (f"agent: an interrupted patch push to v5 was rolled back: {pkg(site, GEN)}\n"
            f"{pkg(site, WORKER)} was changed by someone else after the interrupted push began; left as it is")
    async with app.run_test(size=(160, 50), notifications=True) as pilot:
        for _ in range(200):
            if any(str(n.message) == want for n in app._notifications):
                break
            await pilot.pause(0.05)
        assert [str(n.message) for n in app._notifications if "interrupted" in str(n.message)] == [want]
        await pilot.press("q")
    assert pkg(site, WORKER).read_bytes() == pristine[WORKER] + b"# mine\n"
