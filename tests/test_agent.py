"""The real host agent as a subprocess, against real files and real processes."""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.agent_driver import AGENT, AgentCallError, AgentProc

NO_GPU = {"EAGLE3_TUI_GPU_SOURCE": "none"}


@pytest.fixture(params=["inotify", "poll"])
def agent(request: pytest.FixtureRequest) -> Iterator[AgentProc]:
    """An agent with no GPU source, once with inotify wake-ups and once with the poll."""
    env = dict(NO_GPU)
    if request.param == "poll":
        env["EAGLE3_TUI_NO_INOTIFY"] = "1"
    with AgentProc(env=env) as a:
        yield a


@pytest.fixture
def plain() -> Iterator[AgentProc]:
    with AgentProc(env=NO_GPU) as a:
        yield a


class LogStream:
    """Rebuilds one subscription's byte stream from log/log_reset events, checking that
    every chunk starts exactly where the previous one ended (no gap, no repeat)."""

    def __init__(self, agent: AgentProc, sub: str, start: int = 0, since: int = 0) -> None:
        self.agent, self.sub, self.cursor = agent, sub, since
        self.data = bytearray()
        self.end = start
        self.resets: list[str] = []
        self.log: list[tuple[str, bytes | str]] = []  # ("data", bytes) / ("reset", reason)

    def _feed(self, m: dict) -> None:
        if m.get("sub") != self.sub:
            return
        if m["type"] == "log_reset":
            self.resets.append(m["reason"])
            self.log.append(("reset", m["reason"]))
            self.data.clear()
            self.end = m["offset"]
        elif m["type"] == "log":
            assert m["offset"] == self.end, (m["offset"], self.end)
            chunk = base64.b64decode(m["b64"])
            assert 0 < len(chunk) <= 256 * 1024
            self.data += chunk
            self.end += len(chunk)
            self.log.append(("data", chunk))

    def wait(self, cond: Callable[[LogStream], bool], timeout: float = 10.0) -> None:
        """Feed messages until `cond(self)` holds."""
        if cond(self):
            return

        def pred(m: dict) -> bool:
            self.cursor += 1
            self._feed(m)
            return cond(self)

        self.agent.wait_for(pred, timeout=timeout, since=self.cursor, what="log state")

    def wait_equal(self, path: Path, timeout: float = 10.0) -> None:
        """Wait until the received stream equals the file, byte for byte."""
        self.wait(lambda s: bytes(s.data) == path.read_bytes(), timeout)


def subscribe(agent: AgentProc, path: Path, sub: str = "log", offset: int = 0,
              inode: int | None = None) -> tuple[dict, LogStream]:
    mark = agent.mark()
    res = agent.call("subscribe", {"sub": sub, "path": str(path), "offset": offset,
                                   "inode": inode})
    return res, LogStream(agent, sub, start=offset, since=mark)


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


# ---------------------------------------------------------------- hello, snapshot


def test_hello_fields(plain: AgentProc) -> None:
    h = plain.hello
    assert h["protocol"] == 1
    assert h["agent_sha"] == hashlib.sha256(AGENT.read_bytes()).hexdigest()
    assert h["pid"] == plain.proc.pid
    assert h["python"] == "%d.%d.%d" % sys.version_info[:3]
    assert abs(h["time"] - time.time()) < 60
    assert {"snapshot", "logs", "files"} <= set(h["capabilities"])
    assert h["gpu_source"] is None and "EAGLE3_TUI_GPU_SOURCE" in h["gpu_error"]


def test_snapshot_shape_and_no_gpu(plain: AgentProc) -> None:
    snap = plain.call("snapshot")
    host = snap["host"]
    assert host["cpu_count"] == os.cpu_count()
    assert 0 < host["mem_available"] <= host["mem_total"]
    assert len(host["load"]) == 3 and host["uptime"] > 0
    assert snap["gpus"] == [] and snap["gpu_source"] is None and snap["gpu_error"]
    # No match and no GPU: only processes of runs (other sessions' tests may have some).
    assert all(p["why"] == ["run"] for p in snap["processes"]) and isinstance(snap["runs"], list)
    assert plain.call("snapshot")["seq"] > snap["seq"]


def test_missing_nvidia_smi_is_named(tmp_path: Path) -> None:
    env = {"EAGLE3_TUI_GPU_SOURCE": "nvidia-smi", "PATH": str(tmp_path)}
    with AgentProc(env=env) as a:
        assert a.hello["gpu_source"] is None
        assert a.hello["gpu_error"] == "nvidia-smi not found"


def test_no_periodic_snapshot_before_configure_then_periodic(plain: AgentProc) -> None:
    mark = plain.mark()
    # Absence can only be shown over a window: three 0.4 s round trips, no snapshot event.
    for _ in range(3):
        plain.call("snapshot")
        time.sleep(0.4)
    assert not [m for m in plain.since(mark) if m["type"] == "snapshot"]
    mark = plain.mark()
    plain.call("configure", {"interval": 0.2, "match": None})
    first = plain.wait_for(lambda m: m["type"] == "snapshot", since=mark)
    plain.wait_for(lambda m: m["type"] == "snapshot" and m["seq"] >= first["seq"] + 2,
                   since=mark, timeout=5)


