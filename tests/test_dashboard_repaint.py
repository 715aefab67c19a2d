"""What a snapshot repaints (issue 39): the tables' changed cells, not every row.

The agent's 1 Hz snapshot changes a few cells (the ELAPSED and DURATION clocks, a
process's CPU%); the rest of the screen is the same. These drive the real dashboard
(headless, fed through the replay client) and watch which table rows are rendered again
and what the screen then shows."""

from __future__ import annotations

import re
import time
from typing import Any

from rich.text import Text
from textual.geometry import Region

from tests.replay import ReplayClient, resnap, snapshot
from tests.test_app import CFG, RUN, until
from tui.views.app import make_app
from tui.views.widgets.tables import KeyedTable, ProcessTable, RunsTable


def on_screen(table: KeyedTable) -> list[str]:
    """The table's lines, border included, as the compositor has them (its render cache
    included: a cell repainted in the wrong place, or not at all, shows here as the old
    text)."""
    width, height = table.outer_size
    return [Text.assemble(*((s.text, s.style) for s in strip)).plain
            for strip in table.render_lines(Region(0, 0, width, height))]


def spy_rows(table: KeyedTable) -> list[int]:
    """The content rows `table` renders from now on (0: the header)."""
    seen: list[int] = []
    render_line = table.render_line

    def spy(y: int) -> Any:
        seen.append(y)
        return render_line(y)

    table.render_line = spy  # type: ignore[method-assign]
    return seen


def young(procs: list[dict[str, Any]], elapsed: float) -> list[dict[str, Any]]:
    """The agent's process objects, each `elapsed` seconds old."""
    return [dict(pr, elapsed=elapsed) for pr in procs]


async def test_a_snapshot_that_moves_the_clocks_repaints_those_cells_and_the_screen_shows_them() -> None:
    """The ELAPSED cells of two young processes change (100 s -> 101 s): the two rows are
    rendered again and show 1m41s, the header and the empty rows below are not touched."""
    first = snapshot(2, runs=[RUN])
    client = ReplayClient([resnap(first, processes=young(first.wire["processes"], 100.0))])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.pause(0.3)
        procs = app.query_one(ProcessTable)
        assert sum(" 1m40s " in line for line in on_screen(procs)) == 2
        rows = spy_rows(procs)
        client.push(resnap(first, seq=1, processes=young(first.wire["processes"], 101.0)))
        await until(pilot, lambda: app.dashboard.state.seq == 1)
        await pilot.pause(0.3)
        shown = on_screen(procs)
        assert sum(" 1m41s " in line for line in shown) == 2 and not any(" 1m40s " in line for line in shown), shown
        assert set(rows) == {1, 2}, rows  # the two process rows; not the header (0), not the empty rows


async def test_an_unchanged_row_is_not_repainted_and_a_changed_cpu_cell_is() -> None:
    """One process's CPU% moves, nothing else does (the same elapsed): only its row is
    rendered again, and it shows the new figure."""
    first = snapshot(3, runs=[RUN])
    client = ReplayClient([first])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.pause(0.3)
        procs = app.query_one(ProcessTable)
        rows = spy_rows(procs)
        moved = [dict(pr) for pr in first.wire["processes"]]
        moved[1]["cpu"] = 12.0
        client.push(snapshot(3, seq=1, runs=[RUN], processes=moved))
        await until(pilot, lambda: app.dashboard.state.seq == 1)
        await pilot.pause(0.3)
        assert set(rows) == {2}, rows
        line = next(ln for ln in on_screen(procs) if ln.strip("│ ").startswith("1001 "))
        assert " 12 " in line and " 99 " not in line, line


async def test_the_run_duration_still_ticks_each_second() -> None:
    """A young run's DURATION shows seconds, so it moves with every 1 Hz snapshot: on
    screen, not only in the table's data."""
    run = dict(RUN, launched_at=time.time() - 125)
    client = ReplayClient([snapshot(1, runs=[run])])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.pause(0.3)
        runs = app.query_one(RunsTable)

        def duration() -> int:
            line = next(ln for ln in on_screen(runs) if RUN["run_id"] in ln)
            m, s = next(re.fullmatch(r"(\d+)m(\d+)s", w) for w in line.split() if re.fullmatch(r"\d+m\d+s", w)).groups()
            return 60 * int(m) + int(s)

        before = duration()
        for seq in (1, 2):
            time.sleep(1.05)  # the run's clock moves; the snapshot brings it
            client.push(snapshot(1, seq=seq, runs=[run]))
            await until(pilot, lambda: app.dashboard.state.seq == seq)
            await pilot.pause(0.2)
        assert 2 <= duration() - before <= 3, (before, duration())


