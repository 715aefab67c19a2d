"""SshLink + AgentClient against a real OpenSSH sshd on 127.0.0.1 and the real agent."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.sshd import Sshd, keygen
from tui.transport import (
    AgentClient,
    AuthFailed,
    HostKeyChanged,
    HostKeyUnknown,
    HostUnreachable,
    TransportError,
)
from tui.transport.bundle import agent_files
from tui.transport.hostpython import HostPythonError
from tui.transport.ssh import SshLink

pytestmark = pytest.mark.ssh


@pytest.fixture
def agent_sock(sshd: Sshd, monkeypatch: pytest.MonkeyPatch) -> str:
    """An ssh-agent holding the test key, as the user's agent (SSH_AUTH_SOCK)."""
    sock = sshd.start_ssh_agent()
    monkeypatch.setenv("SSH_AUTH_SOCK", sock)
    return sock


@pytest.fixture
def no_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def link(sshd: Sshd, tmp_path: Path, target: str | None = None, **kw: object) -> SshLink:
    kw.setdefault("python", sys.executable)
    kw.setdefault("cache_dir", str(tmp_path / "cache"))
    kw.setdefault("connect_timeout", 5)
    kw.setdefault("runs_dir", str(tmp_path / "runs"))
    return SshLink(target or sshd.target, **kw)  # type: ignore[arg-type]


async def expect_failure(lnk: SshLink) -> TransportError:
    client = AgentClient(lnk)
    with pytest.raises(TransportError) as info:
        await client.start()
    await client.close()
    assert "\n" not in str(info.value)
    return info.value


async def test_target_with_known_hosts_snapshot_sees_matching_process(
    sshd: Sshd, tmp_path: Path, agent_sock: str
) -> None:
    marker = f"eagle3-ssh-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    client = AgentClient(link(sshd, tmp_path, known_hosts=sshd.known_hosts))
    try:
        hello = await client.start()
        assert hello.protocol == 1 and hello.pid != os.getpid()
        assert client.link.describe() == sshd.target
        await client.configure(0.5, match=marker)
        deadline = time.monotonic() + 10
        while True:
            snap = await client.snapshot()
            if any(p.pid == proc.pid and "match" in p.why for p in snap.processes):
                break
            assert time.monotonic() < deadline, f"{proc.pid} not in {snap.processes}"
            await asyncio.sleep(0.2)
    finally:
        await client.close()
        proc.kill()
        proc.wait()


async def test_alias_through_ssh_config_and_upload_once(
    sshd: Sshd, tmp_path: Path, no_agent: None
) -> None:
    # No ssh-agent here: the IdentityFile and UserKnownHostsFile come from the config.
    first = link(sshd, tmp_path, sshd.alias, ssh_config=sshd.ssh_config)
    client = AgentClient(first)
    await client.start()
    assert (await client.snapshot()).host.hostname
    await client.close()
    assert first.uploads == 1 and first.remote_dir
    remote = Path(first.remote_dir)
    names = sorted(str(p.relative_to(remote)) for p in remote.rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts)
    remembered = [n for n in names if n.startswith(".python-")]  # the interpreter found
    assert len(remembered) == 1
    assert sorted(set(names) - set(remembered)) == sorted(
        [".complete", *agent_files(first.agent_dir)]  # remote/**/*.py and nvidia-ml-py's pynvml
    )
    assert "uploaded_pynvml.py" in names and "remote/agent/main.py" in names  # the package's shape
    mtime = (remote / "remote" / "agent" / "main.py").stat().st_mtime_ns

    second = link(sshd, tmp_path, sshd.alias, ssh_config=sshd.ssh_config)
    client = AgentClient(second)
    await client.start()
    await client.close()
    assert second.uploads == 0 and second.remote_dir == first.remote_dir
    assert (remote / "remote" / "agent" / "main.py").stat().st_mtime_ns == mtime

    # An interrupted upload (no .complete marker) is redone.
    (remote / ".complete").unlink()
    third = link(sshd, tmp_path, sshd.alias, ssh_config=sshd.ssh_config)
    client = AgentClient(third)
    await client.start()
    await client.close()
    assert third.uploads == 1 and (remote / ".complete").exists()


class CountingLink(SshLink):
    """SshLink that records the channel opened for each session (exec or SFTP)."""

    channels: list[str]

    async def _connect(self):  # type: ignore[no-untyped-def]
        conn = await super()._connect()
        self.channels = []
        create = conn.create_session

        async def counted(*args, **kw):  # type: ignore[no-untyped-def]
            self.channels.append(str(kw.get("command") or kw.get("subsystem") or args[1:2]))
            return await create(*args, **kw)

        conn.create_session = counted  # type: ignore[method-assign]
        return conn


async def test_warm_start_is_one_exec_and_first_contact_uploads(
    sshd: Sshd, tmp_path: Path, no_agent: None
) -> None:
    """Once the agent is on the host, the Python probe execs it in the same channel."""
    channels = []
    for _ in range(2):
        lnk = CountingLink(sshd.alias, ssh_config=sshd.ssh_config, cache_dir=str(tmp_path / "cache"),
                           runs_dir=str(tmp_path / "runs"))
        client = AgentClient(lnk, reconnect=False)
        hello = await client.start()
        assert (await client.snapshot()).host.hostname
        await client.close()
        assert hello.python == ".".join(map(str, sys.version_info[:3]))
        channels.append(lnk.channels)
    first, warm = channels
    # probe, upload, the upload dir's trust check, agent
    assert len(first) == 4 and "sftp" in first and "EAGLE3-TUI-UNTRUSTED" in first[2]
    assert len(warm) == 1 and "agent/main.py" in warm[0] and "python3" in warm[0]


