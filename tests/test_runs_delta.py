"""A periodic snapshot sends only the run records that changed (remote/agent/rundelta.py):
the client keeps the others. The reducer on crafted snapshots, then the dashboard on the
real agent (LocalLink) with a host's history of ended runs."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.agent_driver import AgentProc
from tests.replay import ReplayClient, make_snapshot
from tests.test_app import CFG, RUN, until
from tui import protocol as p
from tui.state.model import AppState
from tui.state.reducer import apply
from tui.transport import AgentClient, LocalLink
from tui.views.app import make_app
from tui.views.widgets.tables import RunsTable


def run(i: int, **over: Any) -> dict[str, Any]:
    return {**RUN, "run_id": f"20261130-0155{i:02d}-ab12", "name": f"r{i}", "state": "exited", "exit_code": 0,
            "launched_at": 1764459000.0 + i, "ended_at": 1764459100.0 + i, **over}


def snap(seq: int, runs: list[dict[str, Any]], run_ids: list[str] | None = None) -> p.Snapshot:
    extra = {} if run_ids is None else {"run_ids": run_ids}
    return make_snapshot(seq=seq, time=1764460000.0 + seq, host={}, gpus=[], processes=[], runs=runs, **extra)


def test_a_snapshot_of_changed_runs_keeps_the_others_as_they_were() -> None:
    """Runs a snapshot names but does not send are the same objects as before (nothing
    parsed or drawn again); a sent record replaces its run's; the order is `run_ids`'; a
    run it no longer names is gone; a whole snapshot (no `run_ids`) replaces them all."""
    now = time.time()
    state = apply(AppState(), snap(0, [run(1), run(2), run(3, state="running", ended_at=None)]), now)
    before = {r.run_id: r for r in state.runs}
    killed = run(3, state="killed", exit_code=None, signal="SIGKILL")
    state = apply(state, snap(1, [killed, run(4)], [run(4)["run_id"], run(3)["run_id"], run(1)["run_id"]]), now)
    assert [r.run_id for r in state.runs] == [run(i)["run_id"] for i in (4, 3, 1)]  # run 2 is gone
    assert state.runs[2] is before[run(1)["run_id"]]  # kept, not parsed again
    assert state.runs[1].state == "killed" and state.runs[0].name == "r4"
    kept = state.runs
    state = apply(state, snap(2, [], [r.run_id for r in kept]), now)
    assert state.runs == kept and all(a is b for a, b in zip(state.runs, kept))
    state = apply(state, snap(3, [run(5)]), now)
    assert [r.run_id for r in state.runs] == [run(5)["run_id"]]


def test_a_malformed_run_ids_is_a_protocol_error() -> None:
    try:
        p.parse_message({"type": "snapshot", "seq": 1, "time": 1.0, "runs": [], "run_ids": "x"})
    except p.ProtocolError as exc:
        assert "run_ids" in str(exc)
    else:
        raise AssertionError("a run_ids that is not a list was taken")


async def test_the_dashboard_shows_every_run_of_a_long_history_from_the_agents_changed_records(
        tmp_path: Path) -> None:
    """On the real agent: a host with ten ended runs and a live one. Snapshots after the
    first send the live run's record only, and the runs table keeps showing all eleven,
    the live run's DURATION moving; killed, its row says so."""
    runs_dir = tmp_path / "runs"
    with AgentProc(env={"EAGLE3_TUI_GPU_SOURCE": "none"}, args=["--runs-dir", str(runs_dir)]) as agent:
        agent.call("configure", {"interval": 1.0, "runs_dir": str(runs_dir)})
        for i in range(10):
            agent.call("launch", {"name": "kimi", "argv": ["true"], "cwd": str(tmp_path), "env": {},
                                  "patch_state": None, "log": None})
            deadline = time.monotonic() + 10
            while any(r["state"] == "running" for r in agent.call("runs")["runs"]):  # one of a name at a time
                assert time.monotonic() < deadline
                time.sleep(0.05)
        live = agent.call("launch", {"name": "kimi", "argv": [sys.executable, "-c", "import time; time.sleep(600)"],
                                     "cwd": str(tmp_path), "env": {}, "patch_state": None, "log": None})
    cfg = replace(CFG, host=replace(CFG.host, interval=0.25))
    client = AgentClient(LocalLink(runs_dir=str(runs_dir)))
    app = make_app(client, cfg, "local")  # type: ignore[arg-type]
    seen: list[p.Snapshot] = []
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            await until(pilot, lambda: app.dashboard.state.seq >= 0, timeout=15)
            app.dashboard.feed.listen(lambda ev: seen.append(ev) if isinstance(ev, p.Snapshot) else None)
            table = app.query_one(RunsTable)

            def rows() -> dict[str, str]:
                return {str(k.value): " ".join(str(c) for c in table.get_row(k)) for k in table.rows}

            await until(pilot, lambda: len(rows()) == 11 and sum(s.run_ids is not None for s in seen) >= 4, timeout=15)
            assert all(s.run_ids is not None and [r.run_id for r in s.runs] == [live["run_id"]] for s in seen[1:4])
            first = rows()[live["run_id"]]
            await until(pilot, lambda: rows()[live["run_id"]] != first, timeout=5)  # its DURATION moves
            assert sum(" exited " in row for row in rows().values()) == 10
            os.kill(live["pid"], 9)
            await until(pilot, lambda: " running " not in rows()[live["run_id"]], timeout=15)
            await pilot.pause(0.6)  # snapshots with no record at all
            assert len(rows()) == 11 and seen[-1].runs == ()
    finally:
        await client.close()


async def test_an_ended_runs_row_follows_its_record() -> None:
    """An ended run's row is made once while its record stays the same object; a new
    record (here its exit, recorded late) makes it again."""
    lost = run(1, state="lost", exit_code=None, name="kimi")
    client = ReplayClient([snap(0, [lost])])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        table = app.query_one(RunsTable)
        assert "lost" in str(table.get_row(lost["run_id"])[2])
        client.push(snap(1, [run(1, exit_code=3, name="kimi")], [lost["run_id"]]))
        await until(pilot, lambda: app.dashboard.state.seq == 1)
        await pilot.pause(0.2)
        cells = [str(c) for c in table.get_row(lost["run_id"])]
        assert cells[2] == "failed" and cells[5] == "3", cells


def test_runs_that_are_not_one_record_per_id_go_whole() -> None:
    """The agent's side (remote/agent/rundelta.py): two records of one id (a run dir
    copied by hand), an id that is not a string, or no list at all: the snapshot goes
    whole, and so does the next one (there is nothing to compare it with)."""
    from remote.agent.rundelta import RunsSent

    sent = RunsSent()
    a, b = {"run_id": "a", "duration": 1}, {"run_id": "b", "duration": 9}
    assert "run_ids" not in sent.trim({"runs": [a, b]})
    assert sent.trim({"runs": [dict(a, duration=2), b]}) == {"runs": [dict(a, duration=2)], "run_ids": ["a", "b"]}
    for odd in ([a, dict(a)], [a, {"run_id": 7}], [a, "b"], None):
        assert sent.trim({"runs": odd}) == {"runs": odd}  # whole, as it was
        assert sent.trim({"runs": [a, b]}) == {"runs": [a, b]}  # whole again: nothing to compare with
        assert sent.trim({"runs": [a, b]}) == {"runs": [], "run_ids": ["a", "b"]}
