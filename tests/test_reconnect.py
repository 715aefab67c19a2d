"""Reconnect: a link that drops mid-stream loses and repeats no log byte.

The fault is injected by an in-process asyncssh server that runs the real agent
(uploaded by SshLink over its SFTP) as a subprocess and aborts the connection
after a number of bytes, mid-line; a second case kills a local agent outright.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from tui.protocol import Hello, LogData, LogReset
from tui.transport import AgentClient, LinkStatus, LocalLink
from tui.transport.ssh import SshLink

DROP_AFTER = 3000  # agent stdout bytes per connection before the fault
DROPS = 2


class DroppingServer:
    """asyncssh server: runs each command, aborts the first DROPS connections mid-stream."""

    def __init__(self) -> None:
        self.drops_left = DROPS
        self.sessions = 0

    async def handle(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        self.sessions += 1
        argv = shlex.split(process.command or "")
        agent = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        assert agent.stdin and agent.stdout

        async def pump_in() -> None:
            with contextlib.suppress(Exception):
                while data := await process.stdin.read(65536):
                    agent.stdin.write(data)
                    await agent.stdin.drain()
            agent.stdin.close()

        feeder = asyncio.create_task(pump_in())
        sent = 0
        drop = self.drops_left > 0
        try:
            while chunk := await agent.stdout.read(65536):
                if drop and sent + len(chunk) > DROP_AFTER:
                    # Send part of the chunk (usually half a JSON line), then cut the wire.
                    process.stdout.write(chunk[: max(1, DROP_AFTER - sent)])
                    self.drops_left -= 1
                    process.channel.get_connection().abort()
                    return
                process.stdout.write(chunk)
                sent += len(chunk)
            process.exit(0)
        except (asyncssh.Error, OSError, BrokenPipeError):
            pass
        finally:
            feeder.cancel()
            with contextlib.suppress(ProcessLookupError):
                agent.kill()
            await agent.wait()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[DroppingServer, Path, Path]]:
    """The server, a client config (Host droppy) and a known_hosts file for it."""
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    user_key = asyncssh.generate_private_key("ssh-ed25519", comment="test-user")
    user_key.write_private_key(str(tmp_path / "id_user"))
    handler = DroppingServer()
    acceptor = await asyncssh.create_server(
        asyncssh.SSHServer,
        "127.0.0.1",
        0,
        server_host_keys=[host_key],
        authorized_client_keys=asyncssh.import_authorized_keys(
            user_key.export_public_key().decode()
        ),
        process_factory=handler.handle,
        encoding=None,
        sftp_factory=True,  # the stock SFTP server on this filesystem: uploads are real
    )
    port = acceptor.sockets[0].getsockname()[1]
    known = tmp_path / "known_hosts"
    alg_blob = host_key.export_public_key().decode().split()[:2]
    known.write_text(f"[127.0.0.1]:{port} {' '.join(alg_blob)}\n")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Host droppy\n  HostName 127.0.0.1\n  Port {port}\n  User tester\n"
        f"  IdentityFile {tmp_path / 'id_user'}\n"
    )
    yield handler, cfg, known
    acceptor.close()
    await acceptor.wait_closed()


async def write_numbered_lines(path: Path, count: int, period: float) -> None:
    """Append `count` numbered lines, one every `period` seconds."""
    for i in range(count):
        with open(path, "ab") as f:
            f.write(f"line {i:05d} {'x' * (i % 37)}\n".encode())
        await asyncio.sleep(period)


async def follow_until_complete(
    client: AgentClient, log: Path, writer: asyncio.Task[None], timeout: float
) -> tuple[bytes, list[Any]]:
    """Collect LogData bytes (and every event) until they cover the finished file."""
    events = client.events()
    got = bytearray()
    seen: list[Any] = []
    deadline = time.monotonic() + timeout
    while not (writer.done() and len(got) >= log.stat().st_size):
        left = deadline - time.monotonic()
        assert left > 0, f"stalled at {len(got)} of {log.stat().st_size} bytes; {seen[-5:]}"
        with contextlib.suppress(asyncio.TimeoutError):
            ev = await asyncio.wait_for(events.__anext__(), min(left, 0.5))
            seen.append(ev)
            if isinstance(ev, LogData):
                assert ev.offset == len(got), f"gap or overlap at {ev.offset} (have {len(got)})"
                got += ev.data
            assert not isinstance(ev, LogReset), ev
    return bytes(got), seen


def states(seen: list[Any]) -> list[str]:
    return [e.state for e in seen if isinstance(e, LinkStatus)]


async def test_ssh_drop_mid_stream_loses_and_repeats_nothing(
    server: tuple[DroppingServer, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handler, cfg, known = server
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    log = tmp_path / "run.log"
    log.write_bytes(b"")
    link = SshLink(
        "droppy",
        ssh_config=cfg,
        known_hosts=known,
        python=sys.executable,
        cache_dir=str(tmp_path / "cache"),
        connect_timeout=5,
    )
    client = AgentClient(link, backoff=(0.1, 0.2))
    await client.start()
    await client.subscribe("log", str(log), 0)
    writer = asyncio.create_task(write_numbered_lines(log, 250, 0.01))
    try:
        got, seen = await follow_until_complete(client, log, writer, timeout=40)
    finally:
        writer.cancel()
        await client.close()
    assert got == log.read_bytes()
    assert handler.drops_left == 0 and handler.sessions >= DROPS + 1
    st = states(seen)
    assert st.count("reconnecting") >= DROPS, st
    assert st.count("connected") >= DROPS, st
    assert st.index("reconnecting") < len(st) - 1 - st[::-1].index("connected")
    assert sum(isinstance(e, Hello) for e in seen) >= DROPS  # one per reconnection
    assert link.uploads == 1  # the reconnections found the agent already uploaded


async def test_local_agent_killed_resumes_and_permanent_error_fails(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_bytes(b"")
    link = LocalLink()
    client = AgentClient(link, backoff=(0.05,))
    hello = await client.start()
    await client.subscribe("log", str(log), 0)

    async def kill_agent_midway() -> None:
        await write_numbered_lines(log, 60, 0.01)
        os.kill(hello.pid, signal.SIGKILL)
        await write_numbered_lines(log, 60, 0.01)

    writer = asyncio.create_task(kill_agent_midway())
    try:
        got, seen = await follow_until_complete(client, log, writer, timeout=20)
        assert got == log.read_bytes()
        assert "reconnecting" in states(seen)
        assert client.hello is not None and client.hello.pid != hello.pid

        # A permanent error while reconnecting ends the client with "failed".
        link.python = "/nonexistent/python3"
        assert client.hello is not None
        os.kill(client.hello.pid, signal.SIGKILL)
        rest = [e async for e in client.events()]  # ends when the client gives up
        assert isinstance(rest[-1], LinkStatus) and rest[-1].state == "failed"
        assert "/nonexistent/python3 not found" in (rest[-1].error or "")
    finally:
        writer.cancel()
        await client.close()


async def test_a_log_rotated_while_the_link_is_down_is_followed_from_its_start(tmp_path: Path) -> None:
    """The agent dies; before the client's reconnect, the log is rotated (renamed away, a
    new file at the path, longer than what was read). The re-subscribe carries the old
    inode, so the new agent sees the rotation: a reset, then the new file from byte 0 --
    not the new file read on from the old file's offset."""
    log = tmp_path / "run.log"
    old = b"".join(b"old line %03d\n" % i for i in range(20))
    new = b"".join(b"new line %03d\n" % i for i in range(60))
    log.write_bytes(old)
    client = AgentClient(LocalLink(), backoff=(0.5,))
    hello = await client.start()
    events = client.events()
    try:
        await client.subscribe("log", str(log), 0)
        got = bytearray()
        while len(got) < len(old):
            ev = await asyncio.wait_for(events.__anext__(), 10)
            if isinstance(ev, LogData):
                got += ev.data
        assert bytes(got) == old
        os.kill(hello.pid, signal.SIGKILL)
        os.rename(log, tmp_path / "run.log.1")  # while the link is down
        log.write_bytes(new)
        after: list[Any] = []
        data = bytearray()
        deadline = time.monotonic() + 15
        while len(data) < len(new):
            assert time.monotonic() < deadline, f"new file not followed from its start: {after[-6:]}"
            ev = await asyncio.wait_for(events.__anext__(), 15)
            after.append(ev)
            if isinstance(ev, LogReset):
                data.clear()
            elif isinstance(ev, LogData):
                assert ev.offset == len(data), f"the new file read from {ev.offset}, not from its start"
                data += ev.data
        assert bytes(data) == new
        resets = [e for e in after if isinstance(e, LogReset)]
        assert resets and resets[0].reason == "rotated" and resets[0].offset == 0, after
        assert "reconnecting" in states(after)
    finally:
        await client.close()
