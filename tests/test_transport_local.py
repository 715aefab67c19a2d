"""AgentClient over LocalLink with the real remote/agent/main.py, plus target parsing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tui.protocol import Hello, LogData
from tui.transport import (
    AgentClient,
    AgentRequestError,
    AgentStartFailed,
    ConfigError,
    LinkStatus,
    LocalLink,
    Target,
    make_link,
    parse_target,
)


async def until(
    events: AsyncIterator[Any], pred: Callable[[Any], bool], timeout: float = 10
) -> Any:
    """The first event matching pred, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail("timed out waiting for an event")
        ev = await asyncio.wait_for(events.__anext__(), left)
        if pred(ev):
            return ev


async def test_hello_and_snapshot_finds_matching_process(client: AgentClient) -> None:
    assert isinstance(client.hello, Hello)
    assert client.hello.protocol == 1
    assert client.hello.pid != os.getpid()
    marker = f"eagle3-test-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        await client.configure(0.5, match=marker)
        deadline = time.monotonic() + 10
        while True:
            snap = await client.snapshot()
            pids = {p.pid for p in snap.processes if "match" in p.why}
            if proc.pid in pids:
                break
            assert time.monotonic() < deadline, f"{proc.pid} never matched: {snap.processes}"
            await asyncio.sleep(0.2)
        assert (snap.host.cpu_count or 0) >= 1
    finally:
        proc.kill()
        proc.wait()


async def test_subscribe_streams_appended_bytes(client: AgentClient, tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"first\n")
    events = client.events()
    result = await client.subscribe("log", str(log), 0)
    assert result.inode == log.stat().st_ino
    got = bytearray()
    while bytes(got) != b"first\n":
        ev = await until(events, lambda e: isinstance(e, LogData))
        got += ev.data
    with open(log, "ab") as f:
        f.write(b"second \xff not utf-8\n")
    while len(got) < log.stat().st_size:
        ev = await until(events, lambda e: isinstance(e, LogData))
        assert ev.offset == len(got)
        got += ev.data
    assert bytes(got) == log.read_bytes()
    assert client.resume_points()["log"] == (str(log), len(got), log.stat().st_ino)
    await client.unsubscribe("log")
    assert "log" not in client.resume_points()


async def test_agent_error_is_one_line(client: AgentClient) -> None:
    with pytest.raises(AgentRequestError) as info:
        await client.request("no_such_op")
    assert "\n" not in str(info.value) and str(info.value).startswith("no_such_op:")


async def test_the_agents_reason_reaches_the_caller(client: AgentClient, tmp_path: Path) -> None:
    """What the host said is what the user reads (the CLI and the screens print it)."""
    with pytest.raises(AgentRequestError) as info:
        await client.request("no_such_op")
    assert str(info.value) == "no_such_op: unknown op 'no_such_op'"
    gone = tmp_path / "gone.log"
    with pytest.raises(AgentRequestError) as info:
        await client.request("read_range", path=str(gone), offset=0, length=1)
    assert str(info.value) == f"read_range: {gone} does not exist"


async def test_missing_python_is_agent_start_failed() -> None:
    client = AgentClient(LocalLink(python="/nonexistent/python3"))
    with pytest.raises(AgentStartFailed) as info:
        await client.start()
    assert str(info.value) == (
        "/nonexistent/python3 not found on local (set [host] python in eagle3.toml)"
    )
    assert info.value.permanent
    assert client.status == LinkStatus("failed", 0, str(info.value), 0.0)


async def test_agent_crash_at_start_is_reported(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "main.py").write_text("import sys\nsys.exit('agent: cannot work here')\n")
    client = AgentClient(LocalLink(agent_dir=tmp_path))
    with pytest.raises(AgentStartFailed, match="exited at start .code 1.: agent: cannot work here"):
        await client.start()


async def test_an_early_start_is_shared_with_later_callers(tmp_path: Path) -> None:
    """The CLI starts connecting before the dashboard exists; the dashboard's own
    start() gets the same agent (one process), or the same failure."""
    client = AgentClient(LocalLink(), reconnect=False)
    try:
        early = asyncio.ensure_future(client.start())
        hello = await client.start()
        assert (await early) is hello
        assert (await client.start()) is hello
        assert (await client.snapshot()).host.hostname
    finally:
        await client.close()
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "main.py").write_text("import sys\nsys.exit('agent: cannot work here')\n")
    broken = AgentClient(LocalLink(agent_dir=tmp_path), reconnect=False)
    early = asyncio.ensure_future(broken.start())
    with pytest.raises(AgentStartFailed, match="cannot work here"):
        await broken.start()
    with pytest.raises(AgentStartFailed, match="cannot work here"):
        await early


@pytest.mark.parametrize(
    "text, target",
    [
        ("local", Target("local")),
        ("gpu-box", Target("ssh", None, "gpu-box", None)),
        ("root@gpu-box", Target("ssh", "root", "gpu-box", None)),
        ("root@10.0.0.7:2222", Target("ssh", "root", "10.0.0.7", 2222)),
        ("me@[::1]:22", Target("ssh", "me", "::1", 22)),
        ("fe80::1", Target("ssh", None, "fe80::1", None)),
    ],
)
def test_parse_target(text: str, target: Target) -> None:
    assert parse_target(text) == target


@pytest.mark.parametrize(
    "text", ["", "root@", "@host", "host:0", "host:x", "-oProxy=x", "a b", "[::1", "-oProxyCommand=x@host",
             "ro\x1b[2Jot@host", "ro\tot@host"]
)
def test_parse_target_rejects(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_target(text)
    assert "\n" not in str(info.value)


def test_make_link_picks_the_link() -> None:
    assert isinstance(make_link("local"), LocalLink)
    ssh = make_link("root@gpu-box:2222", python="/opt/py/bin/python3")
    assert type(ssh).__name__ == "SshLink"
    assert ssh.describe() == "root@gpu-box:2222"
    assert ssh.python == "/opt/py/bin/python3"


async def test_a_client_closed_before_it_ever_started_closes_quietly() -> None:
    """The app quit (or the CLI failed on its config) before the first connect: closing
    the client is quiet, says "closed", and starts no agent."""
    client = AgentClient(LocalLink())
    await client.close()
    assert [e async for e in client.events()] == [LinkStatus(state="closed")]
    assert not client.connected
