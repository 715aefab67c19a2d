"""Stall and hang detection, notifications, and `eagle3-tui watch` (issue 15).

Real parts: each run is a real process (tests/jobs/watch_job.py) launched through the
real agent (remote/agent/main.py over LocalLink), writing a real log that the real parser
folds; its process states come from the agent's /proc sampling. Only the clock is
fake where minutes must pass: a dilated clock (``Clock``) turns each real second into
100 so a 2-minute stall floor is crossed in about a second.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.test_pace import _fake_smi
from tui.protocol.records import GpuReading, ProcReading, RunRecord
from tui.services import actions as services
from tui.services.config import load_config
from tui.services.notify import Notifier, terminal_alert
from tui.state import view
from tui.state.loganalysis import fold
from tui.state.model import AppState, LogTail
from tui.state.reducer import apply
from tui.state.watch import WatchConfig, WatchState, assess, observe

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "jobs" / "watch_job.py"


class Clock:
    """A fake clock that runs ``rate`` times faster than the real one."""

    def __init__(self, rate: float = 100.0, start: float = 1_764_460_000.0) -> None:
        self.rate, self.start, self.m0 = rate, start, time.monotonic()

    def __call__(self) -> float:
        return self.start + (time.monotonic() - self.m0) * self.rate


def write_config(tmp: Path, mode: str, extra: str = "", step: float = 0.2) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = tmp / "eagle3.toml"
    cfg.write_text(
        f'[host]\nruns_dir = "{tmp / "runs"}"\npython = "{sys.executable}"\ninterval = 0.2\n'
        f'[run]\nname = "watched"\ncommand = {json.dumps([sys.executable, str(JOB), mode, str(step)])}\n'
        f'cwd = "{tmp}"\ngraces = [0.5, 0.5]\ngpu_wait = 0\n{extra}'
    )
    return cfg


async def watch_run(tmp: Path, mode: str, watch_cfg: WatchConfig, until: Any, timeout: float = 30.0,
                    clock: Clock | None = None) -> tuple[AppState, dict[str, Any]]:
    """Launch ``mode`` through the real agent and fold its stream until ``until(state)``."""
    cfg = load_config(write_config(tmp, mode))
    clock = clock or Clock()
    client = services.new_client("local", cfg, reconnect=False)
    await client.start()
    try:
        record = (await services.launch(client, cfg)).record
        state = AppState(watch=WatchState(config=watch_cfg), log=LogTail(path=record["log"], sub="w"))
        await client.subscribe("w", record["log"], 0)
        await services.configure(client, cfg)
        deadline = time.monotonic() + timeout
        events = client.events().__aiter__()
        while not until(state):
            assert time.monotonic() < deadline, f"not reached; events {state.watch.events}"
            state = apply(state, await events.__anext__(), clock())
        if any(r.alive for r in state.runs):
            await services.kill(client, cfg, record["run_id"])
        return state, record
    finally:
        await client.close()


def kinds(state: AppState) -> list[str]:
    return [e.kind for e in state.watch.events]


# --- the rules, one look at a time ----------------------------------------------------------
# ``observe`` with a fake clock (T0 + seconds) on the real parser's analysis of real log
# lines; the run records have the shape the agent sends (remote/run/restart.py's attempts).

T0 = 1_764_460_000.0
RUN_ID = "20261130-015500-ab12"


def record(**kw: Any) -> RunRecord:
    return RunRecord.parse({"run_id": RUN_ID, "name": "watched", "state": "running", **kw})


def looks(ws: WatchState, run: RunRecord, log: list[tuple[float, str]]) -> WatchState:
    """``ws`` after one look per timed line of ``log``, each line new at its time."""
    analysis = fold.LogAnalysis()
    for no, (t, line) in enumerate(log, 1):
        analysis = fold.step(analysis, line, no)
        ws = observe(ws, run, analysis, no, (), (), T0 + t, (line,))
    return ws


STEPS = [(0, "step 5/100 | loss 1.23 | lr 1e-5"), (60, "step 6/100 | loss 1.20 | lr 1e-5")]
LOSSES = [(0, "{'loss': 0.5, 'grad_norm': 1.2, 'learning_rate': 1e-05, 'epoch': 0.1}"),
          (60, "{'loss': 0.4, 'grad_norm': 1.1, 'learning_rate': 1e-05, 'epoch': 0.2}")]
CHATTER = [(300, "NCCL WARN Call to ibv_reg_mr failed, retrying"),
           (700, "NCCL WARN Call to ibv_reg_mr failed, retrying")]


@pytest.mark.parametrize(("log", "last"), [(STEPS, "step 6/100"), (LOSSES, "training log 2")],
                         ids=["steps", "loss-lines-only"])
def test_training_progress_is_its_steps_not_other_lines(log: list[tuple[float, str]], last: str) -> None:
    """While training, progress is the trainer's step (or, for a trainer that prints
    its loss but no step, each metrics line): a log still growing with warnings after
    the last one is a stall (the 600 s training floor), named by the last step."""
    ws = looks(WatchState(), record(), log + CHATTER)
    assert ws.phase == "training" and ws.condition == "stalled", ws
    assert ws.last_step == last and ws.last_step_t == T0 + 60
    (ev,) = ws.events
    assert ev.kind == "stalled" and ev.at == T0 + 700 and ev.detail["last"] == last


def test_watch_of_a_given_run_starts_from_the_hosts_pace() -> None:
    """``eagle3-tui watch --run ID`` starts with a state that names the run: its first
    look still takes the host's pace, so a run stalled before anyone watched is stalled
    at once; a run that had already ended is history, not news."""
    pace = {"source": "shim", "phase": "loading", "step": "shard 3/8", "step_at": T0, "intervals": [60.0, 60.0]}
    ws = observe(WatchState(run_id=RUN_ID), record(pace=pace), None, 0, (), (), T0 + 14 * 60)
    assert ws.condition == "stalled" and ws.last_step == "shard 3/8" and ws.last_step_t == T0
    assert [e.kind for e in ws.events] == ["stalled"]
    ended = record(state="exited", exit_code=1, restarts=1, attempts=[
        {"n": 1, "ended_at": T0, "exit_code": 1, "restarted": True, "why": "restarting: x"}])
    ws = WatchState(run_id=RUN_ID)
    for t in (0, 2, 4):
        ws = observe(ws, ended, None, 0, (), (), T0 + 100 + t)
        assert ws.condition == "ended" and ws.events == ()


def test_a_restarted_attempt_and_giving_up_are_each_told_once() -> None:
    """The host's restart decisions reach the watch as events: "restarting" for an
    attempt it restarted, "gave up" for the one it did not, nothing for an attempt it
    chose not to restart for another reason (the run's end says that)."""
    nccl = {"id": "nccl-timeout", "title": "NCCL collective timed out", "class": "transient", "line": "..."}
    first = {"n": 1, "started_at": T0, "ended_at": T0 + 600, "exit_code": 1, "signal": None, "hung": False,
             "killed": False, "cause": nccl, "progress": {"phase": "extracting", "step": "batch 1203/4000",
                                                          "batch": 1203},
             "restarted": True, "why": "restarting: NCCL collective timed out (nccl-timeout)",
             "restart_at": T0 + 630}
    waiting = record(restarts=1, restart_at=T0 + 630, attempts=[first])
    ws = observe(WatchState(), waiting, None, 0, (), (), T0 + 601)
    ws = observe(ws, waiting, None, 0, (), (), T0 + 605)
    assert [(e.kind, e.message) for e in ws.events] == [
        ("restarting", "attempt 1 failed: NCCL collective timed out at batch 1,203/4,000; restarting")]
    assert ws.events[0].detail["attempt"] == 1 and ws.events[0].detail["restart_at"] == T0 + 630
    second = dict(first, n=2, started_at=T0 + 630, ended_at=T0 + 900, progress=None, restarted=False,
                  restart_at=None, why="gave up: NCCL collective timed out (nccl-timeout) after 1 restart(s) "
                                       "(max_restarts)")
    ended = record(state="exited", exit_code=1, restarts=1, attempts=[first, second])
    for t in (901, 903):
        ws = observe(ws, ended, None, 0, (), (), T0 + t)
    assert [e.kind for e in ws.events] == ["restarting", "gave up", "failed"]
    assert ws.events[1].message == ("attempt 2 failed: NCCL collective timed out; gave up: NCCL collective "
                                    "timed out (nccl-timeout) after 1 restart(s) (max_restarts)")
    # an attempt not restarted for its own reason (a deterministic cause) is no event of its own
    oom = dict(second, n=1, cause={"id": "cuda-oom", "title": "GPU out of memory", "class": "deterministic"},
               why="not restarted: GPU out of memory (cuda-oom) is deterministic")
    ws = WatchState()
    for t in (0, 2):
        ws = observe(ws, record(attempts=[oom]), None, 0, (), (), T0 + t)
    ws = observe(ws, record(state="exited", exit_code=1, attempts=[oom]), None, 0, (), (), T0 + 4)
    ws = observe(ws, record(state="exited", exit_code=1, attempts=[oom]), None, 0, (), (), T0 + 6)
    assert [e.kind for e in ws.events] == ["failed"]



def test_the_next_runs_stall_is_news_after_one_that_ended_stalled() -> None:
    """One watch follows run after run (the dashboard after a relaunch): a run that was
    killed while stalled does not silence the stall of the run launched after it."""
    ws = WatchState()
    for run, t in ((record(), 0), (record(), 1000), (record(state="killed"), 1010), (record(state="killed"), 1012)):
        ws = observe(ws, run, None, 1, (), (), T0 + t)
    nxt = RunRecord.parse({"run_id": "20261130-021000-cd34", "name": "watched", "state": "running"})
    for t in (2000, 3000):
        ws = observe(ws, nxt, None, 1, (), (), T0 + t)
    assert [(e.kind, e.run_id) for e in ws.events] == [
        ("stalled", RUN_ID), ("killed", RUN_ID), ("stalled", nxt.run_id)]
    assert ws.condition == "stalled" and ws.events[-1].at == T0 + 3000


def test_hung_counts_from_when_all_fell_asleep_and_ends_when_it_wakes() -> None:
    """After the load, a run whose process sleeps on an idle GPU is hung ``hang_s`` after
    it fell asleep, not before; waking clears it, and the next sleep is a new episode
    counted from its own start."""
    loaded = fold.step(fold.LogAnalysis(), "INFO Model loading took 3.1 GiB and 40.2 seconds", 1)
    gpu = GpuReading.parse({"index": 0, "util": 0, "processes": [{"pid": 4242}]}, 0)

    def look(ws: WatchState, t: float, state: str) -> WatchState:
        proc = ProcReading.parse({"pid": 4242, "state": state, "run_id": RUN_ID})
        return observe(ws, record(), loaded, 1, (proc,), (gpu,), T0 + t)

    ws = WatchState(config=WatchConfig(hang_s=300.0, stall_loaded_s=0.0))  # no stall rule here
    for t, state, condition in ((0, "S", "ok"), (299, "S", "ok"), (300, "S", "hung"), (400, "R", "ok"),
                                (500, "S", "ok"), (799, "S", "ok"), (800, "S", "hung")):
        ws = look(ws, t, state)
        assert ws.condition == condition, (t, ws)
    assert [(e.kind, e.at - T0, e.detail["idle_s"]) for e in ws.events] == [("hung", 300, 300), ("hung", 800, 300)]
    assert ws.events[0].message.startswith("processes asleep and GPUs idle, no progress for 5m ")


def oom_after_load() -> fold.LogAnalysis:
    """The analysis of a log whose extraction died of a CUDA OOM after the load."""
    lines = ["INFO Model loading took 3.1 GiB and 40.2 seconds", "Traceback (most recent call last):",
             '  File "/app/extract.py", line 12, in <module>',
             "RuntimeError: CUDA out of memory occurred when warming up sampler with 256 dummy requests."]
    analysis = fold.LogAnalysis()
    for no, line in enumerate(lines, 1):
        analysis = fold.step(analysis, line, no)
    return analysis


def test_a_failure_in_the_log_under_a_restart_policy_waits_for_the_hosts_word() -> None:
    """A run with a restart policy (its record lists attempts) whose log shows a root
    cause is not "failed" while it runs: the host may restart it. Its end says failed,
    with the log's cause."""
    analysis = oom_after_load()
    assert analysis.root_cause is not None and analysis.root_cause.id == "cuda-oom"
    attempt = {"n": 1, "started_at": T0}
    ws = WatchState()
    for t in (0, 5):
        ws = observe(ws, record(attempts=[attempt]), analysis, 4, (), (), T0 + t)
    assert ws.events == ()
    ended = record(state="exited", exit_code=1, attempts=[dict(attempt, ended_at=T0 + 6, exit_code=1,
                                                               restarted=False, why="not restarted: x")])
    for t in (7, 9):
        ws = observe(ws, ended, analysis, 4, (), (), T0 + t)
    assert [e.kind for e in ws.events] == ["failed"] and ws.events[0].detail["id"] == "cuda-oom"


def test_a_run_whose_log_shows_its_failure_is_told_failed_once_and_never_stalled() -> None:
    """A run whose log already shows why it failed, while its processes take their time
    to go (a worker's traceback, then minutes of teardown): the failure is the news, told
    at once; the quiet log that follows is no stall to wake anyone for a second time."""
    analysis = oom_after_load()
    ws = WatchState()
    for t in (0, 5, 600, 3600, 4 * 3600):
        ws = observe(ws, record(), analysis, 4, (), (), T0 + t)
    assert [e.kind for e in ws.events] == ["failed"] and ws.events[0].detail["id"] == "cuda-oom", ws.events
    assert ws.condition == "ok", ws


def test_an_extraction_that_goes_on_after_a_logged_failure_is_told_when_it_stalls() -> None:
    """A failure in the log (told once) that the extraction survives: its batches go on,
    so it is watched again, and when they stop for longer than the extracting floor it is
    told stalled, as any extraction (a stuck run is news even after an earlier error)."""
    def batch(i: int) -> str:
        return (f"[extract] batch {i}/10 | seqs {8 * i}/80 | tokens {256 * i}/2560 | 1000.0 tok/s"
                f" | elapsed 0:00:0{i} | eta 0:00:01")

    log = [(0, "INFO Model loading took 3.1 GiB and 40.2 seconds"), (10, batch(1)),
           (20, "Traceback (most recent call last):"), (20, '  File "/app/extract.py", line 12, in <module>'),
           (20, "RuntimeError: CUDA out of memory occurred when warming up sampler with 256 dummy requests."),
           (30, batch(2)), (40, batch(3))]
    analysis, ws = fold.LogAnalysis(), WatchState()
    for no, (t, line) in enumerate(log, 1):
        analysis = fold.step(analysis, line, no)
        ws = observe(ws, record(), analysis, no, (), (), T0 + t, (line,))
    assert ws.phase == "extracting" and [e.kind for e in ws.events] == ["failed"], ws
    for t in (100, 3600):  # nothing new in the log
        ws = observe(ws, record(), analysis, len(log), (), (), T0 + t)
    assert [e.kind for e in ws.events] == ["failed", "stalled"] and ws.condition == "stalled", ws.events
    assert ws.events[1].detail["last"] == "batch 3/10" and ws.events[1].at == T0 + 3600


@pytest.mark.parametrize(("phase", "idle_since", "condition"),
                         [("training", T0, "hung"), ("training", None, "ok"), ("saving", T0, "ok"),
                          ("loading", T0, "ok")])
def test_the_hosts_idle_record_makes_hung_only_after_the_load_and_not_while_saving(
        phase: str, idle_since: float | None, condition: str) -> None:
    """``status --json`` for a run nobody watched: the host's ``idle_since`` says hung
    after the load; a run saving a checkpoint may wait on its disk, and a loading one
    is not past its load, so neither is hung by it (whatever the record still holds)."""
    pace = {"source": "shim", "phase": phase, "step": "x", "step_at": T0 + 600, "intervals": [],
            "idle_since": idle_since, "gpu": "none: no GPU"}
    cfg = WatchConfig(hang_s=600.0, stall_training_s=0.0, stall_saving_s=0.0, stall_loading_s=0.0)
    ws = assess(record(pace=pace), cfg, T0 + 700)
    assert ws is not None and ws.condition == condition, ws
    if condition == "hung":
        assert ws.describe(T0 + 700) == "no CPU activity for 11m (after the load)"


def test_the_hosts_intervals_set_the_stall_limit() -> None:
    """A run nobody watched is judged by the pace the host recorded: shards 5 min apart
    give 5 × 5 min before a stall, not the loading floor of 2 min."""
    pace = {"source": "shim", "phase": "loading", "step": "shard 4/8", "step_at": T0,
            "intervals": [300.0, 300.0, 300.0]}
    ok, late = assess(record(pace=pace), WatchConfig(), T0 + 1499), assess(record(pace=pace), WatchConfig(), T0 + 1501)
    assert ok is not None and ok.condition == "ok" and ok.steps == (T0 - 900, T0 - 600, T0 - 300, T0)
    assert late is not None and late.condition == "stalled" and late.last_step == "shard 4/8"

async def test_a_load_that_stops_is_stalled_after_its_own_pace_and_the_floor(tmp_path: Path) -> None:
    cfg = WatchConfig(factor=5.0, stall_loading_s=120.0)
    state, _ = await watch_run(tmp_path, "stall", cfg, lambda s: s.watch.condition == "stalled")
    ev = next(e for e in state.watch.events if e.kind == "stalled")
    assert ev.detail["last"] == "shard 4/8" and ev.detail["phase"] == "loading"
    # one shard every 0.2 s real = 20 s fake: 5 × 20 s is under the floor, so the floor rules
    assert ev.detail["limit_s"] == pytest.approx(120.0, abs=25.0)
    assert ev.at - ev.detail["last_t"] > ev.detail["limit_s"]
    assert re.match(r"no progress for 2m(\d+s)? \(last: shard 4/8 at ", ev.message), ev.message
    assert "stalled" not in kinds(state)[:-1]  # never while the shards were coming


async def test_the_pace_sets_the_limit_when_it_is_slower_than_the_floor(tmp_path: Path) -> None:
    # one shard per 0.5 s real = 50 s fake: 5 × 50 s = 250 s beats the 120 s floor
    cfg = WatchConfig(factor=5.0, stall_loading_s=120.0)
    clock = Clock()
    tmp = tmp_path
    write_config(tmp, "stall", step=0.5)
    state, _ = await _watch_slow(tmp, cfg, clock)
    ev = next(e for e in state.watch.events if e.kind == "stalled")
    # The pace rules, not the floor: factor × the median interval the client saw (~250 s;
    # under load some lines arrive together and the median shrinks a little).
    assert ev.detail["limit_s"] > 1.25 * cfg.stall_loading_s


async def _watch_slow(tmp: Path, cfg: WatchConfig, clock: Clock) -> tuple[AppState, dict[str, Any]]:
    conf = load_config(tmp / "eagle3.toml")
    client = services.new_client("local", conf, reconnect=False)
    await client.start()
    try:
        record = (await services.launch(client, conf)).record
        state = AppState(watch=WatchState(config=cfg), log=LogTail(path=record["log"], sub="w"))
        await client.subscribe("w", record["log"], 0)
        await services.configure(client, conf)
        events = client.events().__aiter__()
        deadline = time.monotonic() + 40
        while state.watch.condition != "stalled":
            assert time.monotonic() < deadline
            state = apply(state, await events.__anext__(), clock())
        await services.kill(client, conf, record["run_id"])
        return state, record
    finally:
        await client.close()


async def test_asleep_after_the_load_is_hung_and_busy_is_not(tmp_path: Path) -> None:
    cfg = WatchConfig(hang_s=300.0, stall_loaded_s=900.0)
    hung, _ = await watch_run(tmp_path / "a", "hang", cfg, lambda s: s.watch.condition == "hung")
    ev = next(e for e in hung.watch.events if e.kind == "hung")
    assert ev.detail["phase"] == "loaded" and ev.detail["idle_s"] >= 300.0
    # GPUs are named only where the snapshot had GPUs to judge (this machine may have none)
    said = "processes asleep and GPUs idle, " if hung.gpus else "processes asleep, "
    assert ev.message.startswith(said + "no progress for ")
    # the same wait with a process burning CPU after the load: not hung
    clock = Clock()
    busy, _ = await watch_run(tmp_path / "b", "spin", cfg,
                              lambda s: s.watch.phase == "loaded" and clock() - (s.watch.last_step_t or 1e18) > 600,
                              clock=clock)
    assert "hung" not in kinds(busy) and busy.watch.idle_since is None


async def test_asleep_with_its_gpus_working_is_not_hung(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's own judgement counts GPU utilisation: a run whose processes sleep
    after the load while its GPUs work (an nvidia-smi stand-in at 90 %, read by the real
    agent) is never called hung, however long the CPU sleeps."""
    _, env = _fake_smi(tmp_path, 90)
    for k, v in env.items():
        monkeypatch.setenv(k, v)  # the agent LocalLink starts inherits them
    cfg = WatchConfig(hang_s=300.0, stall_loaded_s=900.0)
    clock = Clock()
    state, _ = await watch_run(tmp_path / "w", "hang", cfg,
                               lambda s: s.watch.phase == "loaded" and bool(s.gpus)
                               and clock() - (s.watch.last_step_t or 1e18) > 600, clock=clock)
    assert [g.util for g in state.gpus] == [90]
    assert "hung" not in kinds(state) and state.watch.condition != "hung", state.watch.events


async def test_failure_in_the_log_and_the_end_notify_once(tmp_path: Path) -> None:
    state, record = await watch_run(tmp_path, "fail", WatchConfig(), lambda s: s.watch.condition == "ended")
    assert kinds(state) == ["failed"]  # the exit that follows is the same news
    ev = state.watch.events[0]
    assert ev.detail["cause"] == (
        "RuntimeError: CUDA out of memory occurred when warming up sampler with 256 dummy requests.")
    assert ev.detail["phase"] == "extracting" and ev.detail["id"] == "cuda-oom"


def test_terminal_alert_is_bell_osc9_osc777_and_wrapped_for_tmux() -> None:
    seq = terminal_alert("eagle3-tui gpu-box", "run r1 stalled: no progress\x1b[31m for 14 min;x")
    assert seq == ("\x07\x1b]9;eagle3-tui gpu-box: run r1 stalled: no progress for 14 min;x\x07"
                   "\x1b]777;notify;eagle3-tui gpu-box;run r1 stalled: no progress for 14 min;x\x07")
    wrapped = terminal_alert("t", "b", tmux=True)
    assert wrapped == "\x07\x1bPtmux;\x1b\x1b]9;t: b\x07\x1b\x1b]777;notify;t;b\x07\x1b\\"


async def test_notifier_sends_the_osc_sequence_and_the_hook_json_once(tmp_path: Path) -> None:
    state, record = await watch_run(tmp_path, "hang", WatchConfig(hang_s=300.0),
                                    lambda s: s.watch.condition == "hung")
    out = tmp_path / "hook.json"
    trap = tmp_path / "pwned"
    hook = [sys.executable, "-c", "import sys, pathlib; pathlib.Path(sys.argv[1]).write_text(sys.stdin.read())",
            str(out), f"$(touch {trap})"]  # an argv: the shell-looking word stays a word
    written: list[str] = []
    n = Notifier(hook, host="gpu-box", write=written.append, tmux=False)
    sent = n.send_new(state.watch)
    assert [e.kind for e in sent] == ["hung"]
    assert n.send_new(state.watch) == []  # each event once
    for th in n.hooks:
        th.join(10)
    (osc,) = written
    assert osc.startswith(f"\x07\x1b]9;eagle3-tui gpu-box: {record['run_id']} hung: processes asleep")
    assert f"\x07\x1b]777;notify;eagle3-tui gpu-box;{record['run_id']} hung: " in osc and osc.endswith("\x07")
    payload = json.loads(out.read_text())
    assert payload["host"] == "gpu-box" and payload["event"] == "hung" and payload["run_id"] == record["run_id"]
    assert payload["phase"] == "loaded" and payload["message"].startswith("processes asleep")
    assert not trap.exists()


async def test_a_hook_that_hangs_or_is_missing_does_not_block(tmp_path: Path) -> None:
    from tui.services.notify import run_hook

    t0 = time.monotonic()
    th = run_hook([sys.executable, "-c", "import time; time.sleep(60)"], {"event": "x"}, timeout=0.5)
    assert time.monotonic() - t0 < 0.5  # started in the background
    th.join(10)
    assert not th.is_alive() and time.monotonic() - t0 < 5
    run_hook([str(tmp_path / "no-such-program")], {"event": "x"}).join(5)


# --- `eagle3-tui watch` against real local runs --------------------------------------------


def e3(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def start_watch(cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tui.cli", "watch", *args], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_watch_cli_let_finish_exits_0(tmp_path: Path) -> None:
    # a run of ~12 s, so `watch` (seconds to start on a loaded machine) meets it running:
    # a run that ended before the watch's first look is history, not a "finished" event
    write_config(tmp_path, "finish", step=1.0)
    assert e3("launch", cwd=tmp_path).returncode == 0
    r = e3("watch", "--json", cwd=tmp_path)
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.returncode == 0, r.stderr
    assert [x["event"] for x in lines] == ["finished", "ended"]
    assert lines[-1]["outcome"] == "finished" and lines[-1]["exit_code"] == 0
    assert "watching run" in r.stderr


def test_watch_cli_killed_mid_way_exits_1(tmp_path: Path) -> None:
    write_config(tmp_path, "slow")
    launched = e3("launch", "--json", cwd=tmp_path)
    run_id = json.loads(launched.stdout)["run_id"]
    w = start_watch(tmp_path)
    time.sleep(3.0)  # loading and the first batches, watched
    assert w.poll() is None
    k = e3("kill", run_id, "--yes", cwd=tmp_path)
    assert k.returncode == 0, k.stderr
    out, err = w.communicate(timeout=30)
    assert w.returncode == 1, err
    # said once: the event line tells how it ended, no second "ended: killed" line
    took = r"(\d+(\.\d)?s|\d+m(\d+s)?)"  # tui/state/format.py duration: "3.6s", "42s", "1m5s"
    assert re.search(rf"run {run_id} killed: (by SIG\w+|exit -?\d+) after {took}$", out.splitlines()[-1]), out
    assert f"run {run_id} ended" not in out and out.count(" killed") == 1, out


def test_watch_cli_failure_stall_and_config_thresholds(tmp_path: Path) -> None:
    write_config(tmp_path / "f", "fail", step=1.0)  # ~10 s: the watch meets it running
    assert e3("launch", cwd=tmp_path / "f").returncode == 0
    r = e3("watch", cwd=tmp_path / "f")
    assert r.returncode == 1
    assert "failed: died while extracting" in r.stdout and "GPU out of memory" in r.stdout
    assert r.stdout.splitlines()[-1].endswith("ended: failed (exit 1): GPU out of memory")
    # a stall, with the floor from eagle3.toml's [watch]
    write_config(tmp_path / "s", "stall", extra="[watch]\nstall_loading_s = 2\nfactor = 1\n")
    launched = e3("launch", "--json", cwd=tmp_path / "s")
    run_id = json.loads(launched.stdout)["run_id"]
    w = start_watch(tmp_path / "s")
    line = w.stdout.readline() if w.stdout else ""
    assert f"run {run_id} stalled: no progress for " in line and "(last: shard 4/8 at " in line
    assert e3("kill", run_id, "--yes", cwd=tmp_path / "s").returncode == 0
    out, _ = w.communicate(timeout=30)
    assert w.returncode == 1 and f" run {run_id} killed: " in out.splitlines()[-1], out  # said once


def test_watch_cli_usage_errors(tmp_path: Path) -> None:
    write_config(tmp_path, "finish")
    r = e3("watch", "--run", "20000101-000000-abcd", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.strip() == "eagle3-tui: no run 20000101-000000-abcd on this host"
    (tmp_path / "eagle3.toml").write_text("[watch]\nhang_s = 'soon'\n")
    r = e3("watch", cwd=tmp_path)
    assert r.returncode == 2 and "watch.hang_s: must be a number >= 0, not str" in r.stderr


async def test_dashboard_shows_a_stalled_run_in_banner_runs_table_and_phase(tmp_path: Path) -> None:
    from tui.views.app import make_app
    from tui.views.widgets.progress import RunProgress

    cfg = load_config(write_config(tmp_path, "stall", extra="[watch]\nstall_loading_s = 2\nfactor = 1\n"))
    app = make_app(services.new_client("local", cfg, reconnect=False), cfg, "local", launch=True)
    sent: list[Any] = []
    app.dashboard.notifier.hooks = []
    original = app.dashboard.notifier.send_new

    def spy(ws: Any) -> list[Any]:
        out = original(ws)
        sent.extend(out)
        return out

    app.dashboard.notifier.send_new = spy  # type: ignore[method-assign]
    async with app.run_test(size=(160, 50)) as pilot:
        deadline = time.monotonic() + 30
        while "stalled" not in str(app.query_one("#banner").render()):
            assert time.monotonic() < deadline, str(app.query_one("#banner").render())
            await pilot.pause(0.1)
        banner = str(app.query_one("#banner").render())
        assert "no progress for " in banner and "(last: shard 4/8 at " in banner
        assert view.phase(app.dashboard.state, view.select_run(app.dashboard.state), time.time()) == "stalled"
        notes = view.run_notes(app.dashboard.state)
        assert any(v.startswith("STALLED: no progress for ") for v in notes.values())
        progress = str(app.query_one(RunProgress).render())
        # the bar's last ETA means nothing once it stopped: none is shown
        assert "stalled" in progress and "4/8" in progress and "ETA N/A" in progress, progress
        assert [e.kind for e in sent] == ["stalled"]
        run = view.select_run(app.dashboard.state)
        assert run is not None
        await services.kill(app.dashboard.client, cfg, run.run_id)
