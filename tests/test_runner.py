"""remote/run/runner.py and remote/run/kill.py against real processes: launch, survive, list, kill, external runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from remote.agent import proctable
from remote.base import procfs
from remote.run import kill as killer
from remote.run import runner
from tests import checkout

REPO = checkout.ROOT
GRACES = (0.5, 0.5)

# The run: a parent with two spawn-started workers (one ignores SIGINT and SIGTERM,
# like a wedged vLLM worker) and a double-forked grandchild that re-parents away.
RUN_SCRIPT = """\
import multiprocessing as mp, os, signal, sys, time

def say(role):
    os.write(1, ("ready %s %d" % (role, os.getpid()) + "\\n").encode())  # one write: lines of several processes \
never interleave

def worker(stubborn):
    if stubborn:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    say("stubborn" if stubborn else "worker")
    while True:
        time.sleep(0.05)

if __name__ == "__main__":
    say("main")
    if os.fork() == 0:
        if os.fork() == 0:
            say("grandchild")
            while True:
                time.sleep(0.05)
        os._exit(0)
    os.wait()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(s,)) for s in (False, True)]
    for p in procs:
        p.start()
    while True:
        time.sleep(0.05)
"""

SLEEPER = "import time\nwhile True:\n    time.sleep(0.05)\n"


def wait_for(pred: Callable[[], object], timeout: float = 10.0, what: str = "condition"):
    """Poll pred until it returns something truthy, or fail after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


def alive(pid: int, ticks: int | None = None) -> bool:
    st = procfs.read_stat(pid)
    if st is None or st["state"] in ("Z", "X"):
        return False
    return ticks is None or st["start_ticks"] == ticks


def ticks(pid: int) -> int:
    st = procfs.read_stat(pid)
    assert st is not None
    return st["start_ticks"]


def ready_pids(path: str, roles: list[str]) -> dict[str, int] | None:
    """{role: pid} once every role has printed its ready line to the log."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    found = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "ready":
            found[parts[1]] = int(parts[2])
    return found if all(r in found for r in roles) else None


def snapshot_procs() -> list[dict]:
    """Every process in the agent protocol's snapshot shape, read from /proc."""
    btime = procfs.boot_time()
    out = []
    for pid in procfs.list_pids():
        st, cmd = procfs.read_stat(pid), procfs.read_cmdline(pid)
        if st is None or cmd is None:
            continue
        out.append(
            {
                "pid": pid,
                "ppid": st["ppid"],
                "pgid": st["pgid"],
                "sid": st["sid"],
                "start_time": procfs.start_time(st, btime),
                "cmdline": cmd,
                "user": None,
                "run_id": procfs.read_environ_var(pid, runner.RUN_ENV),
            }
        )
    return out


