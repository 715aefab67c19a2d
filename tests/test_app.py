"""Pilot tests of the dashboard, fed recorded-shape agent messages through a replay client."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any, Callable

import pytest

from tests.replay import FIXTURES, ReplayClient, resnap, snapshot
from tui import protocol as p
from tui.protocol.stream import LinkStatus
from tui.services.config import parse_config
from tui.services.hostfeed import FIRST_TAIL
from tui.state.events import ANALYSE_SLICE, AnalyseLog, LedgerRead
from tui.state.model import LOG_LINES
from tui.views.app import EagleApp, make_app
from tui.views.screens.confirm import ConfirmScreen
from tui.views.screens.help import HelpScreen
from tui.views.widgets.gpus import GpuPanel
from tui.views.widgets.logtail import BUSY_S, TailLog
from tui.views.widgets.progress import RunProgress
from tui.views.widgets.tables import ProcessTable, RunsTable

CFG = parse_config('[run]\nname = "kimi"\ncommand = ["python", "02_extract.py"]\nlog = "/srv/x.log"\n')
RUN = {"run_id": "20261130-015500-ab12", "name": "kimi", "state": "running", "argv": ["python", "02_extract.py"],
       "pid": 1000, "launched_at": time.time() - 60, "log": "/srv/x.log", "cwd": "/srv", "env": {}}


async def until(pilot: Any, cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the app process messages until `cond()` holds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await pilot.pause(0.02)


def gpu_text(app: EagleApp) -> str:
    return str(app.query_one(GpuPanel).render())


@pytest.mark.parametrize("n", [0, 2, 8])
async def test_gpu_panel_shows_every_card(n: int) -> None:
    client = ReplayClient([snapshot(n, runs=[RUN])])
    app = make_app(client, CFG, "root@gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.pause()
        text = gpu_text(app)
        if n == 0:
            assert "no GPU source:\npynvml not installed and nvidia-smi not found\n" in text  # one reason a line
        else:
            lines = [ln for ln in text.splitlines() if "H200" in ln]
            assert len(lines) == n
            assert "81.0/140 GiB" in lines[0] and "97%" in lines[0] and "55°C" in lines[0]
        assert app.query_one(ProcessTable).row_count == n
        assert app.query_one(RunsTable).row_count == 1


async def test_eight_gpus_fit_a_small_terminal() -> None:
    client = ReplayClient([snapshot(8, runs=[RUN])])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.pause()
        lines = [ln for ln in gpu_text(app).splitlines() if "H200" in ln]
        assert len(lines) == 8 and all(len(ln) <= 100 for ln in lines)


async def test_missing_readings_show_na_not_zero() -> None:
    snap = snapshot(1)
    g = dict(snap.wire["gpus"][0], util=None, temp=None, power=None)  # type: ignore[index,arg-type]
    client = ReplayClient([resnap(snap, gpus=[g])])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.pause()
        line = next(ln for ln in gpu_text(app).splitlines() if "H200" in ln)
        assert line.count("N/A") >= 3 and " 0%" not in line


def log_event(data: bytes, offset: int = 0) -> p.LogData:
    return p.LogData(sub="log1", path="/srv/x.log", inode=7, offset=offset, data=data)


async def test_shard_progress_and_log_tail() -> None:
    bar = (b"(Worker_TP0 pid=1234) \rLoading safetensors checkpoint shards:  37% Completed"
           b" | 24/64 [07:12<12:01, 18.0s/it]\n")
    lines = b"INFO 11-30 02:00:00 [loader.py:1] Starting to load model /m...\n" + bar
    client = ReplayClient([snapshot(2, runs=[RUN]), log_event(lines)])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.log.offset == len(lines))
        await pilot.pause()
        progress = str(app.query_one("#progress").render())
        assert "24/64" in progress and "18.0 s/shard" in progress and "ETA 12m" in progress
        # A later redraw replaces the bar.
        more = (b"(Worker_TP0 pid=1234) \rLoading safetensors checkpoint shards:  39% Completed"
                b" | 25/64 [07:30<11:40, 18.0s/it]\n")
        client.push(log_event(more, offset=len(lines)))
        await until(pilot, lambda: "25/64" in str(app.query_one("#progress").render()))
        # The first frame's tail is small; the older part of the analysis comes after it.
        assert ("subscribe", {"sub": "log1", "path": "/srv/x.log", "offset": -FIRST_TAIL,
                              "inode": None}) in client.requests


async def test_a_training_log_burst_repaints_the_progress_a_few_times_a_second_and_ends_on_the_newest_step() -> None:
    """A training loop's every line changes the step and the loss: at 50 lines a second the
    progress panel (and the panels the finished analysis redraws) repaint at most about
    twice a second, never lay the screen out again for a same-height panel, and once the
    lines stop the newest step and loss are on it. Snapshots come between the lines (here
    four a second), each redrawing every panel at once."""
    def line(i: int) -> bytes:
        return b"INFO 12-01 21:00:00 [worker.py:1] step %d: extracted 256 tokens, loss %.5f\n" % (i, 1 / (i + 1))

    first = line(0)
    client = ReplayClient([snapshot(2, runs=[RUN]), log_event(first)])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        progress, runs = app.query_one(RunProgress), app.query_one(RunsTable)
        await until(pilot, lambda: "step 0" in str(progress.render()))
        await pilot.pause(0.6)
        updates: list[bool] = []  # layout flag of each progress repaint
        refresh, show = progress.refresh, runs.show
        progress.refresh = lambda *rows, layout=False, **k: (  # type: ignore[method-assign,misc]
            updates.append(layout), refresh(*rows, layout=layout, **k))[1]
        tables: list[int] = []
        runs.show = lambda *a, **k: (tables.append(1), show(*a, **k))  # type: ignore[method-assign,func-returns-value]
        offset, i, t0 = len(first), 0, time.monotonic()
        while time.monotonic() - t0 < 2.0:  # a line every 20 ms for 2 s
            i += 1
            if i % 12 == 0:
                client.push(snapshot(2, seq=i, runs=[RUN]))
            client.push(log_event(line(i), offset=offset))
            offset += len(line(i))
            await pilot.pause(0.02)
        await until(pilot, lambda: f"step {i} " in str(progress.render()))
        await pilot.pause(0.6)
        shown = str(progress.render())
        assert f"step {i} " in shown and f"loss  {1 / (i + 1):.4g}" in shown, shown
        assert i >= 40 and len(updates) <= 2.0 / BUSY_S + 3, (i, len(updates))  # ~2 a second, not one a line
        assert len(tables) <= 2.0 / BUSY_S + 2.0 * 4 + 3, (i, len(tables))  # and one a snapshot
        assert sum(updates) <= 1, updates  # the same rows: no layout


async def test_the_older_part_of_a_long_log_is_analysed_after_the_first_frame() -> None:
    """The subscription starts FIRST_TAIL from the end; the bytes before it (up to
    TAIL_BYTES) are read afterwards and analysed first: the root cause in them shows,
    the line numbers count from the start of the whole tail, and the pane draws only
    the lines of the subscription, once."""
    older = (FIXTURES / "logs" / "vllm_prefix_zoo.log").read_bytes()  # ends in a CUDA OOM
    tail = b"".join(b"INFO 11-30 03:00:%02d [engine.py:1] after the failure %d\n" % (i % 60, i) for i in range(5000))
    tail = tail[len(tail) - FIRST_TAIL + 100:]
    tail = tail[tail.index(b"\n") + 1:]
    size = len(older) + len(tail)
    answers = {"subscribe": {"inode": 7, "size": size, "offset": len(older)},
               "read_range": {"offset": 0, "b64": base64.b64encode(older).decode(), "size": size, "inode": 7}}

    class SlowRead(ReplayClient):  # the older bytes take a while to come
        async def call_with_progress(self, op: str, on_event: Any, **args: Any) -> dict[str, Any]:
            if op == "read_range":
                await asyncio.sleep(0.5)
            return await super().call_with_progress(op, on_event, **args)

    client = SlowRead([snapshot(2, runs=[RUN]), log_event(tail, offset=len(older))], answers)
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    slices: list[AnalyseLog] = []
    app.dashboard.feed.listen(lambda ev: slices.append(ev) if isinstance(ev, AnalyseLog) else None)
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.log.offset == size and not app.dashboard.state.log.older
                    and not app.dashboard.state.log.backlog)
        log = app.dashboard.state.log
        assert len(slices) == -(-log.total_lines // ANALYSE_SLICE)  # no slice while waiting for the older bytes
        assert ("read_range", {"path": "/srv/x.log", "offset": 0, "length": len(older)}) in client.requests
        assert log.total_lines == older.count(b"\n") + tail.count(b"\n") and log.prepended == older.count(b"\n")
        assert log.analysis.root_cause is not None and log.analysis.root_cause.id == "cuda-oom"
        assert log.analysis.root_cause.line_no <= older.count(b"\n")
        await pilot.pause(0.5)
        pane = app.query_one("#log").query_one(TailLog)
        assert list(pane.lines) == tail.decode().splitlines()[-LOG_LINES:]  # each drawn once
        assert not any("OutOfMemory" in line or "out of memory" in line for line in pane.lines)


async def test_kill_asks_first_and_cancel_is_the_default() -> None:
    client = ReplayClient([snapshot(2, runs=[RUN])], answers={"kill": {
        "run_id": RUN["run_id"], "ok": True, "stages": [], "remaining": [], "gpus": [], "gpus_free": True,
        "elapsed": 1.0}})
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        body = str(app.screen.query_one("#body").render())
        assert "20261130-015500-ab12" in body and "1000, 1001" in body and "GPU0 80.5 GiB, GPU1 80.5 GiB" in body
        await pilot.press("enter")  # the focused button is Cancel
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        assert not [r for r in client.requests if r[0] == "kill"]
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: any(r[0] == "kill" for r in client.requests))
        await until(pilot, lambda: "GPUs free" in str(app.query_one("#banner").render()))


def notices(app: EagleApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def test_k_on_an_ended_run_says_it_already_exited() -> None:
    dead = dict(RUN, state="exited", exit_code=1)
    client = ReplayClient([snapshot(1, runs=[dead])])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        assert app.check_action("relaunch", ()) is True
        await pilot.press("k")
        await until(pilot, lambda: any("run 20261130-015500-ab12 already exited (1)" in n for n in notices(app)))
        assert not isinstance(app.screen, ConfirmScreen)
        assert not [r for r in client.requests if r[0] == "kill"]
        await pilot.press("r")  # relaunch asks first: it starts a long load
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        body = str(app.screen.query_one("#body").render())
        assert "launches: python 02_extract.py" in body
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        assert not [r for r in client.requests if r[0] == "launch"]


async def test_reconnecting_banner_and_help_and_quit() -> None:
    client = ReplayClient([snapshot(1), LinkStatus("reconnecting", 3, "connection lost")])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.link.state == "reconnecting")
        await pilot.pause()
        assert "reconnecting (attempt 3)" in str(app.query_one("#banner").render())
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("escape")
        await pilot.press("q")
    assert app.return_code in (0, None)


async def test_recorded_h200_snapshot_renders_two_lines_per_card() -> None:
    """A snapshot recorded from the real agent on an H200 (tests/fixtures/h200_snapshot.json)."""
    import json
    from pathlib import Path

    raw = json.loads((Path(__file__).parent / "fixtures" / "h200_snapshot.json").read_text())
    client = ReplayClient([p.parse_message({"type": "snapshot", **raw})])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == raw["seq"])
        await pilot.pause()
        lines = gpu_text(app).splitlines()
        assert "H200" in lines[0] and "0.6/140 GiB" in lines[0] and "37°C" in lines[0] and "103/700 W" in lines[0]
        assert lines[1].lstrip().startswith("mem")  # the history line under the card


FIXLOGS = __import__("pathlib").Path(__file__).parent / "fixtures" / "logs"


def serve_file(path: "__import__('pathlib').Path") -> Callable[[dict], dict]:
    """A read_range answer for one local file, shaped like the agent's."""
    data = path.read_bytes()

    def answer(args: dict) -> dict:
        off, n = args["offset"], args["length"]
        return {"offset": off, "b64": base64.b64encode(data[off : off + n]).decode(), "size": len(data), "inode": 1}

    return answer


