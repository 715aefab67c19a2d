"""Log following in the real agent (remote/follow.py), inotify and poll: what happens
around the stream itself -- an unreadable log, a log that comes and goes, an agent with
nothing to do. (The stream's bytes, truncation and rotation: tests/test_agent.py.)"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_driver import AgentProc
from tests.test_agent import NO_GPU, append, subscribe


@pytest.fixture(params=["inotify", "poll"])
def agent(request: pytest.FixtureRequest) -> Iterator[AgentProc]:
    env = dict(NO_GPU)
    if request.param == "poll":
        env["EAGLE3_TUI_NO_INOTIFY"] = "1"
    with AgentProc(env=env) as a:
        yield a


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(agent: AgentProc, seconds: float = 1.5) -> float:
    before = cpu_s(agent.proc.pid)
    time.sleep(seconds)
    return cpu_s(agent.proc.pid) - before


def test_an_unreadable_log_is_one_error_once_and_the_agent_stays_idle(agent: AgentProc,
                                                                    tmp_path: Path) -> None:
    path = tmp_path / "a-directory.log"
    path.mkdir()  # opens, but every read fails (EISDIR)
    mark = agent.mark()
    subscribe(agent, path)
    err = agent.wait_for(lambda m: m.get("type") == "error", since=mark, what="the error")
    assert err["message"] == f"log {path}: IsADirectoryError: [Errno 21] Is a directory", err
    (path / "poke").write_text("x")  # wake-ups: still one error, no busy loop
    assert idle_cpu(agent) < 0.5
    assert [m for m in agent.messages[mark:] if m.get("type") == "error"] == [err]
    assert agent.call("snapshot") is not None  # still answering


def test_a_log_that_goes_missing_twice_is_reported_missing_twice(agent: AgentProc,
                                                                 tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(b"one\n")
    _, stream = subscribe(agent, path)
    stream.wait_equal(path)
    path.unlink()
    stream.wait(lambda s: s.resets == ["missing"])
    path.write_bytes(b"two\n")
    stream.wait(lambda s: s.resets == ["missing", "appeared"] and bytes(s.data) == b"two\n")
    path.unlink()
    stream.wait(lambda s: s.resets == ["missing", "appeared", "missing"])


def test_an_agent_following_a_quiet_log_does_not_spin(agent: AgentProc, tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_bytes(b"start\n")
    _, stream = subscribe(agent, path)
    for i in range(20):  # a burst of wake-ups, then quiet
        append(path, b"line %d\n" % i)
    stream.wait_equal(path)
    assert idle_cpu(agent) < 0.5


def inotify_watched_inodes(pid: int) -> set[int] | None:
    """The inodes an inotify instance of process ``pid`` watches (from /proc fdinfo), or
    None when the process has no inotify instance."""
    found = None
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:inotify":
                continue
        except OSError:
            continue
        found = found or set()
        for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines():
            if line.startswith("inotify wd:"):
                found.add(int(line.split("ino:")[1].split()[0], 16))
    return found


def test_the_inotify_variant_watches_the_logs_directory_and_the_poll_one_does_not(
        agent: AgentProc, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The two variants of every log test are really two: with inotify the agent watches
    the followed log's directory; with EAGLE3_TUI_NO_INOTIFY=1 it has no inotify at all."""
    path = tmp_path / "run.log"
    path.write_bytes(b"x\n")
    _, stream = subscribe(agent, path)
    stream.wait_equal(path)
    watched = inotify_watched_inodes(agent.proc.pid)
    if request.node.callspec.params["agent"] == "poll":
        assert watched is None
    else:
        assert watched is not None and tmp_path.stat().st_ino in watched, watched


def test_an_unsubscribed_logs_directory_is_no_longer_watched(tmp_path: Path) -> None:
    """A long-lived agent follows run after run: each log's directory watch goes with its
    subscription, or the user's inotify watches (a per-user kernel limit) leak away."""
    with AgentProc(env=dict(NO_GPU)) as agent:
        unsubscribe_drops_the_watch(agent, tmp_path)


def unsubscribe_drops_the_watch(agent: AgentProc, tmp_path: Path) -> None:
    first, second = tmp_path / "run1", tmp_path / "run2"
    first.mkdir()
    second.mkdir()
    (first / "output.log").write_bytes(b"a\n")
    (second / "output.log").write_bytes(b"b\n")
    _, stream = subscribe(agent, first / "output.log", sub="one")
    stream.wait_equal(first / "output.log")
    assert first.stat().st_ino in (inotify_watched_inodes(agent.proc.pid) or set())
    _, stream = subscribe(agent, second / "output.log", sub="two")
    stream.wait_equal(second / "output.log")
    agent.call("unsubscribe", {"sub": "one"})
    assert inotify_watched_inodes(agent.proc.pid) == {second.stat().st_ino}


def test_a_logs_directory_removed_and_made_again_is_watched_again(agent: AgentProc, tmp_path: Path,
                                                                 request: pytest.FixtureRequest) -> None:
    """A run dir removed (runs prune) and made again under the same name (a relaunch):
    the kernel dropped the old watch, and the agent watches the new directory, so the new
    log streams on inotify's wake-ups and not only on the slow poll."""
    run = tmp_path / "run"
    run.mkdir()
    path = run / "output.log"
    path.write_bytes(b"first\n")
    _, stream = subscribe(agent, path)
    stream.wait_equal(path)
    path.unlink()
    run.rmdir()
    stream.wait(lambda s: s.resets == ["missing"])
    run.mkdir()
    path.write_bytes(b"second\n")
    stream.wait(lambda s: s.resets == ["missing", "appeared"])
    stream.wait_equal(path)
    if request.node.callspec.params["agent"] == "inotify":
        deadline = time.monotonic() + 5
        while run.stat().st_ino not in (inotify_watched_inodes(agent.proc.pid) or set()):
            assert time.monotonic() < deadline, "the new directory is not watched"
            time.sleep(0.05)