def _snapshot_where(agent: AgentProc, since: int, cond: Callable[[list], bool],
                    timeout: float = 10.0) -> dict:
    return agent.wait_for(lambda m: m["type"] == "snapshot" and cond(m["processes"]),
                          since=since, timeout=timeout, what="snapshot condition")


def test_matching_process_appears_then_disappears(plain: AgentProc) -> None:
    marker = "marker-" + uuid.uuid4().hex
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker])
    try:
        mark = plain.mark()
        plain.call("configure", {"interval": 0.2, "match": marker})
        def mine(procs: list) -> list:
            return [p for p in procs if p["pid"] == child.pid]

        snap = _snapshot_where(plain, mark, lambda ps: bool(mine(ps)))
        (p,) = mine(snap["processes"])
        assert p["why"] == ["match"] and p["run_id"] is None
        assert marker in p["cmdline"] and p["ppid"] == os.getpid()
        assert p["state"] in "RSD" and p["rss"] > 0 and p["elapsed"] >= 0
        assert abs(p["start_time"] - time.time()) < 120
        # cpu is a percentage once there is a previous sample
        snap = _snapshot_where(plain, mark, lambda ps: any(q["cpu"] is not None
                                                           for q in mine(ps)))
        assert 0 <= mine(snap["processes"])[0]["cpu"] < 50
        assert [q for q in snap["processes"] if q["pid"] == plain.proc.pid] == []
    finally:
        child.kill()
        child.wait()
    mark = plain.mark()
    _snapshot_where(plain, mark, lambda ps: not mine(ps))


# A busy loop and an idle sleeper; each says "ready" once Python's start-up (itself CPU
# work) is over, and exits by itself after 30 s should the test not kill it.
BUSY = "import time\nprint('ready', flush=True)\nend = time.monotonic() + 30\n" \
       "while time.monotonic() < end:\n    pass\n"
IDLE = "import time\nprint('ready', flush=True)\ntime.sleep(30)\n"


