"""Numbers a host wrote into a file are data too (issue 35.4): a 400-digit step, time,
launch time, memory or loss, a 1e400, a NaN, a 100,000-deep JSON line -- in a timeline,
a run record or a recording -- never reach a user as OverflowError or RecursionError.
The host's timeline writer refuses them at the source; the client drops each such line
(counted: `timeline_bad_lines`) or value (said in a note), through `runs show`, `runs
compare`, `replay` and the dashboard's `t` screen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from remote.run import pace as hostpace
from remote.run import timeline as hosttl
from tests import checkout, replay_fixture
from tests.test_app import until
from tui.protocol import hostjson
from tui.protocol.records import RunRecord
from tui.services import replay, timeline
from tui.services.config import Config, RunConfig
from tui.views.app import make_app
from tui.views.screens.timeline import TimelineScreen

BIG = "9" * 400
DEEP = "[" * 100_000 + "]" * 100_000
# One line per way a number can be absurd; each is dropped and counted.
POISON = [
    '{"t": %s, "e": "phase", "phase": "x"}' % BIG,  # a 400-digit t
    '{"t": 5.0, "c": [0], "h": 1}',  # (a sane line between them stays)
    '{"t": 5.5, "g": [[%s, 1, 1]]}' % BIG,  # memory
    '{"t": 6.0, "s": "step", "m": ["train", %s]}' % BIG,  # a step
    '{"t": 6.5, "l": [0.5, %s]}' % BIG,  # the loss's step
    '{"t": 7.0, "l": %s}' % ("9" * 400 + "0" * 0),  # a loss of 400 digits (beyond any float)
    '{"t": 8.0, "l": 1e400}',  # parses as infinity
    '{"t": 9.0, "l": NaN}',  # not JSON
    DEEP,
]
POISONED_LINES = len(POISON) - 1


def _numbers(obj: Any) -> list[Any]:
    if isinstance(obj, dict):
        return [n for v in obj.values() for n in _numbers(v)]
    if isinstance(obj, list):
        return [n for v in obj for n in _numbers(v)]
    return [obj] if isinstance(obj, (int, float)) and not isinstance(obj, bool) else []


def _sane_file(path: Path) -> None:
    for line in path.read_text().splitlines():
        for n in _numbers(json.loads(line, parse_constant=lambda c: float("nan"))):
            assert n == n and abs(n) <= 1e15, (n, line[:120])


def _poison(run_dir: Path) -> None:
    """A run dir's timeline and record as a buggy or hostile writer leaves them."""
    tl = run_dir / hosttl.TIMELINE_FILE
    lines = tl.read_text().splitlines()
    header = json.loads(lines[0])
    lines[0] = json.dumps(dict(header, launched_at=0)).replace('"launched_at": 0', '"launched_at": ' + BIG)
    tl.write_text("\n".join(lines[:1] + POISON + lines[1:]) + "\n")
    man = run_dir / "manifest.json"
    text = json.dumps(dict(json.loads(man.read_text()), expected_load_s=0))
    man.write_text(text.replace('"expected_load_s": 0', '"expected_load_s": ' + BIG))


# ---------------------------------------------------------------- the host writes none


