"""`eagle3-tui replay`: a recorded run dir played through the real dashboard.

The recording is made by the host's own Recorder on a fake clock with its log written
in step (tests/replay_fixture.py); the last test replays a run the real shim recorded."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests import checkout, replay_fixture
from tests.test_app import until
from tests.test_tmux import screen, wait_screen
from tui.services import replay
from tui.services.config import Config, RunConfig
from tui.views.app import make_app
from tui.views.screens.timeline import TimelineScreen
from tui.views.widgets.gpus import GpuPanel
from tui.views.widgets.logtail import TailLog
from tui.views.widgets.progress import RunProgress


def _app(run_dir: Path, speed: float, start_s: float) -> Any:
    rec = replay.load(run_dir)
    cfg = Config(run=RunConfig(name="kimi-extract"))
    return make_app(replay.ReplayClient(rec, speed=speed, start_s=start_s), cfg,  # type: ignore[arg-type]
                    f"replay {rec.record['run_id']}", read_only=True)


def _e3(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, env=checkout.env(), stdin=subprocess.DEVNULL)


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "timeline.jsonl").write_bytes(b"\x1b[31mnot json\n\x00\xff\n")
    norec = replay_fixture.record(tmp_path / "norec")
    (norec / "manifest.json").unlink()
    cases = {
        str(tmp_path / "nope"): "no run dir",
        str(tmp_path / "empty"): "has no readable timeline.jsonl",
        str(tmp_path / "junk"): "is not a run's timeline (0 readable line(s), no header)",
        str(norec): "holds no run record (manifest.json or launch.json)",
        "20990101-000000-beef": "no run dir",  # a run id: looked up in the config's runs dir
    }
    (tmp_path / "eagle3.toml").write_text(f'[host]\nruns_dir = "{tmp_path / "runs"}"\n')
    for arg, said in cases.items():
        got = _e3("replay", arg, cwd=tmp_path)
        assert got.returncode == 2 and said in got.stderr, (arg, got)
        assert got.stderr.count("\n") == 1 and "\x1b" not in got.stderr, got.stderr
    replay_fixture.record(tmp_path / "runs" / replay_fixture.RUN_ID)  # a run id of the local runs dir
    found = _e3("replay", replay_fixture.RUN_ID, cwd=tmp_path)
    assert found.returncode == 2 and "replay needs a terminal" in found.stderr, found  # found, then no screen
    speed = _e3("replay", str(norec), "--speed", "0", cwd=tmp_path)
    assert speed.returncode == 2 and "--speed" in speed.stderr


def test_the_log_plays_in_step_with_the_timeline(tmp_path: Path) -> None:
    rec = replay.load(replay_fixture.record(tmp_path / "run"))
    assert rec.shift == 1.0 and rec.end == 172.0 and rec.record["expected_load_s"] == 50.0
    text = rec.log[:rec.log_at(41.0)].decode()  # 41 s after the launch: 7 shards in, whole lines
    assert text.endswith("\n") and "| 7/16 [" in text and "| 8/16 [" not in text
    assert rec.log_at(0.0) == 0 and rec.log_at(500.0) == len(rec.log)


async def test_a_replay_mid_run_shows_the_progress_and_the_host_text_as_text(tmp_path: Path) -> None:
    app = _app(replay_fixture.record(tmp_path / "run"), speed=0, start_s=41.0)  # held 41 s in
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: "7/16" in str(app.query_one(RunProgress).render()))
        panel = str(app.query_one(RunProgress).render())
        assert "Phase loading" in panel and "slower than last time (50s)" in panel, panel
        assert "GPUs (8, replay)" in str(app.screen.query_one("#gpu-box").border_title)
        await until(pilot, lambda: len(app.query_one(TailLog).lines) >= 10)
        rows = list(app.query_one(TailLog).lines)  # what the pane holds to draw
        assert "[red]not markup[/red] host text stays text" in rows[1], rows[:3]
        assert not any("\x1b" in r or "\x07" in r for r in rows), rows[:3]
        feed = app.screen.feed
        await pilot.press("t")  # the timeline so far, from the replay's read_range
        await until(pilot, lambda: isinstance(app.screen, TimelineScreen))
        assert app.screen.tl is not None and app.screen.tl.lines[-1]["t"] <= 40.0
        assert [ln["phase"] for ln in app.screen.tl.lines if ln.get("e") == "phase"] == ["starting", "loading"]
        assert await feed.client.request("configure") == {}
        with pytest.raises(Exception, match="a replay changes nothing"):
            await feed.client.request("kill", run_id="x")


async def test_a_replay_plays_to_the_end(tmp_path: Path) -> None:
    app = _app(replay_fixture.record(tmp_path / "run"), speed=20, start_s=120.0)
    async with app.run_test(size=(120, 40)) as pilot:
        def gpus() -> str:
            return str(app.query_one(GpuPanel).render())

        await until(pilot, lambda: gpus().count("70.0/N/A GiB") == 4)  # extracting on the 4 cards it holds
        assert gpus().count("GiB") == 4, gpus()
        await until(pilot, lambda: app.dashboard.state.runs and app.dashboard.state.runs[0].state == "exited",
                    timeout=10)
        run = app.dashboard.state.runs[0]
        assert run.exit_code == 0 and run.ended_at is not None
        await until(pilot, lambda: "finished" in str(app.query_one(RunProgress).render()), timeout=10)
        assert "batch 40/40" in str(app.query_one(RunProgress).render())
        await until(pilot, lambda: gpus().count("1.0/N/A GiB") == 8)  # it let go: the host's 8 again


def test_replay_snapshot_80x24_mid_run(snap_compare: Any, tmp_path: Path) -> None:
    app = _app(replay_fixture.record(tmp_path / "run"), speed=0, start_s=41.0)

    async def settle(pilot: Any) -> None:
        await until(pilot, lambda: any("7/16" in str(w.render()) for w in app.query(RunProgress)))
        await until(pilot, lambda: len(app.query_one(TailLog).lines) >= 10)
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=(80, 24), run_before=settle)


def test_replay_in_tmux_at_80x24(tmp_path: Path) -> None:
    if shutil.which("tmux") is None:
        pytest.fail("tmux not found: apt-get install tmux", pytrace=False)
    run_dir = replay_fixture.record(tmp_path / "run")
    session, exit_file = f"e3r-{uuid.uuid4().hex[:8]}", tmp_path / "exit"
    cmd = (f"env -u COLUMNS -u LINES PYTHONPATH={shlex.quote(checkout.pythonpath())} "
           f"{shlex.quote(sys.executable)} -m tui.cli replay {shlex.quote(str(run_dir))} --from 40; "
           f"echo $? > {shlex.quote(str(exit_file))}")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", cmd], check=True)
    try:
        wait_screen(session, ["Phase loading", "/16", "slower than last time (50s)", "GPUs (8, replay)",
                              "READ-ONLY"], timeout=30)
        (tmp_path / "screen.txt").write_text(screen(session))
        title = subprocess.run(["tmux", "display", "-p", "-t", session, "#{pane_title}"],
                               capture_output=True, text=True).stdout
        assert "pwned" not in title  # the log's escape never reached the terminal
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        deadline = time.monotonic() + 15
        while not exit_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert exit_file.read_text().strip() == "0"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def test_a_run_the_shim_recorded_replays(tmp_path: Path) -> None:
    """A real run (the timeline test's job, launched through the real agent and shim)
    replayed from a copy of its run dir: the load, the batches and the end come back."""
    job = Path(__file__).parent / "jobs" / "timeline_job.py"
    env = {"EAGLE3_TUI_PACE_S": "0.2", "EAGLE3_TUI_TIMELINE_S": "0.5", "EAGLE3_TUI_GPU_SOURCE": "none"}
    (tmp_path / "eagle3.toml").write_text(
        f'[host]\nruns_dir = "{tmp_path / "runs"}"\npython = "{sys.executable}"\n'
        f'[run]\nname = "kimi-extract"\ncommand = '
        f'{json.dumps([sys.executable, str(job), str(tmp_path / "held"), str(tmp_path / "times.json")])}\n'
        f'cwd = "{tmp_path}"\n')
    got = subprocess.run([sys.executable, "-m", "tui.cli", "launch", "local", "--json"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, env=checkout.env(**env))
    assert got.returncode == 0, got.stderr
    run_id = json.loads(got.stdout)["run_id"]
    deadline = time.monotonic() + 40
    while not (tmp_path / "runs" / run_id / "exit.json").exists() and time.monotonic() < deadline:
        time.sleep(0.3)
    copy = tmp_path / "copied"
    shutil.copytree(tmp_path / "runs" / run_id, copy)  # as a user copies it off the host
    rec = replay.load(copy)
    assert len(rec.offsets) > 4 and rec.exit is not None and rec.exit["code"] == 0
    shard8 = rec.log.index(b"| 8/8 [")
    loaded = next(ln["t"] + rec.shift for ln in rec.tl.lines if ln.get("phase") == "loaded")
    assert rec.log_at(loaded + 0.5) > shard8  # by the time pace saw the load end, the bar was full
    assert rec.log_at(loaded - 3.0) < shard8