async def test_doomed_banner_names_the_earlier_run_and_the_saving() -> None:
    now = time.time()
    v4 = {"set": "speculators-0.3.0-vllm-0.16", "state": "v4", "version": "v4"}
    earlier = dict(RUN, run_id="20261130-010000-0007", state="exited", exit_code=1, patch_state=v4,
                   launched_at=now - 3000, ended_at=now - 3000 + 21 * 60, log="/srv/old.log")
    live = dict(RUN, patch_state=v4, launched_at=now - 7 * 60)
    client = ReplayClient([snapshot(2, runs=[live, earlier])],
                          answers={"read_range": serve_file(FIXLOGS / "vllm016_tp8_sample_tokens.log")})
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: "likely fails like run" in str(app.query_one("#banner").render()))
        text = str(app.query_one("#banner").render())
        assert "20261130-010000-0007" in text and "kill now saves ~14 min" in text and "press k" in text
        runs = app.query_one(RunsTable)
        assert "sample_tokens" in str(runs.get_row("20261130-010000-0007")[-1])  # its root cause


async def test_stale_run_is_marked_and_bannered() -> None:
    v4 = {"set": "speculators-0.3.0-vllm-0.16", "state": "v4", "version": "v4"}
    client = ReplayClient([snapshot(1, runs=[dict(RUN, patch_state=v4)])])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        # What the patch probe reports (tui.services.patches.status, tested against the real agent).
        await pilot.pause(0.2)  # the first ledger refresh (no patch set: no probe) is done
        app.dashboard.feed.apply(LedgerRead(app.dashboard.state.summaries, "v5", ("v1", "v2", "v3", "v4", "v5")))
        client.push(snapshot(1, seq=1, runs=[dict(RUN, patch_state=v4)]))
        await until(pilot, lambda: app.dashboard.state.seq == 1)
        await pilot.pause()
        assert "STALE: launched with v4, v5 applied now" in str(app.query_one(RunsTable).get_row(RUN["run_id"])[-1])
        assert "v5 is applied now" in str(app.query_one("#banner").render())


async def test_dashboard_keys_do_nothing_under_another_screen() -> None:
    client = ReplayClient([snapshot(1, runs=[RUN])])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        for action in ("kill", "relaunch", "launch", "open_log"):
            assert app.check_action(action, ()) is False


async def test_runs_of_other_configs_are_hidden_until_a() -> None:
    other = dict(RUN, run_id="20261130-000000-0001", name="someone-else", state="running", pid=555)
    client = ReplayClient([snapshot(1, runs=[other, dict(RUN, state="exited", exit_code=0)])])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.pause()
        table = app.query_one(RunsTable)
        assert table.row_count == 1
        await pilot.press("k")  # the config's run, never someone else's live one
        await until(pilot, lambda: any("already exited (0)" in n for n in notices(app)))
        assert not isinstance(app.screen, ConfirmScreen)
        assert "a: all 2" in str(app.query_one("#runs-box").border_title)
        await pilot.press("a")
        await until(pilot, lambda: table.row_count == 2)