def test_the_timeline_writer_refuses_absurd_values_at_the_source(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    log.write_text(("step %s loss 0.5\n" % BIG) * 3 + "step 12 loss 0.25\n")
    rec = hosttl.Recorder(str(tmp_path), 1000.0, "r", launched_at=int(BIG))
    p = hostpace.Pace(str(log))
    p.update(1001.0)
    rec.look(1001.0, p.phase, p.step, p.mark, None, None, [], offset=p.offset, loss=p.loss,
             loss_step=p.loss_step, last=True)
    assert p.mark == ["train", 12]  # the 400-digit "step" is no step; the sane one is
    # values handed to it straight: the writer leaves each out
    gpus = [{"index": 0, "mem_used": int(BIG), "util": float("nan"), "power": float("inf"), "processes": []}]
    rec.look(1012.0, "training", "step " + BIG, ["train", int(BIG)], None, gpus, [], offset=int(BIG),
             loss=float("inf") * 0, loss_step=int(BIG), last=True)
    (tmp_path / "attempts.json").write_text('{"restarts": %s, "attempts": [{"n": %s}]}' % (BIG, BIG))
    rec.attempts(1013.0, str(tmp_path), hostpace.load_json)
    rec.close()
    _sane_file(tmp_path / hosttl.TIMELINE_FILE)
    tl = timeline.parse((tmp_path / hosttl.TIMELINE_FILE).read_bytes())
    assert tl.bad_lines == 0 and tl.header["launched_at"] is None
    assert [ln["m"] for ln in tl.lines if "m" in ln] == [["train", 12]]


# ---------------------------------------------------------------- the client drops them


def test_a_timeline_with_absurd_numbers_is_read_with_its_bad_lines_counted(tmp_path: Path) -> None:
    run_dir = replay_fixture.record(tmp_path / "run")
    clean = timeline.parse((run_dir / hosttl.TIMELINE_FILE).read_bytes())
    _poison(run_dir)
    tl = timeline.parse((run_dir / hosttl.TIMELINE_FILE).read_bytes())
    assert tl.bad_lines == POISONED_LINES + 1  # and the header's launch time
    assert tl.header["launched_at"] is None and tl.t0 == clean.t0
    assert len(tl.lines) == len(clean.lines) + 1 and len(tl.raw) == len(tl.lines)
    s = timeline.summary(tl, RunRecord.parse({"expected_load_s": int(BIG), "state": "exited", "exit_code": 0}))
    assert s["timeline_bad_lines"] == POISONED_LINES + 1 and s["expected_load_s"] is None
    assert s["outcome"] == "exit 0" and s["duration_s"] is not None
    json.dumps(s, allow_nan=False)  # what --json prints is JSON


def test_hostjson_bounds_size_depth_and_numbers() -> None:
    for bad in (DEEP, '{"a": NaN}', "[" * 40 + "]" * 40, "x" * 100):
        try:
            hostjson.loads(bad, 64 * 1024)
        except ValueError:
            continue
        raise AssertionError(bad[:40])
    assert hostjson.checked({"a": [int(BIG), 1.5, True, 1e400, -2]}) == ({"a": [None, 1.5, True, None, -2]}, 2)
    assert hostjson.number(int(BIG)) is None and hostjson.number(7) == 7.0


async def test_replay_of_a_recording_with_absurd_numbers(tmp_path: Path) -> None:
    run_dir = replay_fixture.record(tmp_path / "run")
    _poison(run_dir)
    (run_dir / "exit.json").write_text(DEEP)  # too deep: as if there were none
    rec = replay.load(run_dir)
    assert rec.tl.bad_lines == POISONED_LINES + 1 and rec.dropped == 1
    assert rec.record["expected_load_s"] is None and (rec.shift, rec.end) == (0.0, 171.0)  # launch: t0
    snap = await replay.ReplayClient(rec, speed=0, start_s=100.0).call_with_progress("snapshot", None)
    assert snap["runs"][0]["expected_load_s"] is None and snap["gpus"]
    got = _e3("replay", str(run_dir), cwd=tmp_path)  # the warning, then: no terminal here
    assert got.returncode == 2 and "9 line(s) of the timeline and 1 number(s)" in got.stderr, got.stderr
    assert "Traceback" not in got.stderr


async def test_the_t_screen_of_a_replay_with_absurd_numbers(tmp_path: Path) -> None:
    run_dir = replay_fixture.record(tmp_path / "run")
    _poison(run_dir)
    rec = replay.load(run_dir)
    app = make_app(replay.ReplayClient(rec, speed=0, start_s=120.0), Config(run=RunConfig(name="kimi-extract")),
                   f"replay {rec.record['run_id']}", read_only=True)  # type: ignore[arg-type]
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("t")
        await until(pilot, lambda: isinstance(app.screen, TimelineScreen))
        screen = app.screen
        assert isinstance(screen, TimelineScreen) and screen.tl is not None
        assert screen.tl.lines and screen.tl.bad_lines == 0  # the replay serves only the lines it kept
        await pilot.pause()
        assert app.is_running


# ---------------------------------------------------------------- runs show / compare


def _e3(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env=checkout.env(**(env or {})), stdin=subprocess.DEVNULL)


JOB = "import time\nfor i in range(3):\n    print('step %s loss 0.5', flush=True)\n    time.sleep(0.4)\n" % BIG


def test_runs_show_and_compare_of_a_run_with_absurd_numbers(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "eagle3.toml").write_text(
        f'[host]\nruns_dir = "{tmp_path / "runs"}"\npython = "{sys.executable}"\n'
        f'[run]\ncwd = "{tmp_path}"\nname = "nines"\ncommand = {json.dumps([sys.executable, "job.py"])}\n')
    env = {"EAGLE3_TUI_PACE_S": "0.2", "EAGLE3_TUI_TIMELINE_S": "0.3", "EAGLE3_TUI_GPU_SOURCE": "none"}
    launched = _e3("launch", "local", "--json", cwd=tmp_path, env=env)
    assert launched.returncode == 0, launched.stderr
    run_id = json.loads(launched.stdout)["run_id"]
    run_dir = tmp_path / "runs" / run_id
    deadline = time.monotonic() + 40
    while not (run_dir / "exit.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    _sane_file(run_dir / hosttl.TIMELINE_FILE)  # the job's 400-digit step never got in
    shown = _e3("runs", "show", "local", run_id, "--json", cwd=tmp_path, env=env)
    assert shown.returncode == 0 and json.loads(shown.stdout)["timeline_bad_lines"] == 0, shown.stderr

    _poison(run_dir)
    shown = _e3("runs", "show", "local", run_id, "--json", cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stderr
    s = json.loads(shown.stdout)
    assert s["timeline_bad_lines"] == POISONED_LINES + 1 and s["outcome"] == "exit 0"
    assert s["expected_load_s"] is None and "1 number(s) of the run record left out" in s["note"]
    text = _e3("runs", "show", "local", run_id, cwd=tmp_path, env=env)
    assert text.returncode == 0 and f"{POISONED_LINES + 1} unreadable line(s) skipped" in text.stdout, text
    for extra in ([], ["--json"]):
        cmp = _e3("runs", "compare", "local", run_id, run_id, *extra, cwd=tmp_path, env=env)
        assert cmp.returncode == 0 and "Traceback" not in cmp.stderr, cmp.stderr
    assert os.path.exists(run_dir / "exit.json")


# ---------------------------------------------------------------- a run record's pace


def test_a_pace_record_with_absurd_numbers_is_no_pace() -> None:
    """`status --json` judges each live run from the host's pace.json: its times as 400-digit
    ints made float() raise; now they are no reading (N/A), a sane record still judged."""
    from tui.protocol.records import RunRecord
    from tui.state import watch

    now = 1_764_460_000.0
    for key in ("grew_at", "step_at", "idle_since", "intervals"):
        pace = {"source": "shim", "phase": "training", "step": "step 3", "step_at": now - 30,
                "intervals": [10.0, 10.0], "idle_since": now - 20, "grew_at": now - 5}
        pace[key] = [int(BIG)] if key == "intervals" else int(BIG)
        for source in ("shim", "mtime"):
            seen = watch.judge(RunRecord.parse({"run_id": "r", "state": "running", "pace": dict(pace, source=source)}),
                               None, now)
            assert seen is None or seen["condition"] in ("ok", "stalled", "hung"), (key, seen)
    sane = watch.judge(RunRecord.parse({"run_id": "r", "state": "running", "pace": {
        "source": "shim", "step_at": now - 30, "intervals": [10.0]}}), None, now)
    assert sane is not None and sane["last_step_at"] == now - 30


def test_a_run_record_with_absurd_numbers_is_read_with_them_left_out() -> None:
    """The dashboard's record of a run (`RunRecord.parse`): a 400-digit launch time or
    expected load made the progress panel's history line raise OverflowError."""
    from tui.protocol.records import RunRecord
    from tui.state import history

    run = RunRecord.parse({"run_id": "r", "state": "running", "pid": 7, "launched_at": int(BIG),
                         "start_time": 1_764_460_000.0, "expected_load_s": int(BIG), "ended_at": float("inf")})
    assert run.launched_at == 1_764_460_000.0 and run.expected_load_s is None and run.ended_at is None
    assert history.load_line(run, [], "loading", 1_764_460_100.0) is None  # no history: no line
    run = RunRecord.parse({"run_id": "r", "state": "running", "launched_at": 1_764_460_000.0,
                         "expected_load_s": 60, "expected_load_runs": 1})
    assert "ETA" in (history.load_line(run, [], "loading", 1_764_460_010.0) or "")


def test_an_earlier_run_s_absurd_timeline_costs_only_itself_in_the_load_history(tmp_path: Path) -> None:
    """The host's load history (remote/run/history.py) reads earlier runs' timelines: one with a
    400-digit t, or a 100,000-deep line, made it raise and the new run got no history."""
    from remote.run import history

    argv = ["python", "extract.py"]
    for i, phase_line in enumerate(['{"t": %s, "e": "phase", "phase": "loaded"}' % BIG, DEEP,
                                    '{"t": 12.0, "e": "phase", "phase": "loaded"}']):
        d = tmp_path / ("20261201-00000%d-aaaa" % i)
        d.mkdir(mode=0o700)
        (d / "manifest.json").write_text(json.dumps({"argv": argv, "host": "h"}))
        (d / hosttl.TIMELINE_FILE).write_text('{"v": 1, "t0": 100.0, "launched_at": 99.0}\n' + phase_line + "\n")
        os.chmod(d / hosttl.TIMELINE_FILE, 0o600)
    got = history.expected_load(str(tmp_path), "20261202-000000-bbbb", argv, "h")
    assert got == {"expected_load_s": 13.0, "expected_load_runs": ["20261201-000002-aaaa"]}
