"""The host keeps each run's pace (remote/run/pace.py), so a client that never watched the
run can still say it stalled (tui/state/watch.py ``assess`` / ``seed``).

Real processes write real logs; the clock passed to ``Pace.update`` and ``assess`` is
a fake one, so minutes pass in no time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from remote.run import pace as hostpace
from tests import checkout
from tests.agent_driver import AgentProc
from tui.protocol.records import RunRecord
from tui.state.loganalysis import fold
from tui.state.watch import WatchConfig, WatchState, assess, observe

T0 = 1_764_460_000.0
BAR = "Loading safetensors checkpoint shards: {pct:3d}% Completed | {n}/8 [00:{n:02d}<00:10, 1.0it/s]"

# A real writer: each line on its stdin is a command: "bar N", "line TEXT" or "quit".
WRITER = r"""
import sys
log = open(sys.argv[1], "a")
for cmd in sys.stdin:
    cmd = cmd.rstrip("\n")
    if cmd == "quit":
        break
    kind, _, arg = cmd.partition(" ")
    if kind == "bar":
        n = int(arg)
        log.write("Loading safetensors checkpoint shards: %3d%% Completed | %d/8 [00:%02d<00:10, 1.0it/s]\r"
                  % (n * 100 // 8, n, n))
    else:
        log.write(arg + "\n")
    log.flush()
    print("ok", flush=True)
"""


class Writer:
    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen([sys.executable, "-c", WRITER, str(log)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def do(self, cmd: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline() == "ok\n"  # written and flushed

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=10)


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[Writer]:
    w = Writer(tmp_path / "output.log")
    yield w
    w.close()


def _run(pace: dict | None, state: str = "running") -> RunRecord:
    return RunRecord.parse({"run_id": "20261130-015500-ab12", "name": "x", "state": state, "pace": pace})


def test_shard_steps_and_their_intervals_are_recorded(writer: Writer, tmp_path: Path) -> None:
    p = hostpace.Pace(str(writer.log))
    writer.do("line INFO Starting to load model /models/x...")
    assert p.update(T0) and p.phase == "starting" and p.step == "log line 1"
    for i, n in enumerate((1, 2, 3)):
        writer.do(f"bar {n}")
        assert p.update(T0 + 60 + 60 * i)
    assert not p.update(T0 + 500)  # nothing new: nothing changes
    rec = p.record()
    assert rec["phase"] == "loading" and rec["step"] == "shard 3/8"
    assert rec["step_at"] == T0 + 180 and rec["grew_at"] == T0 + 180
    assert rec["intervals"] == [60.0, 60.0]  # steps within the loading phase
    # a new tracker resumes from the saved record (a restarted shim keeps the history)
    hostpace.save(str(tmp_path), rec)
    again = hostpace.Pace(str(writer.log), hostpace.load(str(tmp_path)))
    writer.do("bar 4")
    assert again.update(T0 + 240) and again.record()["intervals"] == [60.0, 60.0, 60.0]


def test_status_of_a_run_nobody_watched_says_stalled(writer: Writer) -> None:
    p = hostpace.Pace(str(writer.log))
    for i, n in enumerate((1, 2, 3, 4)):
        writer.do(f"bar {n}")
        p.update(T0 + 30 * i)
    run = _run(p.record())
    cfg = WatchConfig()  # 5 × the median 30 s, at least 120 s while loading
    ok = assess(run, cfg, T0 + 90 + 119)
    assert ok is not None and ok.condition == "ok" and ok.describe(T0 + 209) is None
    late = T0 + 90 + 14 * 60
    seen = assess(run, cfg, late)
    assert seen is not None and seen.condition == "stalled"
    clock = time.strftime("%H:%M", time.localtime(T0 + 90))
    assert seen.describe(late) == f"no progress for 14m (last: shard 4/8 at {clock})"
    slower = WatchConfig(stall_loading_s=1800.0)  # the same [watch] thresholds as the dashboard
    assert assess(run, slower, late).condition == "ok"  # type: ignore[union-attr]
    assert assess(_run(p.record(), state="exited"), cfg, late) is None
    assert assess(_run(None), cfg, late) is None


def test_an_adopted_run_falls_back_to_its_logs_mtime(tmp_path: Path) -> None:
    log = tmp_path / "nohup.out"
    log.write_text("INFO Starting to load model /models/x...\n")
    pace = hostpace.from_mtime(str(log))
    assert pace is not None and pace["source"] == "mtime" and pace["grew_at"] == log.stat().st_mtime
    run = RunRecord.parse({"run_id": "ext-4242-99", "name": "", "state": "running", "external": True,
                         "log": str(log), "pace": pace})
    grew = pace["grew_at"]
    assert assess(run, WatchConfig(), grew + 899).condition == "ok"  # type: ignore[union-attr]
    seen = assess(run, WatchConfig(), grew + 16 * 60)  # no phase known: the starting floor, 15 min
    assert seen is not None and seen.condition == "stalled"
    clock = time.strftime("%H:%M", time.localtime(grew))
    assert seen.describe(grew + 16 * 60) == f"no progress for 16m (last: log growth at {clock})"
    assert hostpace.from_mtime(str(tmp_path / "gone.log")) is None and hostpace.from_mtime(None) is None


def test_waiting_lines_are_not_progress_but_other_lines_are(writer: Writer) -> None:
    p = hostpace.Pace(str(writer.log))
    writer.do("line INFO Model loading took 3.1 GiB and 40.2 seconds")
    p.update(T0)
    assert p.phase == "loaded"
    at = p.step_at
    writer.do("line INFO No available shared memory broadcast block found in 60 second.")
    p.update(T0 + 60)
    assert p.step_at == at and p.grew_at == T0 + 60  # grew, but no progress
    writer.do("line INFO Memory profiling takes 5.2 seconds")
    p.update(T0 + 90)
    assert p.step_at == T0 + 90 and p.step == "log line 3"


def test_other_loaders_bars_and_the_extractor(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text(BAR.format(pct=100, n=8) + "\n")
    p = hostpace.Pace(str(log))
    p.update(T0)
    assert p.phase == "loaded" and p.step == "shard 8/8"
    with log.open("a") as f:  # a drafter's bar after the load is not the target's progress
        f.write("Loading pt checkpoint shards:  50% Completed | 1/2 [00:01<00:01, 1.0it/s]\n")
    p.update(T0 + 10)  # after the load any line is progress, but the bar is not a shard step
    assert p.phase == "loaded" and p.step == "log line 2" and p.target == "Loading safetensors checkpoint shards"
    with log.open("a") as f:
        f.write("[extract] batch 1/16 | seqs 2/32 | tokens 512/8192 | 900.0 tok/s | elapsed 0:00:01 | eta 0:00:15\n")
        f.write("[extract] batch 2/16 | seqs 4/32 | tokens 1024/8192 | 900.0 tok/s | elapsed 0:00:02 | eta 0:00:14\n")
    p.update(T0 + 20)
    assert p.phase == "extracting" and p.step == "batch 2/16"
    log.write_text("")  # truncated: read again from the start
    p.update(T0 + 30)
    assert p.offset == 0


def test_a_fresh_dashboard_continues_the_hosts_history(writer: Writer) -> None:
    p = hostpace.Pace(str(writer.log))
    for i, n in enumerate((1, 2, 3)):
        writer.do(f"bar {n}")
        p.update(T0 + 60 * i)
    run = _run(p.record())
    a = fold.LogAnalysis()
    done, partial = fold.split_lines(b"", writer.log.read_bytes())
    lines = done + fold.finish_lines(partial)  # the bar's latest redraw
    for no, line in enumerate(lines, 1):
        a = fold.step(a, line, no)
    assert a.phase == "loading" and a.shard is not None and a.shard.done == 3
    now = T0 + 120 + 400  # the client opens 400 s after the last shard: 5 × 60 = 300 s
    ws = observe(WatchState(), run, a, len(lines), (), (), now)
    assert ws.condition == "stalled" and ws.last_step == "shard 3/8" and ws.last_step_t == T0 + 120
    assert [e.kind for e in ws.events] == ["stalled"]
    writer.do("bar 4")
    a = fold.step(a, fold.finish_lines(writer.log.read_bytes())[0], len(lines) + 1)
    ws = observe(ws, run, a, len(lines) + 1, (), (), now + 5)
    assert ws.condition == "ok" and ws.last_step == "shard 4/8"


SLEEPER = "import time; print('loading', flush=True); time.sleep(60)"


@contextlib.contextmanager
def sleeper(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """(log, marker): a process not started by eagle3-tui that wrote one line to its log
    and sleeps, its argv holding the marker (for `[run] match`)."""
    log = tmp_path / "ext.log"
    marker = "pace-marker-" + uuid.uuid4().hex
    with log.open("w") as out:
        child = subprocess.Popen([sys.executable, "-c", SLEEPER, marker], stdout=out)
    try:
        deadline = time.monotonic() + 10
        while log.stat().st_size == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        yield log, marker
    finally:
        child.kill()
        child.wait()


def test_agent_reports_the_pace_of_an_adopted_run(tmp_path: Path) -> None:
    with sleeper(tmp_path) as (log, marker):
        with AgentProc(env={"EAGLE3_TUI_GPU_SOURCE": "none"}) as agent:
            agent.call("configure", {"interval": 3600, "match": marker, "runs_dir": str(tmp_path / "runs")})
            (ext,) = [r for r in agent.call("runs")["runs"] if r["external"]]
            assert ext["pace"] == {"source": "mtime", "log": str(log), "size": log.stat().st_size,
                                   "grew_at": log.stat().st_mtime}
            (snapped,) = agent.call("snapshot")["runs"]
            assert snapped["pace"]["source"] == "mtime"


def test_agent_reports_the_pace_of_a_managed_run_from_its_shim(tmp_path: Path) -> None:
    runs_dir = tmp_path / "runs"
    with sleeper(tmp_path) as (log, marker):
        with AgentProc(env={"EAGLE3_TUI_GPU_SOURCE": "none", "EAGLE3_TUI_PACE_S": "0.2"}) as agent:
            agent.call("configure", {"interval": 3600, "match": marker, "runs_dir": str(runs_dir)})
            (ext,) = [r for r in agent.call("runs")["runs"] if r["external"]]
            assert ext["pace"]["source"] == "mtime" and ext["pace"]["grew_at"] == log.stat().st_mtime
            rec = agent.call("launch", {"name": "paced", "argv": [sys.executable, "-c", SLEEPER],
                                        "cwd": str(tmp_path), "env": {}, "patch_state": None, "log": None})
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                (mine,) = [r for r in agent.call("runs")["runs"] if r["run_id"] == rec["run_id"]]
                if (mine.get("pace") or {}).get("step") == "log line 1":
                    break
                time.sleep(0.2)
            assert mine["pace"]["source"] == "shim" and mine["pace"]["phase"] == "starting", mine
            snap = agent.call("snapshot")
            assert {r["run_id"]: r["pace"]["source"] for r in snap["runs"]} == {
                rec["run_id"]: "shim", ext["run_id"]: "mtime"}
            agent.call("kill", {"run_id": rec["run_id"], "graces": [2, 2], "gpu_wait": 0})
            ended = [r for r in agent.call("runs")["runs"] if r["run_id"] == rec["run_id"]]
            assert "pace" not in ended[0]  # only live runs carry one


JOB = """
import sys, time
for n in range(1, 5):
    print("Loading safetensors checkpoint shards: %3d%% Completed | %d/8 [00:%02d<00:10, 1.0it/s]"
          % (n * 100 // 8, n, n), flush=True)
    time.sleep(0.3)
time.sleep(120)  # stuck at shard 4/8
"""


def _e3(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env=checkout.env(EAGLE3_TUI_PACE_S="0.2", **(env or {})))


def _launch(tmp_path: Path, job: str, name: str, args: list[str], watch: str,
            env: dict[str, str] | None = None) -> str:
    """Write ``job`` and an eagle3.toml with ``[watch]`` ``watch`` into ``tmp_path``, launch
    it through the CLI (the real agent and shim), and return the run id."""
    (tmp_path / "job.py").write_text(job)
    (tmp_path / "eagle3.toml").write_text(
        f'[host]\nruns_dir = "{tmp_path / "runs"}"\npython = "{sys.executable}"\n'
        f'[run]\nname = "{name}"\ncommand = {json.dumps([sys.executable, str(tmp_path / "job.py"), *args])}\n'
        f'cwd = "{tmp_path}"\ngraces = [0.5, 0.5]\ngpu_wait = 0\n'
        f"[watch]\n{watch}")
    launched = _e3("launch", "local", "--json", cwd=tmp_path, env=env)
    assert launched.returncode == 0, launched.stderr
    return str(json.loads(launched.stdout)["run_id"])


def test_status_json_says_a_run_stalled_without_anyone_watching(tmp_path: Path) -> None:
    """A real run launched by one client prints four shard bars, then hangs; a later,
    separate `eagle3-tui status --json` (which never saw the run move) says it stalled,
    from the shim's pace.json and the config's [watch] thresholds (scaled down to seconds)."""
    run_id = _launch(tmp_path, JOB, "paced", [], "factor = 3.0\nstall_loading_s = 2.0\n")
    try:
        deadline = time.monotonic() + 30
        seen: dict = {}
        while time.monotonic() < deadline:
            res = _e3("status", "local", "--json", cwd=tmp_path)
            assert res.returncode == 0, res.stderr
            (rec,) = [r for r in json.loads(res.stdout)["runs"] if r["run_id"] == run_id]
            seen = rec.get("watch") or {}
            if seen.get("condition") == "stalled":
                break
            time.sleep(0.5)
        assert seen.get("condition") == "stalled", rec
        assert seen["source"] == "shim" and seen["last_step"] == "shard 4/8"
        clock = time.strftime("%H:%M", time.localtime(seen["last_step_at"]))
        assert re.fullmatch(rf"no progress for \d+s \(last: shard 4/8 at {clock}\)", seen["message"]), seen
        assert rec["pace"]["phase"] == "loading" and len(rec["pace"]["intervals"]) == 3
        text = _e3("status", "local", cwd=tmp_path)  # the table's note says it too
        assert "STALLED: no progress for" in text.stdout, text.stdout
    finally:
        _e3("kill", "local", run_id, "--yes", cwd=tmp_path)


LOADS_THEN = """
import sys, time
for n in range(1, 9):
    print("Loading safetensors checkpoint shards: %3d%% Completed | %d/8 [00:%02d<00:10, 1.0it/s]"
          % (n * 100 // 8, n, n), flush=True)
print("INFO Model loading took 3.1 GiB and 0.4 seconds", flush=True)
if sys.argv[1] == "sleep":
    time.sleep(120)  # asleep after the load: hung
end = time.time() + 120
while time.time() < end:  # busy after the load: never hung
    pass
"""


def _hang_status(tmp_path: Path, mode: str, wait_s: float, env: dict[str, str] | None = None,
                 then: Callable[[], None] | None = None) -> tuple[str, dict, dict]:
    """Launch a real job that loads, then sleeps or spins, and read `status --json`
    until it says hung or ``wait_s`` passes (``then``, if given, runs at that point and
    the wait starts again); (run_id, its watch, its pace)."""
    run_id = _launch(tmp_path, LOADS_THEN, f"hang-{mode}", [mode], "hang_s = 2.0\n", env)
    seen: dict = {}
    rec: dict = {}
    try:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            res = _e3("status", "local", "--json", cwd=tmp_path, env=env)
            assert res.returncode == 0, res.stderr
            (rec,) = [r for r in json.loads(res.stdout)["runs"] if r["run_id"] == run_id]
            seen = rec.get("watch") or {}
            if seen.get("condition") == "hung":
                assert then is None, ("hung before its time", seen, rec.get("pace"))
                break
            time.sleep(0.5)
            if then is not None and time.monotonic() >= deadline:
                assert seen.get("condition") == "ok", seen
                then()
                then, deadline = None, time.monotonic() + 30
        if mode == "sleep" and seen.get("condition") == "hung":
            text = _e3("status", "local", cwd=tmp_path, env=env)  # the table's note says it too
            assert "HUNG: no CPU" in text.stdout, text.stdout
    finally:
        _e3("kill", "local", run_id, "--yes", cwd=tmp_path, env=env)
    return run_id, seen, rec.get("pace") or {}


# A stand-in for nvidia-smi (no GPU here): one card whose utilisation the test sets in a file.
FAKE_SMI = """#!{python}
import os, sys
arg = sys.argv[1]
caller = open("/proc/%d/cmdline" % os.getppid()).read().replace("\\0", " ")
open({util!r} + ".calls", "a").write(("shim " if "supervise" in caller else "agent ") + arg + "\\n")
util = open({util!r}).read().strip()
if arg.startswith("--query-gpu="):
    print("0, NVIDIA H200, GPU-75dc73da-78d6-3405-d610-419a0819d22a, 2575, 143771, %s, 35, 87.86, 700.00" % util)
elif arg.startswith("--query-compute-apps="):
    pass
else:
    sys.exit("unexpected " + arg)
"""


def _fake_smi(tmp_path: Path, util_pct: int) -> tuple[Path, dict[str, str]]:
    """FAKE_SMI as `nvidia-smi` first on PATH, its card at ``util_pct`` % (the file it
    returns, which the test rewrites); the env that makes the agent use it."""
    bin_dir, util = tmp_path / "bin", tmp_path / "util"
    bin_dir.mkdir()
    util.write_text(str(util_pct))
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable, util=str(util)))
    smi.chmod(0o755)
    return util, {"EAGLE3_TUI_GPU_SOURCE": "nvidia-smi", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_a_working_gpu_keeps_a_sleeping_run_from_hung(tmp_path: Path) -> None:
    """The run's processes sleep after the load, but its GPU (nvidia-smi's stand-in) is
    90 % busy: not hung. At 0 %, hung, and the message names CPU and GPU."""
    util, env = _fake_smi(tmp_path, 90)
    _, seen, pace = _hang_status(tmp_path, "sleep", 6, env=env, then=lambda: util.write_text("0"))
    assert seen.get("condition") == "hung", (seen, pace)
    assert pace["gpu"] == "nvidia-smi"
    assert re.fullmatch(r"no CPU or GPU activity for \d+s \(after the load\)", seen["message"]), seen


def test_status_json_says_a_sleeping_run_hung_after_its_load(tmp_path: Path) -> None:
    """The shim's pace thread sees the run's process group use no CPU after the load;
    a later `status --json` says hung. No GPU here: CPU alone, and the record says so."""
    _, seen, pace = _hang_status(tmp_path, "sleep", 30)
    assert seen.get("condition") == "hung", (seen, pace)
    assert pace["phase"] == "loaded" and pace["gpu"].startswith("none: ") and pace["idle_since"]
    assert re.fullmatch(r"no CPU activity for \d+s \(after the load\)", seen["message"]), seen


def test_a_run_busy_on_its_cpu_costs_no_gpu_query(tmp_path: Path) -> None:
    """The idle check asks the GPUs only when the CPU stood still: a spinning run is awake
    without them, so the shim calls the nvidia-smi stand-in only for its timeline's
    samples (every 10 s from its start: once in a 6 s run of 0.2 s ticks, one more for
    each 10 s a loaded machine stretches it by), never per tick; a sleeping one's are
    asked."""
    _, env = _fake_smi(tmp_path, 0)
    calls = tmp_path / "util.calls"
    (tmp_path / "spin").mkdir()
    (tmp_path / "sleep").mkdir()
    t0 = time.monotonic()
    _, seen, pace = _hang_status(tmp_path / "spin", "spin", 6, env=env)
    lived = time.monotonic() - t0  # at least the shim's life, launch to kill
    assert pace.get("phase") == "loaded" and pace.get("sampled_at") and seen.get("condition") == "ok", (seen, pace)
    shim_calls = [ln for ln in calls.read_text().splitlines() if ln.startswith("shim ")]
    gpu_calls = [ln for ln in shim_calls if ln.startswith("shim --query-gpu=")]
    # (the agent's own snapshots still read the GPUs)
    assert len(gpu_calls) <= 1 + int(lived // 10), (lived, shim_calls)
    _, seen, pace = _hang_status(tmp_path / "sleep", "sleep", 20, env=env)
    assert seen.get("condition") == "hung" and pace["gpu"] == "nvidia-smi", (seen, pace)
    assert any(ln.startswith("shim --query-gpu=") for ln in calls.read_text().splitlines())


def test_a_busy_run_is_never_hung(tmp_path: Path) -> None:
    _, seen, pace = _hang_status(tmp_path, "spin", 6)
    assert pace.get("phase") == "loaded" and pace.get("sampled_at"), pace  # it was sampled, and busy
    assert seen.get("condition") == "ok" and pace.get("idle_since") is None, (seen, pace)


def test_idle_since_counts_after_the_load_and_gpus_keep_a_run_awake(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text(BAR.format(pct=50, n=4) + "\n")
    p = hostpace.Pace(str(log))
    p.update(T0)
    assert p.phase == "loading"
    assert not p.sample(T0, 100, False, "nvml") and not p.sample(T0 + 5, 100, False, "nvml")  # loading
    with log.open("a") as f:
        f.write(BAR.format(pct=100, n=8) + "\n")
    p.update(T0 + 10)
    p.sample(T0 + 10, 100, False, "nvml")
    assert p.sample(T0 + 15, 100, False, "nvml") and p.idle_since == T0 + 10  # since the last look
    assert not p.sample(T0 + 20, 100, False, "nvml") and p.idle_since == T0 + 10
    assert p.sample(T0 + 25, 100, True, "nvml") and p.idle_since is None  # a GPU works: awake
    p.sample(T0 + 30, 100, False, "nvml")
    assert p.idle_since == T0 + 25
    # asleep is under 1 % of a core (hostpace.QUIET_SHARE): a process holding a CUDA context
    # still gains a tick now and then (the driver's threads), and was never idle on an H100
    assert not p.sample(T0 + 35, 101, False, "nvml") and p.idle_since == T0 + 25  # 0.2 % of a core: asleep
    assert p.sample(T0 + 40, 111, False, "nvml") and p.idle_since is None  # 2 % of a core: awake
    # the GPUs the run holds decide; all of them when it holds none we can see
    gpus = [{"util": 0, "processes": [{"pid": 7}]}, {"util": 90, "processes": [{"pid": 8}]}]
    assert not hostpace.gpu_busy(gpus, [7]) and hostpace.gpu_busy(gpus, [8]) and hostpace.gpu_busy(gpus, [9])
    assert hostpace.gpu_busy([{"util": None, "processes": []}], [])  # unknown is not idle
    rec = dict(p.record(), idle_since=T0, gpu="nvml")
    seen = assess(_run(rec), WatchConfig(hang_s=600.0), T0 + 720)
    assert seen is not None and seen.condition == "hung"
    assert seen.describe(T0 + 720) == "no CPU or GPU activity for 12m (after the load)"
    assert assess(_run(rec), WatchConfig(hang_s=600.0), T0 + 500).condition == "ok"  # type: ignore[union-attr]
    assert assess(_run(rec), WatchConfig(hang_s=0.0), T0 + 720).condition == "ok"  # type: ignore[union-attr]
    loading = dict(rec, phase="loading")  # a run asleep in its load is not hung
    assert assess(_run(loading), WatchConfig(hang_s=600.0), T0 + 720).condition != "hung"  # type: ignore[union-attr]


def test_a_dashboard_meeting_a_run_the_host_saw_idle_shows_it_hung_at_once(tmp_path: Path) -> None:
    # The dashboard opened 12 min into a hang: its first look starts from the host's
    # idle_since (not from now), and the next look that sees a process working clears it.
    from types import SimpleNamespace as NS

    log = tmp_path / "x.log"
    log.write_text(BAR.format(pct=100, n=8) + "\nINFO Model loading took 14.9 GiB and 6.1 seconds\n")
    p = hostpace.Pace(str(log))
    p.update(T0)
    p.sample(T0, 100, False, "none: no GPU source")
    p.sample(T0 + 5, 100, False, "none: no GPU source")
    assert p.phase == "loaded" and p.idle_since == T0
    run = _run(p.record())
    asleep = [NS(pid=7, run_id=run.run_id, state="S")]
    cfg = WatchConfig(hang_s=600.0)
    ws = observe(WatchState(config=cfg), run, None, 0, asleep, (), T0 + 720)
    assert ws.condition == "hung" and [e.kind for e in ws.events] == ["hung"], ws
    assert ws.describe(T0 + 720).startswith("processes asleep, no progress for ")  # no GPUs here
    working = [NS(pid=7, run_id=run.run_id, state="R")]
    ws = observe(ws, run, None, 0, working, (), T0 + 725)
    assert ws.condition == "ok" and ws.idle_since is None
    # a host that saw it working: a fresh look has nothing to start from
    fresh = observe(WatchState(config=cfg), _run(dict(p.record(), idle_since=None)), None, 0, asleep, (), T0 + 720)
    assert fresh.condition == "ok" and fresh.idle_since == T0 + 720