@pytest.fixture
def busy_idle() -> Iterator[tuple[str, int, int]]:
    """(marker, busy pid, idle pid): two real processes whose argv holds the marker."""
    marker = "cpu-marker-" + uuid.uuid4().hex
    kids = [subprocess.Popen([sys.executable, "-c", code, marker], stdout=subprocess.PIPE)
            for code in (BUSY, IDLE)]
    try:
        for k in kids:
            assert k.stdout is not None and k.stdout.readline() == b"ready\n"
        yield marker, kids[0].pid, kids[1].pid
    finally:
        for k in kids:
            k.kill()
            k.wait()


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """(now, CPU seconds the kernel charged pid): the truth an agent reading is held to."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return time.monotonic(), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _share(before: tuple[float, float], after: tuple[float, float]) -> float:
    """Percent of one core between two _cpu_seconds readings."""
    return 100 * (after[1] - before[1]) / (after[0] - before[0])


def test_cpu_percent_of_busy_and_idle_processes(plain: AgentProc,
                                                busy_idle: tuple[str, int, int]) -> None:
    """Snapshots every 50 ms: far closer together than the CPU window."""
    from remote.agent.proctable import MIN_CPU_WINDOW_S

    marker, busy, idle = busy_idle
    mark = plain.mark()
    plain.call("configure", {"interval": 0.05, "match": marker})
    # Only these two pids count: on a shared machine other runs' processes show too.
    first = _snapshot_where(plain, mark, lambda ps: {busy, idle} <= {p["pid"] for p in ps})
    truth0 = _cpu_seconds(busy)
    got0 = {p["pid"]: p["cpu"] for p in first["processes"]}
    assert (got0[busy], got0[idle]) == (None, None), got0
    last = plain.wait_for(lambda m: m["type"] == "snapshot" and m["time"] > first["time"] + 1.2,
                          since=mark, timeout=10)
    truth = _share(truth0, _cpu_seconds(busy))
    readings = []  # (seconds since the first sample, busy, idle)
    for m in plain.since(mark):
        if m["type"] == "snapshot" and first["seq"] < m["seq"] <= last["seq"]:
            got = {p["pid"]: p["cpu"] for p in m["processes"]}
            readings.append((m["time"] - first["time"], got[busy], got[idle]))
    early = [r for r in readings if r[0] < MIN_CPU_WINDOW_S * 0.9]
    assert len(readings) >= 8 and early, readings
    assert all(r[1] is None and r[2] is None for r in early), readings
    values = [r for r in readings if r[1] is not None]
    assert len(values) >= len(readings) // 2, readings
    # Every reading is sane; the busy loop's typical one (the median: a loaded box can
    # starve a single 0.2 s window) is what the kernel charged it over the same time.
    assert all(0 <= b <= 110 and i is not None and 0 <= i < 5 for _, b, i in values), readings
    assert truth > 20, f"the busy loop got {truth:.0f} % of a core: machine too loaded to judge"
    assert abs(statistics.median(b for _, b, _ in values) - truth) <= 20, (truth, readings)


def test_cpu_base_of_a_reused_pid_is_never_used(busy_idle: tuple[str, int, int]) -> None:
    from remote.agent.proctable import ProcTable, _Proc
    from remote.base import procfs

    busy = busy_idle[1]
    p, st = _Proc(), procfs.read_stat(busy)
    assert st is not None and ProcTable._cpu(p, st, time.monotonic()) is None
    later = procfs.read_stat(busy)
    assert later is not None and ProcTable._cpu(p, later, time.monotonic() + 1) is not None
    stranger = dict(later, start_ticks=later["start_ticks"] + 1)  # same pid, other process
    assert ProcTable._cpu(p, stranger, time.monotonic() + 2) is None


def test_snapshot_right_after_configure_reads_real_cpu(plain: AgentProc,
                                                       busy_idle: tuple[str, int, int]) -> None:
    """`status`: configure (its snapshot is the first sample) then at once a snapshot."""
    marker, busy, idle = busy_idle
    busy_cpu = []
    truth0 = _cpu_seconds(busy)
    for _ in range(3):
        plain.call("configure", {"interval": 3600, "match": marker})
        snap = plain.call("snapshot")
        got = {p["pid"]: p["cpu"] for p in snap["processes"]}
        assert {busy, idle} <= set(got)  # a shared machine's other runs may show too
        assert got[busy] is not None and 0 <= got[busy] <= 110, got
        assert got[idle] is not None and 0 <= got[idle] < 5, got
        busy_cpu.append(got[busy])
    truth = _share(truth0, _cpu_seconds(busy))  # what the kernel charged it meanwhile
    assert truth > 20, f"the busy loop got {truth:.0f} % of a core: machine too loaded to judge"
    assert abs(statistics.median(busy_cpu) - truth) <= 25, (truth, busy_cpu)


def test_agent_excludes_itself_from_match(plain: AgentProc) -> None:
    mark = plain.mark()
    plain.call("configure", {"interval": 0.2, "match": str(AGENT)})
    snap = plain.wait_for(lambda m: m["type"] == "snapshot", since=mark)
    assert plain.proc.pid not in [p["pid"] for p in snap["processes"]]


def test_run_env_marks_a_process_as_run(plain: AgentProc) -> None:
    run_id = "test-run-" + uuid.uuid4().hex[:8]
    env = dict(os.environ, EAGLE3_TUI_RUN_ID=run_id)
    child = subprocess.Popen(["sleep", "600"], env=env)
    try:
        mark = plain.mark()
        plain.call("configure", {"interval": 0.2})
        snap = _snapshot_where(plain, mark, lambda ps: any(p["pid"] == child.pid for p in ps))
        (p,) = [q for q in snap["processes"] if q["pid"] == child.pid]
        assert p["why"] == ["run"] and p["run_id"] == run_id
    finally:
        child.kill()
        child.wait()


# ---------------------------------------------------------------- log following


def test_log_missing_then_created_and_appends(agent: AgentProc, tmp_path: Path) -> None:
    path = tmp_path / "sub" / "run.log"  # even the directory does not exist yet
    res, stream = subscribe(agent, path)
    assert res == {"inode": None, "size": None, "offset": 0}
    stream.wait(lambda s: s.resets == ["missing"])
    path.parent.mkdir()
    path.write_bytes(b"line 1\n")
    stream.wait_equal(path)
    assert stream.resets == ["missing", "appeared"]
    append(path, b"line 2\npartial")  # no trailing newline
    stream.wait_equal(path)
    append(path, b" completed\n")
    stream.wait_equal(path)
    assert stream.end == path.stat().st_size


def test_log_odd_bytes_pass_exactly(agent: AgentProc, tmp_path: Path) -> None:
    path = tmp_path / "odd.log"
    path.write_bytes(b"")
    _, stream = subscribe(agent, path)
    append(path, b"Loading 10%\rLoading 55%\rLoading 100%\r\n")  # tqdm redraws
    stream.wait_equal(path)
    append(path, b"bad utf8: \xff\xfe\xc3\x28 end\n")
    stream.wait_equal(path)
    big = os.urandom(1024 * 1024).replace(b"\n", b"x") + b"\n"  # one 1 MiB line
    append(path, big)
    stream.wait_equal(path)
    assert stream.resets == []
    assert max(len(c) for k, c in stream.log if k == "data") <= 256 * 1024


def test_log_truncation(agent: AgentProc, tmp_path: Path) -> None:
    path = tmp_path / "t.log"
    path.write_bytes(b"a long first line\nsecond\n")
    _, stream = subscribe(agent, path)
    stream.wait_equal(path)
    with open(path, "r+b") as f:
        f.truncate(0)
    stream.wait(lambda s: s.resets == ["truncated"])
    append(path, b"fresh\n")
    stream.wait_equal(path)


def test_log_rotation_drains_old_tail(agent: AgentProc, tmp_path: Path) -> None:
    path = tmp_path / "r.log"
    path.write_bytes(b"old 1\n")
    _, stream = subscribe(agent, path)
    stream.wait_equal(path)
    old = path.read_bytes()
    # Tail of the old file, then atomically put a new file in its place: the path
    # never goes missing, so the only way to see the tail is the drain of the old fd.
    # The tail goes in through a hard link in another directory, which the agent's
    # inotify watch does not see: woken first by the rotation, the inotify variant
    # too has only the drain to read it (written through `path`, the write's own
    # wake-up would read it before the rotation, drain or not).
    new = tmp_path / "r.log.new"
    new.write_bytes(b"new 1\n")
    (tmp_path / "elsewhere").mkdir()
    alias = tmp_path / "elsewhere" / "r.log.1"
    os.link(path, alias)
    time.sleep(0.5)  # the wake-ups of the set-up above are over: only the two steps below
    append(alias, b"old tail\n")
    os.replace(new, path)
    stream.wait(lambda s: "rotated" in s.resets)
    stream.wait_equal(path)
    assert stream.resets == ["rotated"]
    before = b"".join(c for k, c in stream.log[: stream.log.index(("reset", "rotated"))]
                      if isinstance(c, bytes))
    assert before == old + b"old tail\n"
    assert stream.end == path.stat().st_size


def test_log_resume_from_offset(agent: AgentProc, tmp_path: Path) -> None:
    path = tmp_path / "resume.log"
    path.write_bytes(b"".join(b"line %d \xfe\n" % i for i in range(2000)))
    content = path.read_bytes()
    ino = path.stat().st_ino
    cut = len(content) // 3 + 5  # mid-line on purpose
    res, stream = subscribe(agent, path, offset=cut, inode=ino)
    assert res == {"inode": ino, "size": len(content), "offset": cut}
    stream.wait(lambda s: s.end == len(content))
    assert stream.resets == [] and bytes(stream.data) == content[cut:]
    append(path, b"after resume\n")
    stream.wait(lambda s: s.end == path.stat().st_size)
    assert bytes(stream.data) == path.read_bytes()[cut:]
    # a stale inode means another file: start over from 0
    _, stale = subscribe(agent, path, sub="stale", offset=cut, inode=ino + 999999)
    stale.wait_equal(path)
    assert stale.resets == ["rotated"]
    # an offset past the end with the right inode: the file was truncated meanwhile
    _, past = subscribe(agent, path, sub="past", offset=len(content) * 2, inode=ino)
    past.wait_equal(path)
    assert past.resets == ["truncated"]


def test_log_tail_starts_at_a_whole_line(agent: AgentProc, tmp_path: Path) -> None:
    path = tmp_path / "tail.log"
    path.write_bytes(b"".join(b"line %05d\n" % i for i in range(10000)))  # 11 bytes a line
    content = path.read_bytes()
    res, _ = subscribe(agent, path, offset=-1000)
    start = res["offset"]
    assert len(content) - 1000 <= start < len(content) - 1000 + 11
    assert content[start - 1 : start] == b"\n"  # the first line sent is whole
    stream = LogStream(agent, "log", start=start, since=0)
    stream.wait(lambda s: s.end == len(content))
    assert bytes(stream.data) == content[start:]
    small = tmp_path / "small.log"
    small.write_bytes(b"a\nb\n")
    res, _ = subscribe(agent, small, sub="small", offset=-1000)
    assert res["offset"] == 0  # shorter than the tail asked for: everything


def test_log_random_appends_and_truncations(agent: AgentProc, tmp_path: Path) -> None:
    counter = iter(range(10**6))
    ops = st.lists(st.one_of(st.binary(min_size=1, max_size=3000).map(lambda b: ("append", b)),
                             st.integers(0, 2000).map(lambda n: ("truncate", n))),
                   min_size=1, max_size=5)

    @settings(max_examples=4, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(ops)
    def run(seq: list) -> None:
        n = next(counter)
        path = tmp_path / ("h%d.log" % n)
        path.write_bytes(b"")
        _, stream = subscribe(agent, path, sub="h%d" % n)
        for kind, value in seq:
            size = path.stat().st_size
            if kind == "append":
                append(path, value)
            elif value < size:
                resets = len(stream.resets)
                os.truncate(path, value)
                stream.wait(lambda s: len(s.resets) > resets)  # noqa: B023
                assert stream.resets[-1] == "truncated"
            stream.wait_equal(path)
        agent.call("unsubscribe", {"sub": "h%d" % n})

    run()


def test_read_range(plain: AgentProc, tmp_path: Path) -> None:
    path = tmp_path / "range.bin"
    data = os.urandom(100_000)
    path.write_bytes(data)
    res = plain.call("read_range", {"path": str(path), "offset": 1234, "length": 5000})
    assert base64.b64decode(res["b64"]) == data[1234:6234]
    assert res["size"] == len(data) and res["inode"] == path.stat().st_ino
    with pytest.raises(AgentCallError, match="4 MiB"):
        plain.call("read_range", {"path": str(path), "offset": 0, "length": 5 * 2**20})
    with pytest.raises(AgentCallError, match="does not exist"):
        plain.call("read_range", {"path": str(tmp_path / "nope"), "offset": 0, "length": 1})


# ---------------------------------------------------------------- protocol hygiene


def test_bad_request_lines(plain: AgentProc) -> None:
    mark = plain.mark()
    plain.send_raw(b"this is not json\n")
    plain.send_raw(b"\xff\xfe\n")
    plain.send_raw(b'{"op": "snapshot"}\n')
    plain.send_raw(b"[1, 2]\n")
    plain.wait_for(lambda m: m["type"] == "error" and "[1, 2]" in m["message"], since=mark)
    errors = [m for m in plain.since(mark) if m["type"] == "error"]
    assert len(errors) == 4 and all("\n" not in e["message"] for e in errors)
    plain.send_raw(b'{"id": 50, "args": {}}\n')
    assert "op" in plain.result(50)["error"]
    plain.send_raw(b'{"id": 51, "op": "snapshot", "args": [1]}\n')
    assert plain.result(51)["ok"] is False
    bad = [("nonsense", {}, "unknown op"), ("subscribe", {"sub": "x"}, "'path'"),
           ("read_range", {"path": 3, "offset": 0, "length": 1}, "wrong type"),
           ("configure", {"interval": -1}, "interval")]
    for op, args, text in bad:
        with pytest.raises(AgentCallError, match=text):
            plain.call(op, args)
    assert plain.call("snapshot")["seq"] >= 1  # still alive and answering
    assert plain.bad_lines == []


def test_eof_exits_zero_promptly(tmp_path: Path) -> None:
    with AgentProc(env=NO_GPU) as a:
        path = tmp_path / "x.log"
        path.write_bytes(b"x\n")
        a.call("configure", {"interval": 0.5})
        a.call("subscribe", {"sub": "s", "path": str(path), "offset": 0})
        t0 = time.monotonic()
        a.close_stdin()
        assert a.wait_exit(timeout=5) == 0
        assert time.monotonic() - t0 < 3


def test_runner_missing_gives_clear_error(tmp_path: Path) -> None:
    # A copy of the agent's package without run/runner.py: the ops that need it say so.
    shutil.copytree(AGENT.parent.parent, tmp_path / "remote", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "remote" / "run" / "runner.py").unlink()
    # -S, as a bare host: the test venv's editable install of this package would else
    # supply the missing `remote.runner` from the checkout.
    bare = tmp_path / "python-S"
    bare.write_text('#!/bin/sh\nexec %s -S "$@"\n' % shlex.quote(sys.executable))
    bare.chmod(0o755)
    with AgentProc(env=NO_GPU, agent=tmp_path / "remote" / "agent" / "main.py", python=str(bare)) as a:
        assert "runs" not in a.hello["capabilities"]
        for op, args in [("launch", {"name": "x", "argv": ["true"]}), ("runs", {}),
                         ("kill", {"run_id": "x"})]:
            with pytest.raises(AgentCallError, match="runner unavailable: .*runner"):
                a.call(op, args)
        assert a.call("snapshot")["runs"] == []


# ---------------------------------------------------------------- file ops


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_file_read_write_atomic(plain: AgentProc, tmp_path: Path) -> None:
    path, backup = tmp_path / "gen.py", tmp_path / "gen.py.orig"
    assert plain.call("file_read", {"path": str(path)})["exists"] is False
    v0 = b"print('pristine')\n"
    def w(data: bytes, expect: str | None) -> dict:
        return plain.call("file_write", {
            "path": str(path), "b64": base64.b64encode(data).decode(),
            "expect_sha256": expect, "backup": str(backup)})
    assert w(v0, None) == {"sha256": _sha(v0)}
    assert not backup.exists()  # nothing to back up when the file did not exist
    os.chmod(path, 0o751)
    r = plain.call("file_read", {"path": str(path)})
    assert r == {"exists": True, "sha256": _sha(v0), "size": len(v0), "mode": 0o751,
                 "b64": base64.b64encode(v0).decode()}
    v1 = b"print('v1')\n"
    with pytest.raises(AgentCallError) as exc:
        w(v1, _sha(b"something else"))
    msg = str(exc.value)
    assert _sha(v0)[:12] in msg and _sha(b"something else")[:12] in msg and "\n" not in msg
    assert path.read_bytes() == v0
    with pytest.raises(AgentCallError, match="must not exist"):
        w(v1, None)
    assert w(v1, _sha(v0)) == {"sha256": _sha(v1)}
    assert path.read_bytes() == v1 and (path.stat().st_mode & 0o7777) == 0o751
    assert backup.read_bytes() == v0
    v2 = b"print('v2')\n"
    w(v2, _sha(v1))
    assert backup.read_bytes() == v0  # backed up once, never overwritten
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen.py", "gen.py.orig"]


def test_resolve_module_never_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "boompkg"
    (pkg / "data_generation").mkdir(parents=True)
    sentinel = tmp_path / "IMPORTED"
    (pkg / "__init__.py").write_text("open(%r, 'w').close()\n" % str(sentinel))
    target = pkg / "data_generation" / "vllm_hidden_states_generator.py"
    target.write_text("x = 1\n")
    with AgentProc(env=dict(NO_GPU, PYTHONPATH=str(tmp_path))) as a:
        res = a.call("resolve_module", {"python": sys.executable,
                                        "module": "boompkg.data_generation."
                                                  "vllm_hidden_states_generator"})
        assert res == {"origin": str(target), "search_paths": [str(pkg)], "version": None}
        assert not sentinel.exists()
        res = a.call("resolve_module", {"python": sys.executable, "module": "hypothesis"})
        import hypothesis
        assert res["version"] == hypothesis.__version__
        assert res["origin"] == hypothesis.__file__
        res = a.call("resolve_module", {"python": sys.executable, "module": "no_such_pkg_xyz"})
        assert res == {"origin": None, "search_paths": [], "version": None}
        with pytest.raises(AgentCallError, match="^python3-nowhere not found on host$"):
            a.call("resolve_module", {"python": "python3-nowhere", "module": "x"})
        with pytest.raises(AgentCallError, match="dotted module"):
            a.call("resolve_module", {"python": sys.executable, "module": "os; rm -rf"})


def test_py_compile(plain: AgentProc) -> None:
    good = base64.b64encode(b"def f(x):\n    return x\n").decode()
    bad = base64.b64encode(b"def f(x:\n    return x\n").decode()
    args = {"python": sys.executable, "filename": "gen.py"}
    assert plain.call("py_compile", dict(args, b64=good)) == {"ok": True, "error": None}
    res = plain.call("py_compile", dict(args, b64=bad))
    assert res["ok"] is False and res["error"].startswith("gen.py:1:")



# ---------------------------------------------------------------- GPU fallback, Python 3.9

# Recorded on the H200 device machine while a torch process held 2 GiB (pid 1589).
SMI_GPU_REAL = "0, NVIDIA H200, GPU-75dc73da-78d6-3405-d610-419a0819d22a, 2575, 143771, 0, " \
               "35, 87.86, 700.00"
SMI_APPS_REAL = "GPU-75dc73da-78d6-3405-d610-419a0819d22a, 1589, 2566"
# Hand-edited second card: the unavailable markers nvidia-smi prints must become null.
SMI_GPU_NA = "1, NVIDIA H200, GPU-00000000-0000-0000-0000-000000000001, 0, 143771, [N/A], " \
             "[Not Supported], [N/A], [N/A]"

FAKE_SMI = """#!{python}
import sys
arg = sys.argv[1]
if arg.startswith("--query-gpu="):
    print({gpu!r}); print({na!r})
