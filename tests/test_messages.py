"""The texts a user reads in toasts, the help and `watch`, as the terminal shows them
(a toast's markup applied), one test per message that once came out wrong."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from textual.widgets._toast import Toast

from tests.replay import ReplayClient, snapshot
from tests.test_app import RUN, until
from tui.protocol.records import RunRecord
from tui.services.config import parse_config
from tui.views.app import make_app
from tui.views.screens.help import HelpScreen

NO_COMMAND = parse_config('[run]\nname = "kimi"\nlog = "/srv/x.log"\n')


def toasts(app) -> list[str]:
    """Each toast on screen as it is drawn (title and body)."""
    return [str(t.render()) for t in app.screen.query(Toast)]


async def test_launch_without_a_command_names_the_run_section() -> None:
    app = make_app(ReplayClient([snapshot(1)]), NO_COMMAND, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50), notifications=True) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.press("l")
        await until(pilot, lambda: bool(toasts(app)))
        assert toasts(app) == ["nothing to launch: no [run] command in the config"]  # files: test_newcomer


async def test_relaunch_without_a_run_or_a_command_names_the_run_section() -> None:
    app = make_app(ReplayClient([snapshot(1)]), NO_COMMAND, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50), notifications=True) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await app.screen.run_action("relaunch")  # `r` is offered only with a run to relaunch
        await until(pilot, lambda: bool(toasts(app)))
        assert toasts(app) == ["no run to relaunch and no [run] command in the config"]  # files: test_newcomer


async def test_help_says_how_to_close_it() -> None:
    app = make_app(ReplayClient([snapshot(1)]), NO_COMMAND, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50), notifications=True) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert "esc, q or ? closes this help" in str(app.screen.query_one("#closes").render())
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen))


async def test_a_finished_run_is_one_toast_that_says_how_it_ended() -> None:
    now = time.time()
    running = dict(RUN, launched_at=now - 16)
    done = dict(running, state="exited", exit_code=0, pid=None, ended_at=now)
    cfg = parse_config('[run]\nname = "kimi"\ncommand = ["python", "02_extract.py"]\nlog = "/srv/x.log"\n')
    client = ReplayClient([snapshot(1, runs=[running])])
    app = make_app(client, cfg, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50), notifications=True) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        for seq in (1, 2, 3):  # ended, then the snapshots after (the log's last lines may lag one)
            client.push(snapshot(1, seq=seq, runs=[done], processes=[]))
        await until(pilot, lambda: any("finished" in t for t in toasts(app)))
        await pilot.pause(0.5)
        said = [t for t in toasts(app) if "finished" in t]
        assert said == [f"run {RUN['run_id']} finished\nexit 0 after 16s"], toasts(app)


async def test_the_status_bar_names_the_gpu_source() -> None:
    for n, said in ((2, "GPUs: nvml"), (0, "GPUs: none")):
        app = make_app(ReplayClient([snapshot(n)]), NO_COMMAND, "gpu-box")  # type: ignore[arg-type]
        async with app.run_test(size=(160, 50)) as pilot:
            await until(pilot, lambda: app.dashboard.state.seq == 0)
            await pilot.pause()
            assert said in str(app.screen.query_one("StatusBar").render())


def test_the_runs_table_keeps_name_in_line_with_a_pristine_patch() -> None:
    from tui.cli.report import format_runs
    from tui.services.actions import state_of

    base = {"name": "demo-extract", "state": "exited", "exit_code": 0, "argv": ["python"], "launched_at": 1.0,
            "ended_at": 17.0}
    runs = [dict(base, run_id="20261201-055500-52e6", patch_state={"state": "pristine"}),
            dict(base, run_id="20261201-055400-aaaa", patch_state=None, name="other")]
    lines = format_runs(state_of(parse_config(""), [RunRecord.parse(r) for r in runs])).splitlines()
    assert len(lines) == 3
    at = {line.index(word) for line, word in zip(lines, ("NAME", "demo-extract", "other"))}
    assert len(at) == 1, lines  # NAME, and each run's name, in one column


def test_runs_with_none_says_which_dir_it_read_and_where_the_demos_are(tmp_path) -> None:
    import os
    import subprocess
    import sys

    (tmp_path / "eagle3-demo").mkdir()
    (tmp_path / "eagle3-demo" / "eagle3.toml").write_text("")
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    out = subprocess.run([sys.executable, "-m", "tui.cli", "runs"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "no runs in ~/.cache/eagle3-tui/runs on local (the default runs dir)",
        "another runs dir: [host] runs_dir in eagle3.toml, or --config FILE for another config",
        f"the demo's runs are in {tmp_path}/eagle3-demo/runs: eagle3-tui --config eagle3-demo/eagle3.toml runs",
    ]


@pytest.mark.parametrize("first_empty", [True, False])
async def test_the_runs_header_fits_beside_a_run(first_empty: bool) -> None:
    from tui.views.widgets.tables import RunsTable

    run = dict(RUN, name="demo-extract", patch_state={"state": "pristine"})
    cfg = parse_config('[run]\nname = "demo-extract"\ncommand = ["python"]\n')
    client = ReplayClient([snapshot(0, runs=[] if first_empty else [run])])
    app = make_app(client, cfg, "local")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        client.push(snapshot(0, seq=1, runs=[run]))
        await until(pilot, lambda: app.dashboard.state.seq == 1)
        await pilot.pause(0.3)
        table = app.screen.query_one(RunsTable)
        widths = [(str(c.label), c.get_render_width(table)) for c in table.columns.values()]
        assert table.virtual_size.width <= table.scrollable_content_region.width, widths
        assert widths[-1][0] in ("FAILURE / NOTE", "FAILURE")


async def test_watch_says_once_how_a_finished_run_ended() -> None:
    """`watch` printed "finished: run finished" and then "ended: finished": one line now,
    that says how the run ended."""
    import io

    from tui.cli.watch import follow
    from tui.services.notify import Notifier

    now = time.time()
    running = dict(RUN, launched_at=now - 16)
    done = dict(running, state="exited", exit_code=0, pid=None, ended_at=now)
    client = ReplayClient([snapshot(0, runs=[running]), snapshot(0, seq=1, runs=[done]),
                           snapshot(0, seq=2, runs=[done])],
                    answers={"runs": {"runs": [running]}})
    out = io.StringIO()
    await client.start()
    code = await follow(client, NO_COMMAND, None, False, Notifier(), out)  # type: ignore[arg-type]
    lines = out.getvalue().splitlines()
    assert code == 0
    assert len(lines) == 1 and lines[0].endswith(f"run {RUN['run_id']} finished: exit 0 after 16s"), lines


@pytest.mark.parametrize("command", [False, True])
async def test_an_empty_host_says_what_fills_each_panel_and_how(command: bool) -> None:
    """`connect` to a host with no runs showed "waiting for log · no run" and an empty,
    untitled log pane: each empty panel now says what would fill it and how."""
    from tests.test_hosttext import screen_strips

    cfg = parse_config('[run]\nname = "kimi"\n' + ('command = ["python", "x.py"]\n' if command else ""))  # no [run] log
    app = make_app(ReplayClient([snapshot(0, runs=[])]), cfg, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.pause(0.2)
        screen = "\n".join(screen_strips(app))
        runs_title = "Runs (0) · l: launch" if command else "Runs (0) · none: add a run command to eagle3.toml"
        for said in (runs_title, "No run yet. l launches the [run] command of", "a shows all runs",
                     "Processes (0) · none of a run and none holding GPU memory on this host",
                     "Log · none yet: the selected run's log is tailed here", "no GPU source"):
            assert said in screen, (said, screen)
        assert "waiting for log" not in screen
