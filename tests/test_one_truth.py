"""One truth (issue 13): the screen and the CLI agree, and every key answers.

Real agent (LocalLink, or the `eagle3-tui` command as a subprocess) and real
processes wherever they run here; the help / notification tests use the replay
client of tests/replay.py because they only need a screen to press keys on.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from tests import checkout
from tests.replay import ReplayClient, snapshot
from tests.test_app import CFG, RUN, serve_file
from tui import protocol as p
from tui.protocol.records import RunRecord
from tui.services import actions as services
from tui.services.config import load_config, parse_config
from tui.state import view
from tui.state.events import ConfigRead, CursorMoved
from tui.state.loganalysis import fold
from tui.state.model import AppState
from tui.state.reducer import apply
from tui.transport import AgentClient, LocalLink
from tui.views.app import EagleApp, make_app
from tui.views.screens.help import HelpScreen
from tui.views.screens.logviewer import LogViewerScreen
from tui.views.widgets.logtail import LogPane
from tui.views.widgets.tables import RunsTable

ROOT = Path(__file__).resolve().parent.parent
FIXLOGS = Path(__file__).parent / "fixtures" / "logs"


async def until(pilot: Any, cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


def notices(app: EagleApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


def e3(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tui.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=60,
        env=checkout.env(**(env or {})),
    )


# ---- the CLI and the screen select the same run -------------------------------------

STATES = ["running", "exited", "killed", "lost", "failed"]


@st.composite
def hosts(draw: Any) -> tuple[list[dict[str, Any]], str | None]:
    """Runs on a host (this config's, another config's, adopted ones) and, maybe, a
    run the user put the cursor on."""
    n = draw(st.integers(0, 7))
    runs = []
    for i in range(n):
        external = draw(st.booleans())
        state = "running" if external else draw(st.sampled_from(STATES))
        runs.append({
            "run_id": f"ext-{100 + i}-{i}" if external else f"20261130-0100{i:02d}-{i:04x}",
            "name": draw(st.sampled_from(["job", "other"])) if not external else "python",
            "state": state, "external": external, "argv": ["python", "x.py"], "pid": 100 + i,
            "launched_at": None if external else draw(st.floats(1e9, 2e9)),
            "start_time": draw(st.floats(1e9, 2e9)), "exit_code": 0 if state == "exited" else None,
        })
    cursor = draw(st.sampled_from([None] + [r["run_id"] for r in runs]))
    return runs, cursor


@settings(max_examples=300, deadline=None)
@given(hosts())
def test_cli_and_screen_select_the_same_run(host: tuple[list[dict[str, Any]], str | None]) -> None:
    runs, cursor = host
    cfg = parse_config('[run]\nname = "job"\ncommand = ["python", "x.py"]\nmatch = "x.py"\n')
    # The screen: its state as the app builds it (config, snapshot, the user's cursor),
    # and the rule its keys act on (the dashboard's selected run is `view.select_run`).
    state = apply(AppState(), ConfigRead(services.settings_of(cfg)), 0.0)
    state = apply(state, snapshot(0, runs=runs), 0.0)
    state = apply(state, CursorMoved(cursor), 0.0)
    screen = view.select_run(state)
    # The CLI: `kill` / `relaunch` with no RUN_ID, or with the id the user sees under the cursor.
    # the host's clock, as the screen's
    cli = services.choose_run(cfg, [RunRecord.parse(r) for r in runs], cursor, now=state.snapshot_time)
    assert (screen.run_id if screen else None) == (cli.run_id if cli else None)
    if cursor is None and screen is not None:
        mine = [r for r in runs if r["name"] == "job" and not r["external"]]
        assert screen.name == "job" or (screen.external and not mine)  # never another config's run
        if any(r.name == "job" and not r.external and r.state == "running"
               and not view.from_the_future(r, state.snapshot_time) for r in state.runs):
            assert screen.alive  # a live run of this config before any ended one (none from the future)
    if cursor is None and screen is None:  # none of this config, or only runs from the future
        pool = [r for r in state.runs if r.name == "job" and not r.external] or [
            r for r in state.runs if r.external]
        assert all(view.from_the_future(r, state.snapshot_time) for r in pool)


# ---- an adopted run shows its own log ------------------------------------------------

ADOPTED = "import sys, time\nprint('adopted line one', flush=True)\nwhile True: time.sleep(0.2)\n"


def adopted_config(tmp_path: Path, marker: str) -> Any:
    other = tmp_path / "other-run.log"
    other.write_text("OTHER RUN LINE\n")
    return parse_config(
        f'[host]\nruns_dir = "{tmp_path / "runs"}"\ninterval = 0.5\n'
        f'[run]\nname = "job"\ncommand = ["true"]\nmatch = "{marker}"\nlog = "{other}"\n'
    )


async def test_adopted_run_shows_the_file_its_stdout_goes_to(tmp_path: Path) -> None:
    marker = f"adopted-{os.getpid()}-file"
    out = tmp_path / "by-hand.log"
    with open(out, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-c", ADOPTED, marker], stdout=f, stderr=subprocess.STDOUT)
    try:
        cfg = adopted_config(tmp_path, marker)
        app = make_app(services.new_client("local", cfg), cfg, "local")
        async with app.run_test(size=(160, 50)) as pilot:
            await until(pilot, lambda: any(r.external for r in app.dashboard.state.runs), 15, "the adopted run")
            await until(pilot, lambda: "adopted line one" in app.dashboard.state.log.lines, 15, "its log")
            assert app.dashboard.state.log.path == str(out)
            run = app.dashboard.state.runs[0]
            assert run.log == str(out) and view.select_run(app.dashboard.state) == run
            assert "OTHER RUN LINE" not in app.dashboard.state.log.lines
    finally:
        proc.kill()
        proc.wait()


async def test_adopted_run_writing_to_a_pipe_says_so(tmp_path: Path) -> None:
    marker = f"adopted-{os.getpid()}-pipe"
    proc = subprocess.Popen([sys.executable, "-c", ADOPTED, marker], stdout=subprocess.PIPE)
    try:
        cfg = adopted_config(tmp_path, marker)
        app = make_app(services.new_client("local", cfg), cfg, "local")
        async with app.run_test(size=(160, 50)) as pilot:
            await until(pilot, lambda: any(r.external for r in app.dashboard.state.runs), 15, "the adopted run")
            await until(pilot, lambda: app.dashboard.state.log.note is not None, 10, "the note")
            await pilot.pause(1.0)  # a snapshot or two later: still no other run's log
            assert app.dashboard.state.log.path is None and "OTHER RUN LINE" not in app.dashboard.state.log.lines
            assert "no log file: stdout is a pipe/terminal" in app.dashboard.state.log.note
            assert "no log file: stdout is a pipe/terminal" in str(app.query_one(LogPane).query_one("#note").render())
            rid = app.dashboard.state.runs[0].run_id
            assert "no log file" in str(app.query_one(RunsTable).get_row(rid)[-1])
    finally:
        proc.kill()
        proc.wait()


# ---- follow the host; config re-read on l ---------------------------------------------

JOB = "import sys, time\nprint('job', sys.argv[1], flush=True)\ntime.sleep(float(sys.argv[2]))\n"


def write_config(tmp_path: Path, tag: str, seconds: float = 30) -> Path:
    (tmp_path / "job.py").write_text(JOB)
    path = tmp_path / "eagle3.toml"
    path.write_text(
        f'[host]\nruns_dir = "{tmp_path / "runs"}"\npython = "{sys.executable}"\ninterval = 0.5\n'
        f'[run]\nname = "truth"\ncommand = ["{sys.executable}", "{tmp_path / "job.py"}", "{tag}", "{seconds}"]\n'
        f'cwd = "{tmp_path}"\ngraces = [0.5, 0.5]\ngpu_wait = 0\n'
    )
    return path


async def test_run_launched_from_the_cli_appears_and_is_followed(tmp_path: Path) -> None:
    path = write_config(tmp_path, "first", seconds=0.1)
    first = json.loads(e3("launch", "local", "--json", cwd=tmp_path).stdout)
    write_config(tmp_path, "second", seconds=30)
    cfg = load_config(path)
    app = make_app(services.new_client("local", cfg), cfg, "local")
    second: dict[str, Any] = {}
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            await until(pilot, lambda: any(r.run_id == first["run_id"] and not r.alive
                                           for r in app.dashboard.state.runs),
                        15, "the first run, ended")
            await until(pilot, lambda: app.dashboard.state.log.path == first["log"], 10, "the first run's log")
            res = await asyncio.to_thread(e3, "launch", "local", "--json", cwd=tmp_path)
            assert res.returncode == 0, res.stderr
            second = json.loads(res.stdout)
            t0 = time.monotonic()
            await until(pilot, lambda: app.query_one(RunsTable).row_count == 2, 5, "the new row")
            appeared = time.monotonic() - t0
            assert appeared <= cfg.host.interval + 1.0, appeared  # one interval (+ scheduling on a loaded box)
            await until(pilot, lambda: second["run_id"] in str(app.query_one("#progress").render()), 5,
                        "the progress panel on the new run")
            await until(pilot, lambda: app.dashboard.state.log.path == second["log"], 5, "the new run's log")
            await until(pilot, lambda: "job second" in app.dashboard.state.log.lines, 10, "its lines")
    finally:
        if second:
            e3("kill", "local", second["run_id"], "--yes", cwd=tmp_path)


async def test_l_launches_the_config_as_edited_and_refuses_a_broken_one(tmp_path: Path) -> None:
    path = write_config(tmp_path, "before")
    cfg = load_config(path)
    app = make_app(services.new_client("local", cfg), cfg, "local")
    launched: list[str] = []
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            await until(pilot, lambda: app.dashboard.state.seq >= 1, 15, "a snapshot")
            write_config(tmp_path, "after")  # edited while the dashboard is open
            await pilot.press("l")
            await until(pilot, lambda: bool(app.dashboard.state.runs), 15, "the launch")
            run = app.dashboard.state.runs[0]
            launched.append(run.run_id)
            assert "after" in run.argv and "before" not in run.argv, run.argv
            await until(pilot, lambda: app.dashboard.state.busy is None, 10, "the launch to settle")
            e3("kill", "local", run.run_id, "--yes", cwd=tmp_path)
            await until(pilot, lambda: not app.dashboard.state.runs[0].alive, 15, "the kill")
            path.write_text(path.read_text() + "[run]\nbogus = 1\n")  # broken now
            await pilot.press("l")
            await until(pilot, lambda: "config:" in str(app.query_one("#banner").render()), 5, "the banner")
            text = str(app.query_one("#banner").render())
            assert "\n" not in text.strip() and "nothing launches" in text
            await pilot.pause(1.5)
            assert len(app.dashboard.state.runs) == 1  # nothing launched
            write_config(tmp_path, "fixed")
            await pilot.press("l")
            await until(pilot, lambda: len(app.dashboard.state.runs) == 2, 15, "the launch after the fix")
            launched.append(app.dashboard.state.runs[0].run_id)
            assert "fixed" in app.dashboard.state.runs[0].argv
            assert "config:" not in str(app.query_one("#banner").render())
    finally:
        for rid in launched:
            e3("kill", "local", rid, "--yes", cwd=tmp_path)


# ---- every key answers ---------------------------------------------------------------


async def test_question_mark_shows_the_help_of_the_screen_it_is_pressed_on() -> None:
    client = ReplayClient([snapshot(1, runs=[RUN])],
                          answers={"read_range": serve_file(FIXLOGS / "vllm016_tp8_sample_tokens.log")})
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.log.path is not None, 5, "the log")
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), 5, "the dashboard's help")
        assert "Kill run" in [desc for _, desc, _ in app.screen.contents[0]]  # (key, what, CLI twin)
        await pilot.press("escape")
        await pilot.press("L")
        await until(pilot, lambda: isinstance(app.screen, LogViewerScreen), 5, "the log viewer")
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), 5, "the log viewer's help")
        keys = [desc for _, desc, _ in app.screen.contents[0]]
        assert "Search" in keys and "Root cause" in keys and "Kill run" not in keys


async def test_agent_messages_and_action_results_are_notifications() -> None:
    report = {"run_id": RUN["run_id"], "ok": True, "stages": [], "remaining": [], "gpus": [], "gpus_free": True,
              "elapsed": 1.0}
    client = ReplayClient([snapshot(1, runs=[RUN])], answers={"kill": report})
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0, 5, "a snapshot")
        client.push(p.AgentError("runs: permission denied on /srv/runs"))
        await until(pilot, lambda: any("permission denied on /srv/runs" in n for n in notices(app)), 5, "the message")
        await pilot.press("k")
        await pilot.pause(0.2)
        await pilot.press("y")
        await until(pilot, lambda: any(f"run {RUN['run_id']} killed, GPUs free" in n for n in notices(app)), 5,
                    "the kill's result")


def broken_signatures(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "xdg"
    (home / "eagle3-tui").mkdir(parents=True)
    (home / "eagle3-tui" / "signatures.toml").write_text("[[signature]\nid = \n")
    return {"XDG_CONFIG_HOME": str(home)}


async def test_signature_file_errors_at_startup_and_in_inspect(tmp_path: Path, monkeypatch: Any) -> None:
    env = broken_signatures(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", env["XDG_CONFIG_HOME"])
    fold.default_signatures.cache_clear()
    try:
        app = make_app(ReplayClient([snapshot(0)]), CFG, "gpu-box")  # type: ignore[arg-type]
        async with app.run_test(size=(160, 50)) as pilot:
            await until(pilot, lambda: any("signatures.toml" in n for n in notices(app)), 5, "the warning")
    finally:
        monkeypatch.undo()
        fold.default_signatures.cache_clear()
    res = e3("inspect", str(FIXLOGS / "vllm016_tp8_sample_tokens.log"), cwd=tmp_path, env=env)
    assert res.returncode == 0
    assert "warning" in res.stderr and "signatures.toml" in res.stderr and res.stderr.count("\n") == 1


def test_cli_kill_of_an_ended_run_says_already_exited(tmp_path: Path) -> None:
    write_config(tmp_path, "quick", seconds=0)
    run = json.loads(e3("launch", "local", "--json", cwd=tmp_path).stdout)
    deadline = time.monotonic() + 15
    while json.loads(e3("runs", "local", "--json", cwd=tmp_path).stdout)["runs"][0]["state"] != "exited":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    res = e3("kill", "local", cwd=tmp_path)
    assert res.returncode == 0 and f"run {run['run_id']} already exited (0)" in res.stdout, res
    listing = e3("runs", "local", cwd=tmp_path).stdout
    assert next(line for line in listing.splitlines() if run["run_id"] in line).startswith("*")


def test_reducer_liveness_thresholds() -> None:
    cfg = replace(CFG, host=replace(CFG.host, interval=1.0))
    state = apply(AppState(), ConfigRead(services.settings_of(cfg)), 0.0)
    state = apply(state, p.Hello(1, "0.1.0", "0" * 64, "h", "3.10", 1, 0.0, None, None), 100.0)
    assert view.link_text(state, 102.9) == ("connected", "ok")
    assert view.link_text(state, 103.2) == ("stale for 3s", "warn")


# ---- the agent keeps each action's outcome by id -------------------------------------


async def test_agent_records_outcomes_by_action_id(client: Any, tmp_path: Path) -> None:
    from tui.transport import AgentRequestError

    await client.configure(1.0, runs_dir=str(tmp_path / "runs"))
    rec = await client.request("launch", name="o", argv=[sys.executable, "-c", "pass"], cwd=str(tmp_path),
                               env={}, action="launch-1")
    bad = None
    try:
        await client.request("launch", name="o", argv=["x"], cwd=str(tmp_path / "nowhere"), env={}, action="bad-1")
    except AgentRequestError as exc:
        bad = str(exc)
    got = (await client.request("outcomes", ids=["launch-1", "bad-1", "never-sent"]))["outcomes"]
    assert got["launch-1"]["state"] == "done" and got["launch-1"]["ok"] is True
    assert got["launch-1"]["result"]["run_id"] == rec["run_id"] and got["launch-1"]["op"] == "launch"
    assert got["bad-1"]["ok"] is False and got["bad-1"]["error"] in (bad or "")
    assert got["never-sent"] is None
    # Kept on disk, so the next agent (after a reconnect) answers the same.
    other = AgentClient(LocalLink(runs_dir=str(tmp_path / "runs")))
    await other.start()
    try:
        again = (await other.request("outcomes", ids=["launch-1"]))["outcomes"]
        assert again["launch-1"]["result"]["run_id"] == rec["run_id"]
        # A record left "running" by an agent that died reads as failed, not running forever.
        folder = tmp_path / "runs" / ".actions"
        (folder / "orphan.json").write_text(json.dumps({"state": "running", "op": "kill", "agent_pid": 2**22 + 7}))
        orphan = (await other.request("outcomes", ids=["orphan"]))["outcomes"]["orphan"]
        assert orphan["state"] == "done" and orphan["ok"] is False and "ended before" in orphan["error"]
    finally:
        await other.close()
    try:
        await client.request("kill", run_id="x", action="../escape")
        raise AssertionError("a path in an action id was accepted")
    except AgentRequestError as exc:
        assert "action must be" in str(exc)