elif arg.startswith("--query-compute-apps="):
    print({apps!r})
else:
    sys.exit("unexpected " + arg)
"""


def test_nvidia_smi_fallback_parses_recorded_output(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable, gpu=SMI_GPU_REAL, na=SMI_GPU_NA,
                                   apps=SMI_APPS_REAL))
    smi.chmod(0o755)
    env = dict(NO_GPU, EAGLE3_TUI_GPU_SOURCE="nvidia-smi", PATH=str(tmp_path))
    with AgentProc(env=env) as a:
        assert a.hello["gpu_source"] == "nvidia-smi" and a.hello["gpu_error"] is None
        snap = a.call("snapshot")
    mib = 1024 * 1024
    g0, g1 = snap["gpus"]
    assert g0 == {"index": 0, "name": "NVIDIA H200",
                  "uuid": "GPU-75dc73da-78d6-3405-d610-419a0819d22a", "mem_used": 2575 * mib,
                  "mem_total": 143771 * mib, "util": 0, "temp": 35, "power": 87.86,
                  "power_limit": 700.0, "processes": [{"pid": 1589, "mem": 2566 * mib}]}
    assert g1["util"] is None and g1["temp"] is None and g1["power"] is None
    assert g1["power_limit"] is None and g1["mem_used"] == 0 and g1["processes"] == []
    # pid 1589 holds GPU memory, so it is listed even though it is not a process here
    assert 1589 in [p["pid"] for p in snap["processes"] if "gpu" in p["why"]]


def _python39() -> str | None:
    """A working Python 3.9 interpreter (pyenv shims may exist yet refuse to run)."""
    found = [shutil.which("python3.9")]
    found += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.9*/bin/python3.9"))
    for exe in filter(None, found):
        if subprocess.run([exe, "-c", "pass"], capture_output=True, check=False).returncode == 0:
            return exe
    return None


PYTHON39 = _python39()


@pytest.mark.skipif(PYTHON39 is None, reason="no working python3.9 on this machine")
def test_agent_runs_on_python39(tmp_path: Path) -> None:
    path = tmp_path / "x.log"
    path.write_bytes(b"hello \xff\n")
    python = PYTHON39
    assert python
    with AgentProc(env=NO_GPU, python=python) as a:
        assert a.hello["python"].startswith("3.9.")
        assert a.call("snapshot")["host"]["mem_total"] > 0
        _, stream = subscribe(a, path)
        stream.wait_equal(path)
        res = a.call("file_write", {"path": str(tmp_path / "f"), "b64": "eA==",
                                    "expect_sha256": None, "backup": None})
        assert res["sha256"] == _sha(b"x")


# ---------------------------------------------------------------- runs through runner.py


def test_launch_snapshot_kill_through_agent(plain: AgentProc, tmp_path: Path) -> None:
    runs_dir = tmp_path / "runs"
    mark = plain.mark()
    plain.call("configure", {"interval": 0.2, "runs_dir": str(runs_dir)})
    script = "import time; print('started', flush=True); time.sleep(600)"
    rec = plain.call("launch", {"name": "agent-test", "argv": [sys.executable, "-c", script],
                                "cwd": str(tmp_path), "env": {}, "patch_state": {"v": 2},
                                "log": None})
    run_id = rec["run_id"]
    assert rec["state"] == "running" and rec["patch_state"] == {"v": 2}
    snap = _snapshot_where(plain, mark, lambda ps: any(p["pid"] == rec["pid"] for p in ps))
    (p,) = [q for q in snap["processes"] if q["pid"] == rec["pid"]]
    assert "run" in p["why"] and p["run_id"] == run_id
    assert [r["run_id"] for r in snap["runs"]] == [run_id]
    _, stream = subscribe(plain, Path(rec["log"]), sub="run")
    stream.wait(lambda s: b"started\n" in s.data)
    assert plain.call("runs")["runs"][0]["run_id"] == run_id
    mark = plain.mark()
    rid = plain.send("kill", {"run_id": run_id, "graces": [2, 2], "gpu_wait": 0})
    report = plain.result(rid, timeout=30)
    assert report["ok"], report
    stages = [m["stage"] for m in plain.since(mark)
              if m["type"] == "kill_progress" and m["id"] == rid]
    assert stages[0] == "SIGINT" and stages[-1] == "done"
    after = plain.wait_for(lambda m: m["type"] == "snapshot"
                           and m["runs"][0]["state"] in ("killed", "exited"), since=mark)
    assert rec["pid"] not in [q["pid"] for q in after["processes"]]
    with pytest.raises(AgentCallError, match="^no run nope$"):
        plain.call("kill", {"run_id": "nope"})



# ---------------------------------------------------------------- client gone mid-kill

IGNORES_SIGINT = ("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                  "print('ready', flush=True)\ntime.sleep(60)\n")


def _read_until(proc: subprocess.Popen, pred: Callable[[dict], bool], timeout: float = 15.0) -> dict:
    """Read the agent's stdout lines until one satisfies pred (deadline, never a hang)."""
    import json
    import select

    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], deadline - time.monotonic())
        if not ready:
            break
        line = proc.stdout.readline()
        if not line:
            break
        msg = json.loads(line)
        if pred(msg):
            return msg
    raise TimeoutError("agent never sent the awaited line")