async def test_an_idle_run_older_than_ten_minutes_repaints_no_line_while_a_young_one_ticks() -> None:
    """Idle, the dashboard's cost is what its 1 Hz snapshots repaint. A run an hour old
    and its processes show minutes (`60m`), so four snapshots a second apart repaint no
    line of the process table and only the young run's line of the runs table, whose
    DURATION shows seconds and moves with each of them."""
    now = time.time()
    old = dict(RUN, launched_at=now - 3605)
    new = dict(RUN, run_id="20261130-020000-cd34", launched_at=now - 65)
    first = snapshot(2, runs=[old, new])
    procs = young(first.wire["processes"], 3605.0)
    client = ReplayClient([resnap(first, processes=procs)])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.pause(0.3)
        runs, table = app.query_one(RunsTable), app.query_one(ProcessTable)
        assert [rk.value for rk in runs.rows] == [new["run_id"], old["run_id"]]
        run_rows, proc_rows = spy_rows(runs), spy_rows(table)
        shown = []
        for seq in range(1, 5):
            time.sleep(1.0)
            client.push(resnap(first, seq=seq, time=first.time + seq,
                               processes=young(first.wire["processes"], 3605.0 + seq)))
            await until(pilot, lambda: app.dashboard.state.seq == seq)
            await pilot.pause(0.2)
            shown.append(next(ln for ln in on_screen(runs) if new["run_id"] in ln))
        assert proc_rows == [], proc_rows  # 60m, 60m, ...: not one process line again
        assert set(run_rows) == {1}, run_rows  # the young run's line only, never the old one's (2)
        assert len(run_rows) >= 4 and len(set(shown)) == 4, shown  # 1m9s, 1m10s, ...: each snapshot on screen
        assert all(" 60m " in ln for ln in on_screen(runs) if old["run_id"] in ln)


async def test_a_process_that_comes_or_goes_leaves_the_other_rows_as_they_are() -> None:
    """One process ends, a newer one (a higher pid: it sorts last) starts: that row is
    removed and the new one added, the other rows are kept (the same rows, not a table
    built again and every row measured anew), and the cursor stays on its process."""
    first = snapshot(3, runs=[RUN])
    client = ReplayClient([first])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.pause(0.3)
        procs = app.query_one(ProcessTable)
        procs.move_cursor(row=2, animate=False)  # on pid 1002
        kept = {rk.value: row for rk, row in procs.rows.items()}
        sent = first.wire["processes"]  # the agent's objects
        later = [dict(sent[0]), dict(sent[2]), dict(sent[2], pid=1003)]
        client.push(snapshot(3, seq=1, runs=[RUN], processes=later))
        await until(pilot, lambda: app.dashboard.state.seq == 1)
        await pilot.pause(0.3)
        assert [rk.value for rk in procs.rows] == ["1000", "1002", "1003"]
        assert procs.rows[list(procs.rows)[0]] is kept["1000"]
        assert procs.rows[list(procs.rows)[1]] is kept["1002"]
        assert procs.coordinate_to_cell_key(procs.cursor_coordinate).row_key.value == "1002"
        shown = on_screen(procs)
        assert any(ln.strip("│ ").startswith("1003 ") for ln in shown) and not any(
            ln.strip("│ ").startswith("1001 ") for ln in shown), shown


async def test_when_processes_outgrow_the_table_its_scrollbar_comes_and_reaches_the_last_row() -> None:
    """The process table's height is set by the layout, not by its rows: rows that come
    and go move its scrollbar (shown once they outgrow it, gone when they fit again)
    and its scroll range, without laying the screen out."""
    first = snapshot(2, runs=[RUN])
    client = ReplayClient([first])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.pause(0.3)
        procs = app.query_one(ProcessTable)
        assert not procs.show_vertical_scrollbar
        many = [dict(first.wire["processes"][0], pid=2000 + i) for i in range(40)]
        client.push(snapshot(2, seq=1, runs=[RUN], processes=many))
        await until(pilot, lambda: app.dashboard.state.seq == 1)
        await pilot.pause(0.5)
        assert procs.row_count == 40 and procs.show_vertical_scrollbar
        procs.scroll_end(animate=False, immediate=True)
        await pilot.pause(0.3)
        assert any(ln.strip("│ ").startswith("2039 ") for ln in on_screen(procs))  # the last row can be reached
        client.push(snapshot(2, seq=2, runs=[RUN], processes=first.wire["processes"]))
        await until(pilot, lambda: app.dashboard.state.seq == 2)
        await pilot.pause(0.5)
        assert procs.row_count == 2 and not procs.show_vertical_scrollbar
        shown = on_screen(procs)
        assert sum(ln.strip("│ ").startswith(("1000 ", "1001 ")) for ln in shown) == 2, shown
