"""The transport client gives up when it should, in bounded time, with one clear error
(issue 41): a permanent error (the host's Python gone) is not retried at all; a
retryable one (an agent that never says hello) is retried `max_attempts` times, no more;
each ends the client as "failed" naming why. A bug that retries forever is a failure
here within seconds, never a hang caught by the suite's timeout.

Real parts: the real agent over LocalLink; the failures are real interpreters (a path
that does not exist, a stand-in Python that answers the version probe and then hangs).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tui.transport import AgentClient, LinkStatus, LocalLink
from tui.transport.errors import AgentStartFailed

BOUND_S = 15.0  # far above what each case needs (< 3 s), far below the suite's timeout


async def _events_until_end(client: AgentClient) -> list[object]:
    async def drain() -> list[object]:
        return [e async for e in client.events()]

    try:
        return await asyncio.wait_for(drain(), BOUND_S)
    except asyncio.TimeoutError:
        pytest.fail(f"the client was still trying after {BOUND_S:g} s: {client.status}", pytrace=False)


def _statuses(events: list[object]) -> list[LinkStatus]:
    return [e for e in events if isinstance(e, LinkStatus)]


async def test_a_permanent_error_while_reconnecting_ends_the_client_after_one_try(tmp_path: Path) -> None:
    link = LocalLink(runs_dir=str(tmp_path / "runs"))
    client = AgentClient(link, backoff=(0.05,))
    try:
        hello = await client.start()
        link.python = str(tmp_path / "gone" / "python3")  # the host's Python removed meanwhile
        t0 = time.monotonic()
        os.kill(hello.pid, signal.SIGKILL)
        st = _statuses(await _events_until_end(client))
        assert st[-1].state == "failed", st
        assert "gone/python3 not found" in (st[-1].error or ""), st[-1]
        assert [s.attempt for s in st if s.state == "reconnecting"] == [1], st  # tried once, not again
        assert time.monotonic() - t0 < 5
        assert not client.connected and client.status.state == "failed"
    finally:
        await client.close()


async def test_a_first_connect_with_a_permanent_error_raises_at_once(tmp_path: Path) -> None:
    client = AgentClient(LocalLink(python=str(tmp_path / "nope")), backoff=(0.05,))
    t0 = time.monotonic()
    with pytest.raises(AgentStartFailed, match="nope not found"):
        await asyncio.wait_for(client.start(), BOUND_S)
    assert time.monotonic() - t0 < 5 and client.status.state == "failed"
    assert [e async for e in client.events()][-1] == client.status  # the stream ends too
    await client.close()


HANGING_PYTHON = """#!/bin/sh
# Answers the client's version probe (`python -c PROBE`) like the real one, then, as the
# agent, never says hello (a host whose login hangs): retryable each time.
if [ "$1" = "-c" ]; then exec {python} "$@"; fi
exec sleep 30
"""


async def test_a_retryable_error_is_retried_max_attempts_times_then_fails(tmp_path: Path) -> None:
    hanging = tmp_path / "python3"
    hanging.write_text(HANGING_PYTHON.format(python=sys.executable))
    hanging.chmod(0o755)
    link = LocalLink(runs_dir=str(tmp_path / "runs"))
    client = AgentClient(link, backoff=(0.05,), max_attempts=3)
    try:
        hello = await client.start()  # the real agent: its hello may take seconds on a loaded machine
        link.python, client.hello_timeout = str(hanging), 0.5
        os.kill(hello.pid, signal.SIGKILL)
        st = _statuses(await _events_until_end(client))
        assert [s.attempt for s in st if s.state == "reconnecting"] == [1, 2, 3], st
        assert st[-1].state == "failed" and "did not say hello within 0.5 s" in (st[-1].error or ""), st[-1]
    finally:
        await client.close()


NOISY_PYTHON = """#!/bin/sh
# The agent's stdout starts with what a host's login prints before any program (a motd,
# a module system's notice, a conda hook), then the real agent.
if [ "$1" = "-c" ]; then exec {python} "$@"; fi
echo "Welcome to gpu-box (GNU/Linux 6.8.0 x86_64)"
echo "*** System restart required ***"
printf '{{"not": "a message"}}\\n\\n'
exec {python} "$@"
"""


async def test_lines_a_login_prints_before_the_hello_are_skipped(tmp_path: Path) -> None:
    """A host whose login prints a banner on stdout before the agent runs: the client
    skips those lines (up to its bound) and connects to the agent behind them."""
    noisy = tmp_path / "python3"
    noisy.write_text(NOISY_PYTHON.format(python=sys.executable))
    noisy.chmod(0o755)
    client = AgentClient(LocalLink(python=str(noisy), runs_dir=str(tmp_path / "runs")), backoff=(0.05,))
    try:
        hello = await asyncio.wait_for(client.start(), BOUND_S)
        assert hello.pid > 0 and client.connected and client.status.state == "connected"
    finally:
        await client.close()


async def test_closing_while_still_connecting_ends_the_start_at_once(tmp_path: Path) -> None:
    """Quitting while the host's login hangs (no hello yet): the start ends now, with
    the client closed, not after the hello timeout."""
    hanging = tmp_path / "python3"
    hanging.write_text(HANGING_PYTHON.format(python=sys.executable))
    hanging.chmod(0o755)
    client = AgentClient(LocalLink(python=str(hanging), runs_dir=str(tmp_path / "runs")), backoff=(0.05,))
    client.hello_timeout = 60.0
    starting = asyncio.ensure_future(client.start())
    await asyncio.sleep(0.5)  # the hanging "agent" is up, saying nothing
    t0 = time.monotonic()
    await client.close()
    with pytest.raises((asyncio.CancelledError, Exception)):
        await asyncio.wait_for(starting, BOUND_S)
    assert time.monotonic() - t0 < 5, "the start outlived close()"
    assert client.status.state == "closed"


async def test_a_tail_subscription_resumes_where_it_was_pinned(tmp_path: Path) -> None:
    """`subscribe` with a negative offset asks for the log's tail; the agent answers with
    the real offset, and a reconnect resumes there (not at "the tail" again, which would
    skip what was written meanwhile)."""
    log = tmp_path / "out.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(100)))
    client = AgentClient(LocalLink(runs_dir=str(tmp_path / "runs")), backoff=(0.05,))
    try:
        await asyncio.wait_for(client.start(), BOUND_S)
        reply = await client.subscribe("log", str(log), offset=-64)
        path, offset, inode = client.resume_points()["log"]
        # pinned at the reply's offset, or past it once the tail's bytes came in
        assert 0 <= reply.offset <= offset <= log.stat().st_size and inode == log.stat().st_ino, (
            reply, client.resume_points())
        # a log with nothing to tail yet (just created): pinned at 0, where its first lines will be
        empty = tmp_path / "new.log"
        empty.write_bytes(b"")
        reply = await client.subscribe("new", str(empty), offset=-64)
        assert reply.offset == 0 and client.resume_points()["new"] == (str(empty), 0, empty.stat().st_ino), (
            client.resume_points())
    finally:
        await client.close()


async def test_a_kill_reports_its_progress_to_the_callers_callback(tmp_path: Path) -> None:
    """The dashboard's kill dialog draws each stage the agent reports (signals sent, GPUs
    waited for): the callback given with the request gets them, tagged with it."""
    client = AgentClient(LocalLink(runs_dir=str(tmp_path / "runs")), backoff=(0.05,))
    try:
        await asyncio.wait_for(client.start(), BOUND_S)
        launched = await client.call_with_progress(
            "launch", None, argv=[sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"],
            cwd=str(tmp_path), name="sleeper", action="act-1")
        seen: list[object] = []
        await asyncio.wait_for(client.call_with_progress(
            "kill", seen.append, run_id=launched["run_id"], graces=[0.5, 0.5], gpu_wait=0), BOUND_S)
        stages = [getattr(e, "stage", None) for e in seen]
        assert "SIGINT" in stages and stages[-1] == "done", seen
    finally:
        await client.close()


async def test_an_unforeseen_error_opening_the_link_is_one_line_and_the_client_fails(tmp_path: Path) -> None:
    """A link that fails in a way no part of it foresaw (here a Python path holding a NUL
    byte: the OS call raises ValueError, not OSError) is still one clear line naming the
    target, the client is "failed", and the event stream ends."""
    from tui.transport.errors import TransportError

    client = AgentClient(LocalLink(python=str(tmp_path / "py\x00thon3")), backoff=(0.05,))
    with pytest.raises(TransportError) as info:
        await asyncio.wait_for(client.start(), BOUND_S)
    assert str(info.value).startswith("cannot reach the agent on local: ValueError: ") and "\n" not in str(info.value)
    assert client.status.state == "failed"
    assert [e async for e in client.events()][-1] == client.status
    await client.close()