@pytest.mark.parametrize("gone", ["stdin-eof", "link-drop"])
def test_kill_completes_after_the_client_goes(tmp_path: Path, gone: str) -> None:
    """The client quits (stdin EOF) or the link drops (stdout broken too) right after
    asking for a kill: the agent still escalates to SIGTERM and records killed.json."""
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-u", str(AGENT), "--runs-dir", str(runs)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=dict(os.environ, **NO_GPU))
    assert proc.stdin is not None and proc.stdout is not None
    pid = None
    try:
        def send(rid: int, op: str, args: dict) -> None:
            import json
            proc.stdin.write((json.dumps({"id": rid, "op": op, "args": args}) + "\n").encode())
            proc.stdin.flush()

        send(1, "launch", {"name": "stubborn", "argv": [sys.executable, "-c", IGNORES_SIGINT],
                           "cwd": str(tmp_path), "env": {}})
        rec = _read_until(proc, lambda m: m.get("type") == "result" and m["id"] == 1)["result"]
        pid, run_dir = rec["pid"], runs / rec["run_id"]
        deadline = time.monotonic() + 15
        while b"ready" not in Path(rec["log"]).read_bytes():  # SIGINT is ignored from here on
            assert time.monotonic() < deadline, "the run never became ready"
            time.sleep(0.02)
        send(2, "kill", {"run_id": rec["run_id"], "graces": [1, 1], "gpu_wait": 0})
        _read_until(proc, lambda m: m.get("type") == "kill_progress" and m["stage"] == "SIGINT")
        proc.stdin.close()
        if gone == "link-drop":
            proc.stdout.close()
        assert proc.wait(timeout=20) == 0
        st = procfs_stat(pid)
        assert st is None or st["state"] in ("Z", "X"), "the run outlived the kill"
        assert (run_dir / "killed.json").exists()
        pid = None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pid is not None and procfs_stat(pid) is not None:
            os.kill(pid, 9)


