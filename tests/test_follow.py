"""Log following in the real agent (remote/agent/follow.py), inotify and poll: what happens
around the stream itself -- an unreadable log, a log that comes and goes, an agent with
nothing to do. (The stream's bytes, truncation and rotation: tests/test_agent.py.)"""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path

import pytest

from tests.agent_driver import AgentProc
from tests.test_agent import NO_GPU, LogStream, agent, append, subscribe  # noqa: F401 (agent: the fixture)


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


def wakeups(pid: int) -> int:
    """Voluntary context switches of every thread of `pid`: each is one sleep begun."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


def test_an_agent_following_a_quiet_log_sleeps_between_wakeups(agent: AgentProc, tmp_path: Path) -> None:
    """An agent left on a quiet log for a night costs nothing: after the log's wake-ups
    are read, it sleeps until its poll timeout (1 s with inotify, 0.25 s without) instead
    of waking again and again on an inotify event it never read."""
    path = tmp_path / "run.log"
    path.write_bytes(b"start\n")
    _, stream = subscribe(agent, path)
    for i in range(20):
        append(path, b"line %d\n" % i)
    stream.wait_equal(path)
    time.sleep(0.3)
    before = wakeups(agent.proc.pid)
    time.sleep(2.0)
    assert wakeups(agent.proc.pid) - before <= 20


def test_a_tail_with_no_line_break_in_reach_is_the_bytes_asked_for(agent: AgentProc, tmp_path: Path) -> None:
    """A tail (a negative offset) starts at the first line break after the cut, so the
    first line shown is whole; a progress bar that redraws itself with carriage returns
    writes no line break for a long while, and then the tail is exactly the last bytes
    asked for: its offset is the size minus the tail, and the bytes are the file's last."""
    path = tmp_path / "bar.log"
    bars = b"".join(b"\rtrain %3d%%|%-20s| %d/5000" % (i // 50, b"#" * (i // 250), i) for i in range(5000))
    path.write_bytes(b"epoch 1\n" + bars)  # > 100 KiB since the last line break
    content = path.read_bytes()
    res, stream = subscribe(agent, path, offset=-1000)
    assert res["offset"] == len(content) - 1000, (res, len(content))
    stream = LogStream(agent, "log", start=res["offset"], since=0)
    stream.wait(lambda s: s.end == len(content))
    assert bytes(stream.data) == content[-1000:]


def test_a_huge_backlog_never_holds_up_the_next_request(tmp_path: Path) -> None:
    """A log of many MiB followed from its start (a relaunch resuming at 0, a client that
    was away): the agent sends it a budget at a time, so a request queued behind it is
    answered after a few MiB, not after the whole backlog."""
    from remote.agent.follow import PUMP_BUDGET

    path = tmp_path / "huge.log"
    path.write_bytes(b"0123456789abcdef" * (8 * PUMP_BUDGET // 16))
    small = tmp_path / "small.log"
    small.write_bytes(b"x\n")
    with AgentProc(env=dict(NO_GPU)) as agent:
        mark = agent.mark()
        sub = {"id": 1, "op": "subscribe", "args": {"sub": "huge", "path": str(path), "offset": 0}}
        ask = {"id": 2, "op": "read_range", "args": {"path": str(small), "offset": 0, "length": 2}}
        agent.send_raw((json.dumps(sub) + "\n" + json.dumps(ask) + "\n").encode())
        agent.wait_for(lambda m: m.get("type") == "result" and m.get("id") == 2, since=mark,
                       what="the queued request's answer")
        before = 0
        for m in agent.since(mark):
            if m.get("type") == "result" and m.get("id") == 2:
                break
            if m.get("type") == "log" and m.get("sub") == "huge":
                before += len(base64.b64decode(m["b64"]))
        assert before <= 4 * PUMP_BUDGET, before / PUMP_BUDGET  # the whole backlog is 8
        stream = LogStream(agent, "huge", since=mark)
        stream.wait(lambda s: s.end == path.stat().st_size, timeout=60)


def test_a_log_path_that_stops_resolving_is_one_error_and_the_agent_lives_on(agent: AgentProc,
                                                                             tmp_path: Path) -> None:
    """The log's directory replaced by a file (stat fails with ENOTDIR, not ENOENT): one
    error line naming the log, and the agent keeps following and answering."""
    run = tmp_path / "run"
    run.mkdir()
    path = run / "output.log"
    path.write_bytes(b"a\n")
    _, stream = subscribe(agent, path)
    stream.wait_equal(path)
    mark = agent.mark()
    path.unlink()
    run.rmdir()
    run.write_bytes(b"not a directory")
    err = agent.wait_for(lambda m: m.get("type") == "error", since=mark, what="the error")
    assert err["message"].startswith(f"log {path}: NotADirectoryError"), err
    other = tmp_path / "other.log"
    other.write_bytes(b"b\n")
    _, again = subscribe(agent, other, sub="other")
    again.wait_equal(other)
    assert [m for m in agent.since(mark) if m.get("type") == "error"] == [err]


def test_a_host_whose_libc_cannot_be_loaded_follows_logs_by_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host where ctypes cannot load libc by name (musl has no libc.so.6, and
    find_library finds nothing without ldconfig): the agent polls instead of failing to
    start. Stand-in: ctypes.CDLL made to fail as it does there, in this process."""
    import ctypes

    from remote.agent import follow

    def no_libc(name: str, *args: object, **kw: object) -> None:
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.delenv("EAGLE3_TUI_NO_INOTIFY", raising=False)
    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    watcher = follow.Inotify()
    assert watcher.fd is None
    watcher.sync({"/tmp"})  # no-ops, no error
    watcher.drain()
    assert watcher.watches == {}


def test_a_busy_log_goes_gathered_and_a_line_after_a_quiet_spell_at_once(agent: AgentProc,
                                                                        tmp_path: Path) -> None:
    """A log written at 20 lines/s (one `write()` a line, as a logger writes) reaches the
    client in a few messages a second, each holding the lines since the last, every byte
    in order; the agent sleeps meanwhile instead of waking for each line. A line after a
    quiet spell is not held: it goes as soon as it is seen."""
    from remote.agent.follow import GATHER_S

    path = tmp_path / "run.log"
    path.write_bytes(b"start\n")
    _, stream = subscribe(agent, path)
    stream.wait_equal(path)
    time.sleep(GATHER_S + 0.1)
    mark, wakes, t0 = agent.mark(), wakeups(agent.proc.pid), time.monotonic()
    for i in range(40):
        append(path, b"(VllmWorker TP%d) INFO step %d: Avg prompt throughput: 1234.5 tokens/s\n" % (i % 8, i))
        time.sleep(0.05)
    busy = time.monotonic() - t0
    stream.wait_equal(path)
    wakes = wakeups(agent.proc.pid) - wakes
    sent = [m for m in agent.since(mark) if m.get("type") == "log"]
    assert len(sent) <= busy / GATHER_S + 3, (len(sent), busy)  # not one a line (40)
    assert wakes <= 2 * busy / GATHER_S + 6, (wakes, busy)  # not one (or two) a line
    time.sleep(GATHER_S + 0.1)  # quiet: the next line is not held
    t1 = time.monotonic()
    append(path, b"a line after a quiet spell\n")
    stream.wait_equal(path)
    seen = time.monotonic() - t1
    assert seen < (0.15 if inotify_watched_inodes(agent.proc.pid) is not None else 0.4), seen  # poll: 0.25 s