@pytest.fixture
def env(tmp_path: Path):
    """runs_dir, a spawn helper and a finalizer that kills whatever a test left."""
    runs_dir = str(tmp_path / "runs")
    popens: list[subprocess.Popen] = []
    pids: dict[int, int] = {}

    class Env:
        runs = runs_dir
        tmp = tmp_path

        @staticmethod
        def script(name: str, text: str) -> str:
            path = tmp_path / name
            path.write_text(text)
            return str(path)

        @staticmethod
        def spawn(argv: list[str], **kw) -> subprocess.Popen:
            kw.setdefault("start_new_session", True)
            # SIGINT as in a terminal, even when the suite runs as a background job
            # (which starts with SIGINT ignored, and children inherit that).
            kw.setdefault("preexec_fn", lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            p = subprocess.Popen(argv, cwd=str(tmp_path), **kw)
            popens.append(p)
            return p

        @staticmethod
        def adopt(pid: int) -> None:
            """Remember a process (by start_ticks) for the finalizer to kill."""
            pids[pid] = ticks(pid)

    yield Env
    for run in runner.list_runs(runs_dir):
        if run["state"] == "running":
            killer.kill(runs_dir, run["run_id"], graces=(0, 0), gpu_wait=0)
    for pid, t in pids.items():
        if alive(pid, t):
            os.kill(pid, signal.SIGKILL)
    for p in popens:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.kill()
        p.wait()


def launch_sleeper(env, name: str = "svc") -> dict:
    return runner.launch(env.runs, name, [sys.executable, "-c", SLEEPER], str(env.tmp), {})


def test_kill_reaches_every_process_of_the_run_and_nothing_else(env):
    script = env.script("extract_job.py", RUN_SCRIPT)
    argv = [sys.executable, script]
    roles = ["main", "worker", "stubborn", "grandchild"]
    # A decoy with the very same command line, outside the run.
    decoy_log = open(env.tmp / "decoy.log", "wb")
    env.spawn(argv, stdout=decoy_log, stderr=subprocess.STDOUT)
    rec = runner.launch(env.runs, "job", argv, str(env.tmp), {"FOO": "bar"})
    assert rec["state"] == "running" and rec["pid"] != rec["shim_pid"]
    assert rec["sid"] == rec["shim_pid"] and rec["pgid"] == rec["pid"]
    run = wait_for(lambda: ready_pids(rec["log"], roles), what="run ready")
    decoy = wait_for(lambda: ready_pids(str(env.tmp / "decoy.log"), roles), what="decoy ready")
    for pid in list(run.values()) + list(decoy.values()):
        env.adopt(pid)
    # The grandchild re-parented to the shim (subreaper), and carries the marker.
    assert procfs.read_stat(run["grandchild"])["ppid"] == rec["shim_pid"]
    assert procfs.read_environ_var(run["grandchild"], runner.RUN_ENV) == rec["run_id"]
    # A process outside the run's tree and session, found only by its marker.
    marked = env.spawn(
        [sys.executable, "-c", SLEEPER], env=dict(os.environ, **{runner.RUN_ENV: rec["run_id"]})
    )
    wait_for(lambda: procfs.read_environ_var(marked.pid, runner.RUN_ENV), what="marked")

    events: list[dict] = []
    t0 = time.monotonic()
    report = killer.kill(env.runs, rec["run_id"], graces=GRACES, gpu_wait=0, progress=events.append)
    took = time.monotonic() - t0

    assert report["ok"] is True and report["remaining"] == []
    assert report["gpus_free"] is None  # no GPU source given
    assert [s["signal"] for s in report["stages"]] == ["SIGINT", "SIGTERM", "SIGKILL"]
    assert run["stubborn"] in report["stages"][2]["sent_to"]
    assert rec["shim_pid"] not in sum((s["sent_to"] for s in report["stages"]), [])
    for role, pid in run.items():
        assert not alive(pid), role
    assert not alive(marked.pid)
    for role, pid in decoy.items():
        assert alive(pid), "decoy " + role
    assert took < sum(GRACES) + 1.0, took
    stages = [e["stage"] for e in events]
    assert stages[0] == "SIGINT" and stages[-1] == "done" and "SIGKILL" in stages
    # The shim reaps everything, writes exit.json, and the run reads as killed.
    wait_for(
        lambda: os.path.exists(os.path.join(os.path.dirname(rec["log"]), "exit.json")),
        what="exit.json",
    )
    (after,) = runner.list_runs(env.runs)
    assert after["state"] == "killed" and after["signal"] == "SIGTERM"
    assert "ready main" in Path(rec["log"]).read_text()


def test_reused_pid_is_never_signalled(env):
    decoy = env.spawn([sys.executable, "-c", SLEEPER])
    wait_for(lambda: alive(decoy.pid), what="decoy")
    rec = launch_sleeper(env)
    killer.kill(env.runs, rec["run_id"], graces=(0.2, 0.2), gpu_wait=0)
    exit_json = os.path.join(env.runs, rec["run_id"], "exit.json")
    wait_for(lambda: os.path.exists(exit_json), what="the shim's exit record")  # the shim's last act
    # Doctor the manifest: the run's pid, group and session now name the decoy (a
    # session and group leader) which started at a different time than recorded.
    path = os.path.join(env.runs, rec["run_id"], "manifest.json")
    manifest = json.loads(Path(path).read_text())
    # exit.json is the shim's last write, not its exit: once the record is removed, a
    # shim still exiting would make the run read as running.
    wait_for(lambda: not alive(manifest["shim_pid"], manifest["shim_start_ticks"]), what="the shim's exit")
    manifest.update(pid=decoy.pid, pgid=decoy.pid, sid=decoy.pid, start_ticks=ticks(decoy.pid) + 1)
    Path(path).write_text(json.dumps(manifest))
    os.remove(exit_json)

    report = killer.kill(env.runs, rec["run_id"], graces=(0.2, 0.2), gpu_wait=0)
    assert report["ok"] and report["stages"] == []
    assert alive(decoy.pid) and procfs.read_stat(decoy.pid)["state"] != "T"
    assert runner.list_runs(env.runs)[0]["state"] == "killed"  # from the first kill


def test_run_survives_its_launcher_and_records_exit(env):
    go = env.tmp / "go"
    script = env.script(
        "job.py",
        textwrap.dedent("""\
        import os, sys, time
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.02)
        sys.exit(3)
    """),
    )
    code = (
        "import json, sys; sys.path.insert(0, %r); from remote.run import runner; "
        "print(json.dumps(runner.launch(%r, 'job', [sys.executable, %r, %r], %r, {})))"
        % (str(REPO), env.runs, script, str(go), str(env.tmp))
    )
    launcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    out, _ = launcher.communicate(timeout=30)
    assert launcher.returncode == 0
    rec = json.loads(out)
    # The launcher is gone; the run and its shim keep going, detached from it.
    (now,) = runner.list_runs(env.runs)
    assert now["state"] == "running" and alive(rec["pid"], rec["start_ticks"])
    assert procfs.read_stat(rec["shim_pid"])["ppid"] != launcher.pid  # re-parented
    go.touch()
    done = wait_for(
        lambda: [r for r in runner.list_runs(env.runs) if r["state"] == "exited"],
        what="run to exit",
    )
    assert done[0]["exit_code"] == 3 and done[0]["signal"] is None
    assert done[0]["duration"] is not None and done[0]["ended_at"] >= done[0]["launched_at"]
    exit_info = json.loads(Path(env.runs, rec["run_id"], "exit.json").read_text())
    assert exit_info["exit_code"] == 3 and exit_info["strays_outlived"] is False


@pytest.mark.parametrize("subreaper", [True, False], ids=["subreaper", "no-prctl"])
def test_the_run_ends_when_its_last_orphan_does_with_or_without_a_subreaper(env, monkeypatch, subreaper):
    """A run's main process exits while a worker it double-forked (re-parented away from
    it) still works: the run is not over. The shim adopts such orphans (a subreaper) and
    records the end once the last is gone, naming it among the strays; on a host where it
    cannot become one (no prctl: a stub that makes ctypes fail, in the shim's interpreter)
    it finds them by the run marker instead, and ends the same."""
    stub = env.tmp / "stub"
    stub.mkdir()
    if not subreaper:
        (stub / "sitecustomize.py").write_text(
            "import ctypes\n\ndef _no(*a, **k):\n    raise OSError('no libc here')\n\nctypes.CDLL = _no\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(stub), os.environ.get("PYTHONPATH", "")]))
    go = env.tmp / "go"
    script = env.script("orphan.py", textwrap.dedent("""\
        import os, sys, time
        if os.fork() == 0:
            if os.fork() == 0:
                print("orphan", os.getpid(), flush=True)
                while not os.path.exists(sys.argv[1]):
                    time.sleep(0.02)
                os._exit(0)
            os._exit(0)
        os.wait()
    """))
    rec = runner.launch(env.runs, "orphans", [sys.executable, script, str(go)], str(env.tmp), {})
    orphan = int(wait_for(lambda: Path(rec["log"]).read_text().split()[1:2], what="the orphan")[0])
    manifest = json.loads(Path(env.runs, rec["run_id"], "manifest.json").read_text())
    assert manifest["subreaper"] is subreaper
    wait_for(lambda: not alive(rec["pid"], rec["start_ticks"]), what="the main process to end")
    time.sleep(1.5)  # the shim's marker scan runs every second
    (now,) = runner.list_runs(env.runs)
    assert now["state"] == "running" and alive(orphan), now  # its orphan still works
    go.touch()
    done = wait_for(lambda: [r for r in runner.list_runs(env.runs) if r["state"] == "exited"],
                    what="the run to end after its orphan")
    assert done[0]["exit_code"] == 0
    exit_info = json.loads(Path(env.runs, rec["run_id"], "exit.json").read_text())
    assert exit_info["strays_outlived"] is True and orphan in exit_info["strays"], exit_info


def test_run_killed_by_a_signal_records_its_name(env):
    rec = runner.launch(
        env.runs,
        "boom",
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGUSR1)"],
        str(env.tmp),
        {},
    )
    done = wait_for(
        lambda: [r for r in runner.list_runs(env.runs) if r["state"] == "exited"],
        what="run to exit",
    )
    assert done[0]["run_id"] == rec["run_id"]
    assert done[0]["signal"] == "SIGUSR1" and done[0]["exit_code"] is None


def test_env_overrides_marker_and_log_reach_the_run(env):
    rec = runner.launch(
        env.runs,
        "envcheck",
        [
            sys.executable,
            "-c",
            "import os; print(os.environ['FOO'], os.environ['%s'], os.getcwd())" % runner.RUN_ENV,
        ],
        str(env.tmp),
        {"FOO": "bar"},
        patch_state={"v": 2},
        log="custom.log",
    )
    wait_for(lambda: runner.list_runs(env.runs)[0]["state"] == "exited", what="exit")
    assert rec["log"] == str(env.tmp / "custom.log")
    assert Path(rec["log"]).read_text().split() == ["bar", rec["run_id"], str(env.tmp)]
    assert rec["patch_state"] == {"v": 2} and rec["env"] == {"FOO": "bar"}


def test_concurrent_launches_exactly_one_wins(env):
    barrier = env.tmp / "barrier"
    code = textwrap.dedent("""\
        import json, os, sys, time
        sys.path.insert(0, %r)
        from remote.run import runner
        open(sys.argv[1] + ".ready", "w").close()
        while not os.path.exists(%r):
            time.sleep(0.001)
        try:
            rec = runner.launch(%r, "dup", [sys.executable, "-c", %r], %r, {})
            print(json.dumps({"ok": rec["run_id"]}))
        except runner.RunnerError as e:
            print(json.dumps({"error": str(e)}))
    """) % (str(REPO), str(barrier), env.runs, SLEEPER, str(env.tmp))
    procs = [
        env.spawn([sys.executable, "-c", code, str(env.tmp / ("l%d" % i))], stdout=subprocess.PIPE)
        for i in range(2)
    ]
    wait_for(
        lambda: all((env.tmp / ("l%d.ready" % i)).exists() for i in range(2)),
        what="launchers ready",
    )
    barrier.touch()
    results = [json.loads(p.communicate(timeout=30)[0]) for p in procs]
    wins = [r for r in results if "ok" in r]
    errors = [r["error"] for r in results if "error" in r]
    assert len(wins) == 1 and len(errors) == 1, results
    assert "another launch is in progress" in errors[0] or (
        wins[0]["ok"] in errors[0] and "still running" in errors[0]
    ), errors
    assert [r["run_id"] for r in runner.list_runs(env.runs)] == [wins[0]["ok"]]


def test_a_stepped_clock_leaves_a_live_run_running_and_killable(env, monkeypatch):
    """btime in /proc/stat is wall clock minus uptime, so an NTP step moves it: the
    boot id, not btime, says whether a manifest's pids are still this boot's."""
    rec = launch_sleeper(env)
    monkeypatch.setattr(procfs, "_BTIME", [procfs.boot_time() + 90.0])  # the clock jumped 90 s
    (now,) = runner.list_runs(env.runs)
    assert now["state"] == "running"
    report = killer.kill(env.runs, rec["run_id"], graces=(0.2, 0.2), gpu_wait=0)
    assert report["ok"] and not alive(rec["pid"], rec["start_ticks"])
    # another boot: the recorded pids may name strangers now, so the run is lost, not running
    rec2 = launch_sleeper(env, name="other")
    path = Path(env.runs, rec2["run_id"], "manifest.json")
    manifest = json.loads(path.read_text())
    assert manifest["boot_id"] == procfs.boot_id() and procfs.boot_id()
    path.write_text(json.dumps(dict(manifest, boot_id="another-boot")))
    assert {r["run_id"]: r["state"] for r in runner.list_runs(env.runs)}[rec2["run_id"]] == "lost"
    path.write_text(json.dumps(manifest))
    assert killer.kill(env.runs, rec2["run_id"], graces=(0.2, 0.2), gpu_wait=0)["ok"]


def test_relaunch_refused_while_alive_then_allowed_after_kill(env):
    first = launch_sleeper(env)
    with pytest.raises(runner.RunnerError) as err:
        launch_sleeper(env)
    msg = str(err.value)
    assert first["run_id"] in msg and str(first["pid"]) in msg and "\n" not in msg
    other = launch_sleeper(env, name="other")  # a different name is fine
    assert other["state"] == "running"
    assert killer.kill(env.runs, first["run_id"], graces=(0.2, 0.2), gpu_wait=0)["ok"]
    second = launch_sleeper(env)
    assert second["run_id"] != first["run_id"] and second["state"] == "running"
    third = runner.launch(
        env.runs, "svc", [sys.executable, "-c", SLEEPER], str(env.tmp), {}, allow_concurrent=True
    )
    assert third["state"] == "running"


def test_bad_requests_fail_in_one_line(env):
    bad = [
        dict(argv=[], cwd=str(env.tmp), env={}),
        dict(argv="python -c 1", cwd=str(env.tmp), env={}),
        dict(argv=["python", 3], cwd=str(env.tmp), env={}),
        dict(argv=["true"], cwd=str(env.tmp / "nope"), env={}),
        dict(argv=["true"], cwd=str(env.tmp), env={"A": 1}),
        dict(argv=["true"], cwd=str(env.tmp), env={"A=B": "1"}),
        dict(argv=["/nonexistent/program"], cwd=str(env.tmp), env={}),
    ]
    for kw in bad:
        with pytest.raises(runner.RunnerError) as err:
            runner.launch(env.runs, "bad", **kw)
        assert str(err.value) and "\n" not in str(err.value), kw
    with pytest.raises(runner.RunnerError, match="^no run nope$"):
        killer.kill(env.runs, "nope")
    with pytest.raises(runner.RunnerError, match="^no run "):
        killer.kill(env.runs, "../../etc")
    me = "ext-%d-%d" % (os.getpid(), ticks(os.getpid()))
    cmd = " ".join(procfs.read_cmdline(os.getpid()) or [])
    with pytest.raises(runner.RunnerError, match="^refusing to kill %s: " % me):
        killer.kill(env.runs, me, match=cmd)  # the caller (here: pytest) itself
    with pytest.raises(runner.RunnerError, match="^cannot kill %s: no match" % me):
        killer.kill(env.runs, me)
    with pytest.raises(runner.RunnerError, match='^no run "ext-%d"$' % os.getpid()):
        killer.kill(env.runs, "ext-%d" % os.getpid(), match=cmd)  # the old form: no ticks


def test_a_bad_environment_is_refused_before_anything_starts(env):
    """A variable name with "=" or nothing in it, or a NUL in a value, from a config or
    the relaunch form: refused up front naming it, with no run started and no failed
    run left in the list (an empty name would even start one)."""
    for bad, name in (({"A=B": "1"}, "'A=B'"), ({"A": "x\0y"}, "'A'"), ({"": "1"}, "''")):
        with pytest.raises(runner.RunnerError) as err:
            runner.launch(env.runs, "bad", [sys.executable, "-c", SLEEPER], str(env.tmp), bad)
        assert str(err.value) == "bad environment variable name or value: " + name
    assert runner.list_runs(env.runs) == []


def test_run_that_fails_to_start_is_listed_as_failed(env):
    before = time.time()
    with pytest.raises(runner.RunnerError) as err:
        runner.launch(env.runs, "ghost", ["/nonexistent/prog", "--x"], str(env.tmp),
                      {"A": "1"}, patch_state={"p": 1})
    assert "/nonexistent/prog" in str(err.value) and "\n" not in str(err.value)
    (rec,) = runner.list_runs(env.runs)
    run_dir = Path(env.runs) / rec["run_id"]
    assert (run_dir / "error.json").exists() and not (run_dir / "manifest.json").exists()
    assert rec["state"] == "failed" and rec["exit_code"] is None and rec["signal"] is None
    assert rec["pid"] is None and rec["external"] is False and rec["duration"] is None
    assert "/nonexistent/prog" in rec["error"] and "\n" not in rec["error"]
    assert rec["error"] in str(err.value)
    assert rec["name"] == "ghost" and rec["argv"] == ["/nonexistent/prog", "--x"]
    assert rec["env"] == {"A": "1"} and rec["patch_state"] == {"p": 1}
    assert rec["cwd"] == str(env.tmp)
    assert before <= rec["launched_at"] <= rec["ended_at"] <= time.time()
    # It sorts among the others by launch time, and a failed run blocks no relaunch.
    ok = launch_sleeper(env, name="ghost")
    listed = runner.list_runs(env.runs)
    assert [r["run_id"] for r in listed] == [ok["run_id"], rec["run_id"]]
    assert listed[0]["error"] is None and listed[1] == rec


def test_failed_run_from_an_older_shim_uses_the_error_files_time(env):
    """An error.json without "at" (older shims wrote only the error) still lists."""
    run_dir = Path(env.runs) / "20260101-000000-abcd"
    run_dir.mkdir(parents=True)
    (run_dir / "launch.json").write_text(json.dumps({"name": "old", "argv": ["x"]}))
    (run_dir / "error.json").write_text(json.dumps({"error": "boom\nsecond line"}))
    (run_dir / "inprogress").mkdir()  # launch.json only: a launch in progress, not a run
    (Path(env.runs) / "pending").mkdir()
    (Path(env.runs) / "pending" / "launch.json").write_text(json.dumps({"name": "p"}))
    (rec,) = runner.list_runs(env.runs)
    assert rec["state"] == "failed" and rec["error"] == "boom second line"
    assert rec["ended_at"] == (run_dir / "error.json").stat().st_mtime
    assert rec["name"] == "old" and rec["launched_at"] is None


def test_list_runs_skips_junk(env):
    runs = Path(env.runs)
    runs.mkdir()
    (runs / "a-file").write_text("x")
    (runs / "empty").mkdir()
    (runs / "garbage").mkdir()
    (runs / "garbage" / "manifest.json").write_text('{"run_id": "garb')
    (runs / "alist").mkdir()
    (runs / "alist" / "manifest.json").write_text("[1, 2]")
    (runs / "halfexit").mkdir()
    (runs / "halfexit" / "manifest.json").write_text(json.dumps({"pid": "x", "name": "h"}))
    (runs / "halfexit" / "exit.json").write_text('{"exit_')
    # Written this boot, but no pid or start ticks to check: never "running" (which
    # would refuse its relaunch and keep it from prune for ever).
    (runs / "nopid").mkdir()
    (runs / "nopid" / "manifest.json").write_text(json.dumps(
        {"pid": "x", "shim_pid": None, "name": "n", "boot_id": procfs.boot_id(),
         "boot_time": procfs.boot_time()}))
    rec = launch_sleeper(env)
    got = {r["run_id"]: r for r in runner.list_runs(env.runs)}
    assert set(got) == {"halfexit", "nopid", rec["run_id"]}
    assert got["halfexit"]["state"] == "lost" and got["halfexit"]["pid"] is None
    assert got["nopid"]["state"] == "lost"
    assert got[rec["run_id"]]["state"] == "running"
    assert runner.list_runs(str(env.tmp / "missing")) == []


def test_external_runs_groups_trees_and_skips_managed():
    def p(pid, ppid, cmd, run_id=None):
        return {
            "pid": pid,
            "start_ticks": 7 * pid,
            "ppid": ppid,
            "pgid": ppid,
            "sid": 1,
            "start_time": 1000.0 + pid,
            "cmdline": cmd,
            "run_id": run_id,
            "user": "u",
        }

    procs = [
        p(900001, 1, ["bash"]),
        p(900002, 900001, ["python", "extract.py", "--tp", "8"]),
        p(900003, 900002, ["python", "-c", "from multiprocessing.spawn import x", "extract"]),
        p(900004, 900003, ["python", "extract.py", "worker"]),  # nested: parent's record
        p(900005, 1, ["python3", "-m", "extract_mod"]),
        p(900006, 1, ["python", "extract.py"], run_id="20261130-000000-abcd"),  # managed
        p(900007, 900006, ["python", "extract.py", "child"]),  # under a managed run
        p(900008, 1, ["vim", "notes.txt"]),
        dict(p(900009, 1, ["python", "extract.py", "orphan"]), pgid=900005),  # leader's group
    ]
    recs = runner.external_runs("extract", procs)
    assert [r["pid"] for r in recs] == [900005, 900002]  # newest first
    assert [r["run_id"] for r in recs] == ["ext-900005-6300035", "ext-900002-6300014"]
    assert recs[1]["name"] == "extract.py" and recs[0]["name"] == "extract_mod"
    assert all(r["external"] and r["state"] == "running" for r in recs)
    assert recs[1]["argv"] == ["python", "extract.py", "--tp", "8"]
    assert runner.external_runs(None, procs) == [] and runner.external_runs("zzz", procs) == []


def test_kill_external_run_spares_the_shell(env):
    job = env.script(
        "fake_extract.py",
        textwrap.dedent("""\
        import os, subprocess, sys, time
        kid = subprocess.Popen([sys.executable, "-c", "import time\\nwhile 1: time.sleep(0.05)"])
        os.write(1, ("ready main %d" % os.getpid() + "\\n").encode())
        os.write(1, ("ready kid %d" % kid.pid + "\\n").encode())
        while True:
            time.sleep(0.05)
    """),
    )
    (env.tmp / "argv.json").write_text(json.dumps([sys.executable, job]))
    # A "login shell": session and group leader; its job runs in the SAME group.
    shell = env.script(
        "shell.py",
        textwrap.dedent("""\
        import json, subprocess, sys, time
        child = subprocess.Popen(json.load(open("argv.json")), stdout=open("job.log", "w"))
        child.wait()
        while True:
            time.sleep(0.05)
    """),
    )
    sh = env.spawn([sys.executable, shell])
    pids = wait_for(lambda: ready_pids(str(env.tmp / "job.log"), ["main", "kid"]), what="job")
    for pid in pids.values():
        env.adopt(pid)
    assert procfs.read_stat(pids["main"])["pgid"] == sh.pid  # the risky case
    procs = snapshot_procs()
    recs = [r for r in runner.external_runs(job, procs)]
    assert [r["pid"] for r in recs] == [pids["main"]]

    report = killer.kill(env.runs, recs[0]["run_id"], graces=(0.3, 0.3), gpu_wait=0, match=job)
    assert report["ok"] and report["remaining"] == []
    sent = sum((s["sent_to"] for s in report["stages"]), [])
    assert sh.pid not in sent and alive(sh.pid)
    assert not alive(pids["main"]) and not alive(pids["kid"])
    assert not os.path.exists(env.runs)  # external kills write nothing
    # Ended since: nothing to do.
    assert killer.kill(env.runs, recs[0]["run_id"], match=job)["stages"] == []


def test_kill_external_run_takes_its_own_group(env):
    # The matched process leads its own group; a double-forked helper stays in that
    # group but leaves the tree, so only the group finds it.
    job = env.script(
        "own_group_job.py",
        textwrap.dedent("""\
        import os, time
        os.setpgid(0, 0)
        if os.fork() == 0:
            if os.fork() == 0:
                os.write(1, ("ready helper %d" % os.getpid() + "\\n").encode())
                while True:
                    time.sleep(0.05)
            os._exit(0)
        os.wait()
        os.write(1, ("ready main %d" % os.getpid() + "\\n").encode())
        while True:
            time.sleep(0.05)
    """),
    )
    log = open(env.tmp / "own.log", "w")
    main = env.spawn([sys.executable, job], stdout=log, start_new_session=False)
    pids = wait_for(lambda: ready_pids(str(env.tmp / "own.log"), ["main", "helper"]), what="job")
    env.adopt(pids["helper"])
    assert procfs.read_stat(pids["helper"])["ppid"] != main.pid
    (rec,) = runner.external_runs(job, snapshot_procs())
    report = killer.kill(env.runs, rec["run_id"], graces=(0.3, 0.3), gpu_wait=0, match=job)
    assert report["ok"] and not alive(pids["helper"]) and not alive(main.pid)


def test_gpu_report_waits_for_release_and_names_holders(env):
    rec = launch_sleeper(env)
    pid = rec["pid"]
    other = 4242424
    calls = {"n": 0}

    def gpu_query() -> list[dict]:
        # Real NVML is unavailable here: this source reports the run's process while
        # it lives, then keeps it listed for two more readings (drivers free late).
        calls["n"] += 1
        if not alive(pid) and not gone_at[0]:
            gone_at[0] = calls["n"]
        holders = [{"pid": other, "mem": 5}]
        if not gone_at[0] or calls["n"] <= gone_at[0] + 2:
            holders.append({"pid": pid, "mem": 1000})
        return [{"index": 0, "processes": holders}, {"index": 1, "processes": []}]

    gone_at = [0]
    events: list[dict] = []
    report = killer.kill(
        env.runs,
        rec["run_id"],
        graces=(0.3, 0.3),
        gpu_wait=5,
        gpu_query=gpu_query,
        progress=events.append,
    )
    assert report["ok"] and report["gpus_free"] is True
    assert report["gpus"] == [
        {
            "index": 0,
            "run_mem_before": 1000,
            "run_mem": 0,
            "freed": 1000,
            "run_pids": [],
            "other_pids": [{"pid": other, "mem": 5}],
        }
    ]
    assert "waiting_gpu" in [e["stage"] for e in events]
    assert events[0]["gpus"] == [{"index": 0, "run_mem": 1000}]

    rec = launch_sleeper(env, name="stuck")
    stuck = rec["pid"]
    report = killer.kill(
        env.runs,
        rec["run_id"],
        graces=(0.2, 0.2),
        gpu_wait=0.5,
        gpu_query=lambda: [{"index": 3, "processes": [{"pid": stuck, "mem": 7}]}],
    )
    assert report["ok"] is False and report["gpus_free"] is False and report["remaining"] == []
    assert report["gpus"][0]["run_pids"] == [stuck] and report["gpus"][0]["freed"] == 0
    assert report["gpus"][0]["other_pids"] == []  # the run's own holder is no stranger


# Holds GPU memory through the CUDA driver API via ctypes, so no torch is needed.
CUDA_HOLDER = """\
import ctypes, os, time
cuda = ctypes.CDLL("libcuda.so.1")
ctx, ptr = ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuInit(0) == 0 and cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), 1 << 30) == 0
os.write(1, ("ready main %d" % os.getpid() + "\\n").encode())
while True:
    time.sleep(0.05)
"""


def nvidia_smi_gpus() -> list[dict]:
    """GPU 0's compute processes as the agent's gpu source reports them (bytes)."""
    out = subprocess.run(
        [
            "nvidia-smi",
            "-i",
            "0",
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    ).stdout
    procs = []
    for line in out.splitlines():
        pid, mem = (x.strip() for x in line.split(","))
        procs.append({"pid": int(pid), "mem": int(mem) * 1024 * 1024})
    return [{"index": 0, "processes": procs}]


@pytest.mark.gpu
def test_kill_frees_real_gpu_memory(env):
    try:
        import ctypes

        ctypes.CDLL("libcuda.so.1")
        nvidia_smi_gpus()
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip("needs an NVIDIA GPU, libcuda and nvidia-smi: %s" % e)
    rec = runner.launch(env.runs, "gpu", [sys.executable, "-c", CUDA_HOLDER], str(env.tmp), {})
    wait_for(lambda: ready_pids(rec["log"], ["main"]), timeout=60, what="CUDA allocation")
    wait_for(
        lambda: any(p["pid"] == rec["pid"] for p in nvidia_smi_gpus()[0]["processes"]),
        timeout=20,
        what="nvidia-smi to list the run",
    )
    report = killer.kill(
        env.runs, rec["run_id"], graces=(1.0, 1.0), gpu_wait=30, gpu_query=nvidia_smi_gpus
    )
    print(json.dumps(report))
    assert report["ok"] and report["gpus_free"] is True
    (gpu,) = report["gpus"]
    assert gpu["run_mem_before"] >= 1 << 30 and gpu["run_mem"] == 0
    assert gpu["freed"] == gpu["run_mem_before"] and gpu["run_pids"] == []


# A stranger's session whose leader has exited (a nohup job whose login shell quit):
# the session id stays reserved by the member but names no live leader.
ORPHAN_SESSION = """\
import os, sys, time
os.setsid()
if os.fork() == 0:
    os.write(1, ("ready member %d" % os.getpid() + "\\n").encode())
    while True:
        time.sleep(0.05)
os.write(1, ("ready leader %d" % os.getpid() + "\\n").encode())
os._exit(0)
"""


def test_ended_run_never_signals_a_stranger_holding_its_old_session_id(env):
    log = open(env.tmp / "orphan.log", "w")
    leader = env.spawn([sys.executable, "-c", ORPHAN_SESSION], stdout=log, start_new_session=False)
    leader.wait(timeout=10)  # reaped: no zombie keeps its pid
    pids = wait_for(lambda: ready_pids(str(env.tmp / "orphan.log"), ["member", "leader"]),
                    what="orphan session")
    member, sid = pids["member"], pids["leader"]
    env.adopt(member)
    assert sid == leader.pid and procfs.read_stat(sid) is None
    assert procfs.read_stat(member)["sid"] == sid == procfs.read_stat(member)["pgid"]
    # An old run whose shim's pid (so its session and group) is that number now.
    run_dir = Path(env.runs, "20250101-000000-dead")
    run_dir.mkdir(parents=True)
    manifest = {"pid": sid, "start_ticks": 1, "pgid": sid, "sid": sid, "shim_pid": sid,
                "shim_start_ticks": 1, "boot_time": procfs.boot_time(), "argv": ["x"],
                "name": "old"}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    (run_dir / "exit.json").write_text(json.dumps({"exit_code": 0, "ended_at": time.time()}))
    assert runner.list_runs(env.runs)[0]["state"] == "exited"
    report = killer.kill(env.runs, run_dir.name, graces=(0.2, 0.2), gpu_wait=0)
    assert report["stages"] == [] and alive(member, ticks(member))
    # Without exit.json (a run whose shim vanished: "lost") the dead leader still
    # vouches for nothing.
    (run_dir / "exit.json").unlink()
    assert runner.list_runs(env.runs)[0]["state"] == "lost"
    report = killer.kill(env.runs, run_dir.name, graces=(0.2, 0.2), gpu_wait=0)
    assert report["stages"] == []
    assert alive(member) and procfs.read_stat(member)["state"] != "T"


def test_external_kill_checks_start_ticks_and_match(env):
    sleeper = env.spawn(["sleep", "30"])
    wait_for(lambda: alive(sleeper.pid), what="sleeper")
    t = ticks(sleeper.pid)
    for run_id in ("ext-%d" % sleeper.pid, "ext-%d-x" % sleeper.pid, "ext--%d" % sleeper.pid):
        with pytest.raises(runner.RunnerError, match="^no run "):
            killer.kill(env.runs, run_id, graces=(0.2, 0.2), gpu_wait=0, match="sleep")
    good = "ext-%d-%d" % (sleeper.pid, t)
    with pytest.raises(runner.RunnerError, match="does not contain \"extract\""):
        killer.kill(env.runs, good, graces=(0.2, 0.2), gpu_wait=0, match="extract")
    with pytest.raises(runner.RunnerError, match="no match is configured"):
        killer.kill(env.runs, good, graces=(0.2, 0.2), gpu_wait=0)
    # Another start time: that run ended and the pid is someone else's now.
    stale = killer.kill(env.runs, "ext-%d-%d" % (sleeper.pid, t + 1), gpu_wait=0, match="sleep")
    assert stale["stages"] == []
    assert alive(sleeper.pid, t) and procfs.read_stat(sleeper.pid)["state"] != "T"
    # The right pid, start time and match: killed.
    report = killer.kill(env.runs, good, graces=(0.2, 0.2), gpu_wait=0, match="sleep 30")
    assert report["ok"] and sleeper.pid in report["stages"][0]["sent_to"]
    assert sleeper.wait(timeout=5) == -signal.SIGINT


# A run whose helper is started with a scrubbed environment (no run marker) by a child
# that exits at once: the helper lives on in the run's session, outside its tree once
# the shim (its subreaper) is gone.
SCRUBBED_HELPER = """\
import os, subprocess, sys
if os.fork() == 0:
    p = subprocess.Popen(["/usr/bin/env", "-i", sys.executable, "-c",
                          "import time\\nwhile True: time.sleep(0.05)"])
    os.write(1, ("ready helper %d" % p.pid + "\\n").encode())
    os._exit(0)
os.write(1, ("ready main %d" % os.getpid() + "\\n").encode())
import time
while True:
    time.sleep(0.05)
"""


def test_kill_after_the_shim_died_still_takes_the_runs_session(env):
    """The shim killed (the OOM killer's pick, a stray kill -9): the run's orphaned helper
    has no marker and no longer hangs under the run's tree, and the session the run's
    verified main process still holds is the only way to find it."""
    rec = runner.launch(env.runs, "job", [sys.executable, env.script("job.py", SCRUBBED_HELPER)],
                        str(env.tmp), {})
    pids = wait_for(lambda: ready_pids(rec["log"], ["main", "helper"]), what="run ready")
    helper = pids["helper"]
    env.adopt(helper)
    wait_for(lambda: procfs.read_stat(helper)["ppid"] == rec["shim_pid"], what="helper adopted by the shim")
    assert procfs.read_environ_var(helper, runner.RUN_ENV) is None
    os.kill(rec["shim_pid"], signal.SIGKILL)
    wait_for(lambda: not alive(rec["shim_pid"], rec["shim_start_ticks"]), what="the shim's death")
    wait_for(lambda: procfs.read_stat(helper)["ppid"] != rec["shim_pid"], what="helper re-parented")
    assert procfs.read_stat(helper)["sid"] == rec["sid"]

    report = killer.kill(env.runs, rec["run_id"], graces=GRACES, gpu_wait=0)
    assert report["ok"] and report["remaining"] == []
    assert helper in report["stages"][0]["sent_to"]
    assert not alive(helper) and not alive(pids["main"])
    # No shim, so no exit record: the run ended when the kill did, and says so.
    killed = json.loads(Path(env.runs, rec["run_id"], "killed.json").read_text())
    (after,) = runner.list_runs(env.runs)
    assert after["state"] == "killed" and after["ended_at"] == killed["at"]
    assert after["duration"] == round(killed["at"] - after["start_time"], 3)


def test_kill_progress_comes_twice_a_second_and_no_more_often(env):
    """A long grace, then GPU memory freed late: the user sees the kill progress at
    PROGRESS_EVERY in both waits, and the GPU source (an nvidia-smi call on hosts without
    NVML) is read at that pace while the signals' grace runs, not at every poll."""
    rec = runner.launch(env.runs, "deaf", [sys.executable, "-c",
                        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                        "print('ready main 0', flush=True)\nwhile True: time.sleep(0.05)"],
                        str(env.tmp), {})
    wait_for(lambda: ready_pids(rec["log"], ["main"]), what="run ready")
    reads: list[float] = []
    gone: list[float] = []
    hold = 2.0

    def gpu_query() -> list[dict]:
        # No GPU here: a source that counts its readings and lists the run's process
        # until `hold` seconds after it ended (drivers free memory late).
        now = time.monotonic()
        reads.append(now)
        if not gone and not alive(rec["pid"], rec["start_ticks"]):
            gone.append(now)
        held = not gone or now < gone[0] + hold
        return [{"index": 0, "processes": [{"pid": rec["pid"], "mem": 1000}] if held else []}]

    events: list[dict] = []
    grace = 2.0
    report = killer.kill(env.runs, rec["run_id"], graces=(grace, 0.5), gpu_wait=10,
                         gpu_query=gpu_query, progress=events.append)
    assert report["ok"] and report["gpus_free"] is True
    per_s = 1 / killer.PROGRESS_EVERY
    during = [e["elapsed"] for e in events if e["stage"] == "SIGINT"]
    assert 2 <= len(during) <= grace * per_s + 2, during  # some, even on a loaded host; never each poll
    assert len([r for r in reads if r < gone[0]]) <= (grace + 0.5) * per_s + 4, len(reads)
    waiting = [e["elapsed"] for e in events if e["stage"] == "waiting_gpu"]
    assert 2 <= len(waiting) <= hold * per_s + 2, waiting


def test_kill_on_a_kernel_without_pidfds_still_signals_the_run(env, monkeypatch):
    """Hosts on kernels older than 5.3 (RHEL 7's 3.10 on many GPU clusters): Python has
    os.pidfd_open but the call fails with ENOSYS, and the kill falls back to kill(2).
    Stand-in: this kernel has pidfds, so pidfd_open is made to fail the way the old one does."""
    import errno

    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "Function not implemented")

    rec = launch_sleeper(env)
    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    report = killer.kill(env.runs, rec["run_id"], graces=GRACES, gpu_wait=0)
    assert report["ok"] and report["stages"][0]["sent_to"] == [rec["pid"]]
    assert not alive(rec["pid"], rec["start_ticks"])


def test_a_failing_gpu_source_never_stops_a_kill(env):
    """NVML errors out mid-kill (a driver reset, an XID): the run is still killed, and the
    GPU outcome is unknown (N/A), never a false "freed"."""
    rec = launch_sleeper(env)

    def broken() -> list[dict]:
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    events: list[dict] = []
    report = killer.kill(env.runs, rec["run_id"], graces=GRACES, gpu_wait=1, gpu_query=broken,
                         progress=events.append)
    assert report["ok"] and report["remaining"] == [] and not alive(rec["pid"], rec["start_ticks"])
    assert report["gpus_free"] is None and report["gpus"] == []
    assert events[-1]["stage"] == "done"


# A worker that escaped the run's tree and session but kept the marker (started through
# a server, a setsid'd daemon), which starts a helper with a clean environment.
ESCAPED_WORKER = """\
import os, subprocess, sys, time
p = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(0.05)"], env={})
os.write(1, ("ready helper %d" % p.pid + "\\n").encode())
while True:
    time.sleep(0.05)
"""


@pytest.mark.needs_root("kill: another user's process with the run's marker is never killed")
def test_another_users_process_with_the_runs_marker_is_never_killed_for_the_run(env):
    # On a shared host anyone can put a run's id in the environ of their own process;
    # a root agent's kill must not take it for the run's (run ids show in ps).
    rec = launch_sleeper(env)

    def as_nobody() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setgid(65534)
        os.setuid(65534)

    stranger = subprocess.Popen(["sleep", "60"], cwd="/", preexec_fn=as_nobody, start_new_session=True,
                                env={"PATH": "/usr/bin:/bin", runner.RUN_ENV: rec["run_id"]})
    env.adopt(stranger.pid)
    wait_for(lambda: procfs.read_environ_var(stranger.pid, runner.RUN_ENV), what="stranger")
    assert procfs.read_uid(stranger.pid) == 65534
    # nor shown as the run's in the agent's process table (nor counted as its activity)
    rows = {r["pid"]: r for r in proctable.ProcTable(runner.RUN_ENV).sample(
        None, {"sid": {}, "pgid": {}}, {stranger.pid})}
    assert rows[stranger.pid]["run_id"] is None and "run" not in rows[stranger.pid]["why"]
    report = killer.kill(env.runs, rec["run_id"], graces=GRACES, gpu_wait=0)
    assert report["ok"] is True
    assert stranger.pid not in sum((s["sent_to"] for s in report["stages"]), [])
    assert alive(stranger.pid)


def test_kill_takes_the_clean_env_children_of_a_worker_found_by_its_marker(env):
    rec = launch_sleeper(env)
    log = open(env.tmp / "escaped.log", "wb")
    worker = env.spawn([sys.executable, "-c", ESCAPED_WORKER], stdout=log,
                       env=dict(os.environ, **{runner.RUN_ENV: rec["run_id"]}))
    helper = wait_for(lambda: ready_pids(str(env.tmp / "escaped.log"), ["helper"]), what="helper")["helper"]
    env.adopt(helper)
    assert procfs.read_environ_var(helper, runner.RUN_ENV) is None
    assert procfs.read_stat(helper)["sid"] != rec["sid"]

    report = killer.kill(env.runs, rec["run_id"], graces=GRACES, gpu_wait=0)
    assert report["ok"] and helper in report["stages"][0]["sent_to"]
    assert not alive(helper) and worker.poll() is not None