def procfs_stat(pid: int) -> dict | None:
    from remote.base import procfs

    return procfs.read_stat(pid)


# ---------------------------------------------------------------- paths, external runs


def test_tilde_paths_expand_on_the_host(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run = home / "runs" / "20250101-000000-abcd"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text('{"name": "old", "pid": 1, "launched_at": 1.0}')
    (run / "exit.json").write_text('{"exit_code": 0, "ended_at": 2.0}')
    (home / "x.log").write_bytes(b"tilde\n")
    env = dict(NO_GPU, HOME=str(home))
    with AgentProc(env=env, args=["--runs-dir", "~/runs"]) as a:
        assert [r["run_id"] for r in a.call("runs")["runs"]] == [run.name]
    with AgentProc(env=env) as a:
        a.call("configure", {"interval": 60, "runs_dir": "~/runs"})
        assert [r["run_id"] for r in a.call("runs")["runs"]] == [run.name]
        assert base64.b64decode(a.call("file_read", {"path": "~/x.log"})["b64"]) == b"tilde\n"
        got = a.call("read_range", {"path": "~/x.log", "offset": 0, "length": 5})
        assert base64.b64decode(got["b64"]) == b"tilde"
        res, stream = subscribe(a, Path("~/x.log"))
        assert res["size"] == 6
        stream.wait(lambda s: bytes(s.data) == b"tilde\n")
        a.call("file_write", {"path": "~/new.txt", "b64": "eA==", "expect_sha256": None,
                              "backup": None})
        assert (home / "new.txt").read_bytes() == b"x"


def test_external_run_listed_and_killed_through_the_agent(plain: AgentProc) -> None:
    marker = "ext-marker-" + uuid.uuid4().hex
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        plain.call("configure", {"interval": 3600, "match": marker})
        (rec,) = [r for r in plain.call("runs")["runs"] if r["external"]]
        assert rec["external"] and rec["pid"] == child.pid
        assert rec["run_id"] == "ext-%d-%d" % (child.pid, procfs_stat(child.pid)["start_ticks"])
        report = plain.call("kill", {"run_id": rec["run_id"], "graces": [1, 1], "gpu_wait": 0})
        assert report["ok"] and child.wait(timeout=5) is not None
        plain.call("configure", {"match": None})
        with pytest.raises(AgentCallError, match="no match is configured"):
            plain.call("kill", {"run_id": rec["run_id"]})
    finally:
        child.kill()
        child.wait()


def test_periodic_snapshots_carry_only_the_runs_that_changed(plain: AgentProc, tmp_path: Path) -> None:
    """A host keeps every run it ran. Each periodic snapshot names all of them in
    `run_ids`, in order, and sends only the records that are new or changed since the
    last one (a running run's duration moves, an ended run's record does not); the first
    snapshot after `configure` and the `snapshot` op's reply carry every record."""
    runs_dir = tmp_path / "runs"
    plain.call("configure", {"interval": 0.2, "runs_dir": str(runs_dir)})
    ended = [plain.call("launch", {"name": f"old{i}", "argv": ["true"], "cwd": str(tmp_path), "env": {},
                                   "patch_state": None, "log": None})["run_id"] for i in range(4)]
    live = plain.call("launch", {"name": "live", "argv": [sys.executable, "-c", "import time; time.sleep(600)"],
                                 "cwd": str(tmp_path), "env": {}, "patch_state": None, "log": None})
    deadline = time.monotonic() + 15
    while {r["run_id"]: r["state"] for r in plain.call("runs")["runs"]} != {**dict.fromkeys(ended, "exited"),
                                                                          live["run_id"]: "running"}:
        assert time.monotonic() < deadline, plain.call("runs")
        time.sleep(0.1)
    mark = plain.mark()
    plain.call("configure", {"interval": 0.2, "runs_dir": str(runs_dir)})
    first = plain.wait_for(lambda m: m["type"] == "snapshot", since=mark)
    order = [r["run_id"] for r in first["runs"]]
    assert "run_ids" not in first and sorted(order) == sorted([*ended, live["run_id"]])
    later = [plain.wait_for(lambda m, s=s: m["type"] == "snapshot" and m["seq"] == first["seq"] + s, since=mark)
             for s in (1, 2, 3)]
    for snap in later:
        assert snap["run_ids"] == order
        assert [r["run_id"] for r in snap["runs"]] == [live["run_id"]]  # its duration moved
    assert later[-1]["runs"][0]["duration"] > first["runs"][order.index(live["run_id"])]["duration"]
    whole = plain.call("snapshot")
    assert "run_ids" not in whole and [r["run_id"] for r in whole["runs"]] == order
    mark = plain.mark()
    os.kill(live["pid"], 9)
    gone = plain.wait_for(lambda m: m["type"] == "snapshot" and any(r["state"] != "running" for r in m["runs"]),
                          since=mark, what="the killed run's record")
    assert [r["run_id"] for r in gone["runs"]] == [live["run_id"]] and gone["run_ids"] == order
    quiet = plain.wait_for(lambda m: m["type"] == "snapshot" and m["seq"] == gone["seq"] + 2, since=mark)
    assert quiet["runs"] == [] and quiet["run_ids"] == order  # nothing changed: no record at all