async def test_the_interpreter_found_is_remembered_per_login_path(
    sshd: Sshd, tmp_path: Path, no_agent: None
) -> None:
    """A warm start execs the remembered interpreter without asking the candidates (a
    pyenv shim costs ~0.3 s a call); another PATH at login, or that file gone, asks again."""

    async def start() -> CountingLink:
        lnk = CountingLink(sshd.alias, ssh_config=sshd.ssh_config, cache_dir=str(tmp_path / "cache"),
                           runs_dir=str(tmp_path / "runs"))
        client = AgentClient(lnk, reconnect=False)
        hello = await client.start()
        await client.close()
        assert hello.python == ".".join(map(str, sys.version_info[:3]))
        return lnk

    first = await start()  # uploads, and remembers what the probe found
    assert first.remote_dir and first.found
    [cache] = Path(first.remote_dir).glob(".python-*")
    login_path, line = cache.read_text().splitlines()
    assert line == f"{first.found.name}\t{first.found.dotted} {first.found.path}"
    # A stand-in interpreter that says it ran, then is the real one: is it the one used?
    marker, wrapper = tmp_path / "wrapper-ran", tmp_path / "wrapper-python"
    wrapper.write_text(f"#!/bin/sh\ntouch {marker}\nexec {first.found.path} \"$@\"\n")
    wrapper.chmod(0o755)
    cache.write_text(f"{login_path}\n{first.found.name}\t{first.found.dotted} {wrapper}\n")
    warm = await start()
    assert marker.exists() and len(warm.channels) == 1
    assert warm.found is not None and warm.found.path == str(wrapper)
    marker.unlink()
    cache.write_text(f"/another/path\n{first.found.name}\t{first.found.dotted} {wrapper}\n")
    await start()
    assert not marker.exists()  # asked again, and remembered anew
    assert cache.read_text().splitlines() == [login_path, line]
    wrapper.unlink()
    cache.write_text(f"{login_path}\n{first.found.name}\t{first.found.dotted} {wrapper}\n")
    assert (await start()).found == first.found  # the remembered one is gone: asked again


async def test_unknown_host_key_refused_then_accepted(
    sshd: Sshd, tmp_path: Path, agent_sock: str
) -> None:
    known = tmp_path / "ssh" / "known_hosts"
    fingerprint = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(sshd.host_key) + ".pub"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[1]
    err = await expect_failure(link(sshd, tmp_path, known_hosts=known))
    assert isinstance(err, HostKeyUnknown) and err.permanent
    assert fingerprint.startswith("SHA256:") and fingerprint in str(err)
    assert "ssh-ed25519" in str(err) and "--accept-new-host-key" in str(err)
    assert not known.exists()

    client = AgentClient(link(sshd, tmp_path, known_hosts=known, accept_new_host_key=True))
    await client.start()
    await client.close()
    assert known.read_text() == sshd.host_key_line() + "\n"
    assert known.stat().st_mode & 0o777 == 0o600

    # Now trusted: a plain connect works without the flag.
    client = AgentClient(link(sshd, tmp_path, known_hosts=known))
    await client.start()
    await client.close()


async def test_changed_host_key_always_refused(sshd: Sshd, tmp_path: Path, agent_sock: str) -> None:
    other = keygen(tmp_path / "other_host_key", "impostor")
    known = tmp_path / "known_hosts"
    known.write_text(f"[{sshd.host}]:{sshd.port} " + " ".join(other.split()[:2]) + "\n")
    err = await expect_failure(link(sshd, tmp_path, known_hosts=known, accept_new_host_key=True))
    assert isinstance(err, HostKeyChanged) and err.permanent
    assert "CHANGED" in str(err)
    assert known.read_text().count("\n") == 1  # nothing was appended


async def test_wrong_key_is_auth_failed(sshd: Sshd, tmp_path: Path, no_agent: None) -> None:
    keygen(tmp_path / "wrong", "wrong-key")
    cfg = tmp_path / "config"
    cfg.write_text(
        f"Host box\n  HostName {sshd.host}\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {tmp_path / 'wrong'}\n  UserKnownHostsFile {sshd.known_hosts}\n"
    )
    err = await expect_failure(link(sshd, tmp_path, "box", ssh_config=cfg))
    assert isinstance(err, AuthFailed) and err.permanent
    assert f"{sshd.user}@{sshd.host}:{sshd.port}" in str(err)
    # the key file that was offered, where the user can look, not the key's comment
    tried = str(tmp_path / "wrong")  # said with ~ for the home dir (tmp_path may lie under it)
    assert (tried in str(err) or tried.replace(str(Path.home()), "~", 1) in str(err)) and "wrong-key" not in str(err)


async def test_unreachable_port(sshd: Sshd, tmp_path: Path) -> None:
    with __import__("socket").socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        err = await expect_failure(
            link(sshd, tmp_path, f"root@127.0.0.1:{port}", known_hosts=sshd.known_hosts)
        )
    assert isinstance(err, HostUnreachable) and not err.permanent
    assert f"127.0.0.1:{port}" in str(err)


async def test_missing_python_is_one_line(sshd: Sshd, tmp_path: Path, agent_sock: str) -> None:
    err = await expect_failure(
        link(sshd, tmp_path, known_hosts=sshd.known_hosts, python="/nonexistent/python3")
    )
    assert isinstance(err, HostPythonError) and err.permanent  # a config mistake: exit 2
    assert str(err) == (
        f"no /nonexistent/python3 found on {sshd.target}; the agent needs Python ≥ 3.9 "
        '(set [host] python = "/path/to/python3.9+")'
    )
