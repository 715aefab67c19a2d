"""History that predicts: the host's earlier loads of the same command set a new run's
expected load (remote/run/history.py, kept in the manifest by the shim); `runs show` prints
it and the dashboard's progress panel turns it into an ETA, then a comparison.

Real processes: the CLI launches a stand-in job (tests/jobs/history_job.py) twice
through the real agent and shim; the dashboard of the second run talks to the real
agent over the local link."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from remote.run import history
from remote.run import timeline as hosttl
from tests import checkout
from tests.test_app import until
from tui.protocol.records import RunRecord
from tui.services.config import parse_config
from tui.state import history as seen
from tui.state.loganalysis.lineshapes import ShardProgress
from tui.transport import AgentClient, LocalLink
from tui.views.app import make_app
from tui.views.widgets.progress import RunProgress

JOB = Path(__file__).parent / "jobs" / "history_job.py"


def _e3(*args: str, cwd: Path, **env: str) -> Any:
    import subprocess

    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, env=checkout.env(**env))


def _wait_exit(run_dir: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not (run_dir / "exit.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (run_dir / "exit.json").exists(), f"{run_dir.name} did not end"


async def test_a_second_launch_shows_the_history_eta(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    go, runs = tmp_path / "go", tmp_path / "runs"
    monkeypatch.setenv("EAGLE3_TUI_PACE_S", "0.2")
    monkeypatch.setenv("EAGLE3_TUI_TIMELINE_S", "0.5")
    monkeypatch.setenv("EAGLE3_TUI_GPU_SOURCE", "none")
    toml = (f'[host]\nruns_dir = "{runs}"\npython = "{sys.executable}"\n'
            f'[run]\nname = "hist"\ncommand = {json.dumps([sys.executable, str(JOB), str(go)])}\n'
            f'cwd = "{tmp_path}"\n')
    (tmp_path / "eagle3.toml").write_text(toml + 'env = { LOAD_S = "12" }\n')
    go.write_text("")
    first = _e3("launch", "local", "--json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    run_a = json.loads(first.stdout)["run_id"]
    assert json.loads(first.stdout)["expected_load_s"] is None  # nothing on this host before it
    _wait_exit(runs / run_a)
    shown_a = json.loads(_e3("runs", "show", "local", run_a, "--json", cwd=tmp_path).stdout)
    took = shown_a["load_s"]
    assert 12.0 < took < 20.0, shown_a

    # the same command again, held before its first shard until GO exists
    go.unlink()
    (tmp_path / "eagle3.toml").write_text(toml + 'env = { LOAD_S = "0" }\n')
    second = _e3("launch", "local", "--json", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    run_b = json.loads(second.stdout)["run_id"]
    try:
        live = _e3("runs", "show", "local", run_b, "--json", cwd=tmp_path)
        s = json.loads(live.stdout)
        assert s["state"] == "running" and s["expected_load_s"] == took and s["expected_load_runs"] == [run_a], s
        text = _e3("runs", "show", "local", run_b, cwd=tmp_path).stdout
        (tmp_path / "show.txt").write_text(text)
        assert f"expected     {took:.1f} s (from last run of this command here)" in text, text

        cfg = parse_config((tmp_path / "eagle3.toml").read_text())
        app = make_app(AgentClient(LocalLink(runs_dir=str(runs))), cfg, "local")
        async with app.run_test(size=(100, 30)) as pilot:
            def panel() -> str:
                return str(app.query_one(RunProgress).render())

            await until(pilot, lambda: "from last run" in panel(), timeout=15)
            shown = panel()
            assert re.search(r"load  ETA ~[\d.]+s from last run", shown), shown
            assert f"(its load took {seen.duration(took)})" in shown, shown
            go.write_text("")  # the load gets under way, far faster than the first one
            await until(pilot, lambda: "than last time" in panel(), timeout=15)
            shown = panel()
            assert re.search(rf"faster than last time \({re.escape(seen.duration(took))}\): ~[\d.]+s", shown), shown
            await until(pilot, lambda: "than last time" not in panel(), timeout=20)  # loaded: the line goes
    finally:
        go.write_text("")
        _wait_exit(runs / run_b)
    third = json.loads(_e3("runs", "show", "local", run_b, "--json", cwd=tmp_path).stdout)
    assert third["expected_load_s"] == took and third["load_s"] < took, third


# ---------------------------------------------------------------- which loads count


def _run(runs: Path, run_id: str, argv: list[str], host: str, phases: list[tuple[float, str]],
         launched_early: float = 1.0) -> None:
    """A run dir as the shim leaves it: a manifest and a timeline with these phases."""
    d = runs / run_id
    d.mkdir(parents=True, mode=0o700)
    (d / "manifest.json").write_text(json.dumps({"argv": argv, "host": host}))
    rec = hosttl.Recorder(str(d), 1000.0, run_id, launched_at=1000.0 - launched_early)
    for t, ph in phases:
        if ph == "restart":
            rec.event(1000.0 + t, "attempts", restarts=1, n=2)
        else:
            rec.look(1000.0 + t, ph, None, None, None, None, [])
    rec.close()


def test_the_median_of_the_last_three_ended_loads_of_the_same_argv_on_this_host(tmp_path: Path) -> None:
    runs, argv = tmp_path / "runs", ["python", "extract.py", "--model", "/m/kimi"]
    loaded = [(0.5, "starting"), (1.0, "loading")]
    _run(runs, "20261201-010000-0001", argv, "box", [*loaded, (499.0, "loaded")])  # 4th back: not used
    _run(runs, "20261201-020000-0002", argv, "box", [*loaded, (99.0, "loaded"), (120.0, "extracting")])
    _run(runs, "20261201-030000-0003", argv, "box", [*loaded, (50.0, "failed")])  # the load failed
    _run(runs, "20261201-040000-0004", argv, "box", [*loaded, (129.0, "extracting")])
    _run(runs, "20261201-050000-0005", argv, "box", [*loaded, (30.0, "restart"), (200.0, "loaded")])
    _run(runs, "20261201-060000-0006", argv, "box", loaded)  # killed while loading: never ended
    _run(runs, "20261201-070000-0007", argv, "other-node", [*loaded, (5.0, "loaded")])  # a shared runs dir
    _run(runs, "20261201-080000-0008", [*argv[:-1], "/m/other"], "box", [*loaded, (5.0, "loaded")])
    _run(runs, "20261201-090000-0009", argv, "box", [*loaded, (89.0, "loaded")])
    _run(runs, "20261201-100000-000a", argv, "box", [*loaded, (1.0, "loaded")])  # newer than the run: no
    got = history.expected_load(str(runs), "20261201-093000-beef", argv, "box")
    # loads of 90, 130 and 100 s (launch 1 s before the shim's t0): the median
    assert got == {"expected_load_s": 100.0, "expected_load_runs": [
        "20261201-090000-0009", "20261201-040000-0004", "20261201-020000-0002"]}
    assert history.expected_load(str(runs), "20261201-093000-beef", ["other"], "box") == {
        "expected_load_s": None, "expected_load_runs": []}
    assert history.expected_load(str(tmp_path / "none"), "x", argv, "box")["expected_load_s"] is None
    (runs / "20261201-090000-0009" / hosttl.TIMELINE_FILE).write_bytes(b"junk\n{\"t\":")  # no header
    # 130, 100, 500
    assert history.expected_load(str(runs), "20261201-093000-beef", argv, "box")["expected_load_s"] == 130.0


# ---------------------------------------------------------------- the panel's words


def _live(expected: float | None, runs: int = 1) -> RunRecord:
    return RunRecord.parse({"run_id": "r", "state": "running", "launched_at": 1000.0, "argv": ["x"],
                          "expected_load_s": expected, "expected_load_runs": ["a"] * runs})


def _bar(done: int, remaining: float | None, rate: float | None = None) -> ShardProgress:
    return ShardProgress(desc="Loading safetensors checkpoint shards", worker=None, done=done, total=64,
                         percent=100 * done / 64, elapsed_s=None,
                         remaining_s=remaining, rate_it_s=rate)


def test_the_history_line_before_and_during_the_load() -> None:
    assert seen.load_line(_live(None), [], "loading", 1100.0) is None  # no history: nothing
    assert seen.load_line(_live(1180.0), [], "loading", 1000.0 + 60) == \
        "ETA ~18m from last run (its load took 19m)"
    assert seen.load_line(_live(1180.0, 3), [_bar(0, None)], None, 1060.0) == \
        "ETA ~18m from the last 3 runs (its load took 19m)"
    assert seen.load_line(_live(600.0), [], "starting", 1700.0) == \
        "slower than last time (10m): 11m so far"
    assert seen.load_line(_live(1180.0), [_bar(10, 1300.0)], "loading", 1100.0) == \
        "slower than last time (19m): ~23m"
    assert seen.load_line(_live(1180.0), [_bar(32, None, rate=0.1)], "loading", 1600.0) == \
        "faster than last time (19m): ~15m"
    assert seen.load_line(_live(1180.0), [_bar(32, 600.0)], "loading", 1600.0) == \
        "as last time (19m): ~20m"
    assert seen.load_line(_live(1180.0), [_bar(64, 0.0)], "extracting", 2000.0) is None  # loaded
    ended = RunRecord.parse({"run_id": "r", "state": "exited", "launched_at": 1000.0, "expected_load_s": 9.0})
    assert seen.load_line(ended, [], "loading", 1001.0) is None


def test_the_host_and_runs_show_round_a_load_alike(tmp_path: Path) -> None:
    # Launched at .94, the process at .99, loaded at 13.9: the load is 13.95 s either way
    # the sum is made, and the two sums round to 14.0 and 13.9 (seen: the ETA said 14.0
    # where `runs show` said the last load took 13.9).
    from tui.services import timeline as clienttl

    data = (b'{"v":1,"t0":1796189113.99,"run":"20261202-052513-0187","launched_at":1796189113.94}\n'
            b'{"t":0.2,"e":"phase","phase":"starting","o":0}\n'
            b'{"t":13.9,"e":"phase","phase":"loaded","o":664}\n')
    path = tmp_path / hosttl.TIMELINE_FILE
    path.write_bytes(data)
    path.chmod(0o600)
    shown = clienttl.summary(clienttl.parse(data))["load_s"]
    assert history.load_seconds(str(path)) == shown == 13.9
