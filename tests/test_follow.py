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
