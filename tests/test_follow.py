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
