"""What a snapshot repaints (issue 39): the tables' changed cells, not every row.

The agent's 1 Hz snapshot changes a few cells (the ELAPSED and DURATION clocks, a
process's CPU%); the rest of the screen is the same. These drive the real dashboard
(headless, fed through the replay client) and watch which table rows are rendered again
and what the screen then shows."""

from __future__ import annotations

import contextlib
import re
import time
from typing import Any

from rich.text import Text
from textual._compositor import Compositor
from textual.geometry import Region
from textual.widget import Widget

from tests.replay import ReplayClient, resnap, snapshot
from tests.test_app import CFG, RUN, log_event, until
from tui.state.format import clock
from tui.state.model import LOG_LINES
from tui.views.app import make_app
from tui.views.driver import ChopsWithKeptMoves, NarrowCompositor
from tui.views.widgets.logtail import LogPane, TailLog
from tui.views.widgets.progress import RunProgress
from tui.views.widgets.status import StatusBar
from tui.views.widgets.tables import ProcessTable, RunsTable


def on_screen(widget: Widget) -> list[str]:
    """The widget's lines, border included, as the compositor has them (its render cache
    included: a cell repainted in the wrong place, or not at all, shows here as the old
    text)."""
    width, height = widget.outer_size
    return [Text.assemble(*((s.text, s.style) for s in strip)).plain
            for strip in widget.render_lines(Region(0, 0, width, height))]


def spy_rows(widget: Widget) -> list[int]:
    """The content rows `widget` renders from now on (a table's 0: its header)."""
    seen: list[int] = []
    render_line = widget.render_line

    def spy(y: int) -> Any:
        seen.append(y)
        return render_line(y)

    widget.render_line = spy  # type: ignore[method-assign]
    return seen


def young(procs: list[dict[str, Any]], elapsed: float) -> list[dict[str, Any]]:
    """The agent's process objects, each `elapsed` seconds old."""
    return [dict(pr, elapsed=elapsed) for pr in procs]


async def test_young_processes_show_when_they_started_and_their_rows_stay_still() -> None:
    """The process table shows when each process started (`ps`'s STIME), not its age:
    two young processes whose age moves 100 s -> 101 s with the next snapshot show the
    same STARTED, and neither row is rendered again (an age column repainted every young
    process's line each second)."""
    first = snapshot(2, runs=[RUN])
    client = ReplayClient([resnap(first, processes=young(first.wire["processes"], 100.0))])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.pause(0.3)
        procs = app.query_one(ProcessTable)
        started = clock(first.wire["processes"][0]["start_time"], time.time())
        assert started != "N/A" and sum(f" {started} " in line for line in on_screen(procs)) == 2
        rows = spy_rows(procs)
        client.push(resnap(first, seq=1, processes=young(first.wire["processes"], 101.0)))
        await until(pilot, lambda: app.dashboard.state.seq == 1)
        await pilot.pause(0.3)
        assert sum(f" {started} " in line for line in on_screen(procs)) == 2
        assert rows == [], rows  # nothing in the table moved


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
    shows minutes (`60m`) and its processes when they started, so four snapshots a second
    apart repaint no line of the process table and only the young run's line of the runs
    table, whose DURATION shows seconds and moves with each of them."""
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
        assert proc_rows == [], proc_rows  # not one process line again
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


async def test_the_tables_fit_their_panels_again_when_a_wide_row_comes_or_goes() -> None:
    """A process whose WHY is wide (run,match,gpu) comes, goes and comes back; a run
    killed days ago (its EXIT and STARTED wider) comes and goes: each table stays as
    wide as its panel (no horizontal scrollbar to hide its last row), and COMMAND and
    FAILURE / NOTE take the room the others leave, their ellipsis in sight. DataTable
    widens a column for a wider cell but never narrows one again: the process table
    once ran 10 cells past its panel, the cut commands' ends out of sight. The same when
    the terminal narrows (it ran 40 cells past), and the runs table, its height its rows',
    must drop the horizontal scrollbar it needed before."""
    base = snapshot(2).wire["processes"][0]
    long = ["python", "/srv/" + "x" * 200]
    narrow = dict(base, pid=1000, why=["run"], cmdline=long)
    wide = dict(base, pid=1001, why=["run", "match", "gpu"], cmdline=long)
    failed = dict(RUN, state="exited", exit_code=1, ended_at=time.time(), error="x" * 300)  # a long note
    old = dict(RUN, run_id="20261130-015600-cd34", state="killed", signal="SIGKILL", pid=None,
               launched_at=time.time() - 3 * 86400, ended_at=time.time() - 2 * 86400)
    client = ReplayClient([snapshot(2, runs=[failed], processes=[narrow])])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(200, 50)) as pilot:  # wide enough that the runs table shows all its columns
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        procs, runs = app.query_one(ProcessTable), app.query_one(RunsTable)
        steps = (([narrow, wide], [failed]), ([narrow], [failed, old]),
                 ([narrow, wide], [failed]), ([narrow], [failed]))
        def fits(table: Any) -> bool:
            return (table.virtual_size.width <= table.scrollable_content_region.width
                    and not table.show_horizontal_scrollbar)

        async def both_fit(step: Any, processes: int) -> None:
            with contextlib.suppress(AssertionError):  # a table that never fits is told below
                await until(pilot, lambda: fits(procs) and fits(runs))
            for table, rows in ((procs, processes), (runs, 1)):  # the rows cut: every process, the failed run
                assert fits(table), (step, table, table.virtual_size.width, table.scrollable_content_region.width)
                cut = [ln for ln in on_screen(table) if "…" in ln]
                assert len(cut) == rows and all(ln.rstrip(" │").endswith("…") for ln in cut), (step, on_screen(table))

        for seq, (ps, rs) in enumerate(steps, 1):
            client.push(snapshot(2, seq=seq, runs=rs, processes=ps))
            await until(pilot, lambda: app.dashboard.state.seq == seq and procs.row_count == len(ps))
            await both_fit(seq, len(ps))
        for size in ((160, 50), (120, 40), (200, 50)):  # the terminal narrowed, then widened again
            await pilot.resize_terminal(*size)
            await until(pilot, lambda: app.size == size)
            await both_fit(size, 1)


# A cursor move that writes nothing before the next move or line: Textual sends one for a
# cut that starts where an updated region ends, when the widget behind it was rendered.
_IDLE_MOVE = re.compile(r"\x1b\[\d+;\d+H(?=\x1b\[\d+;\d+H|\n|$)")


def written(update: str) -> str:
    """A partial update's bytes as the terminal acts on them: its writes, in order."""
    return _IDLE_MOVE.sub("", update)


async def test_a_partial_update_renders_only_what_is_under_it_and_sends_what_textual_would(
        monkeypatch: Any) -> None:
    """The dashboard's compositor (tui/views/driver.py NarrowCompositor) renders, for a
    partial update, only the widgets that show in the regions updated (not those behind
    a widget that holds a whole region); Textual's renders every widget whose clip meets
    the box around them, and a panel's clip is the whole screen.
    Every partial update of a busy session (young clocks, a CPU% cell, processes that
    come and go, log lines, the help screen over it all and gone again) is rendered both
    ways, and the terminal would get the same bytes (ours written by `ChopsWithKeptMoves`,
    whose cursor moves are made once); an update of the runs table's clock
    alone renders neither the log pane nor the process table, nor the runs panel and the
    screen behind the table."""
    compared: list[Any] = []
    differ: list[Any] = []
    rendered: list[str] = []  # what our pass rendered of the log pane, the process table, the runs panel and the screen
    ours = NarrowCompositor.render_partial_update

    def both(self: NarrowCompositor) -> Any:
        regions = set(self._dirty_regions)
        update = ours(self)
        self._dirty_regions.update(regions)
        kept = len(rendered)
        textual = Compositor.render_partial_update(self)  # unfiltered: not inside ours
        del rendered[kept:]
        if update is not None:
            assert type(update) is ChopsWithKeptMoves
            compared.append(sorted(regions))
            console = app.console
            if written(update.render_segments(console)) != written(textual.render_segments(console)):
                differ.append(sorted(regions))
        return update

    monkeypatch.setattr(NarrowCompositor, "render_partial_update", both)
    run = dict(RUN, launched_at=time.time() - 65)
    first = snapshot(3, runs=[run])
    sent = first.wire["processes"]
    client = ReplayClient([first])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.pause(1.0)  # the start-up's last repaints (the footer, the log's scrollbar) done
        for widget in (app.query_one(LogPane), app.query_one(ProcessTable), app.query_one("#runs-box"), app.screen):
            render_lines = widget.render_lines
            widget.render_lines = (  # type: ignore[method-assign]
                lambda crop, w=widget, r=render_lines: rendered.append(type(w).__name__) or r(crop))
        time.sleep(1.05)  # the run's clock moves; nothing else does
        client.push(resnap(first, seq=1))
        await until(pilot, lambda: app.dashboard.state.seq == 1)
        await pilot.pause(0.3)
        assert compared and rendered == [], (rendered, compared[-3:])
        offset, seq = 0, 1
        for step in range(6):
            seq += 1
            moved = [dict(pr) for pr in sent]
            moved[step % 3]["cpu"] = 10.0 + step
            procs = moved if step % 2 else [*moved, dict(sent[0], pid=1100 + step)]
            line = f"INFO step {step}: a line of the run's log\n".encode()
            client.push(resnap(first, seq=seq, processes=procs))
            client.push(log_event(line, offset))
            offset += len(line)
            await until(pilot, lambda: app.dashboard.state.seq == seq)
            await pilot.pause(0.3)
            if step == 2:
                await pilot.press("question_mark")
                await pilot.pause(0.3)
                await pilot.press("escape")
                await pilot.pause(0.3)
        assert len(compared) >= 8, compared
        assert differ == [], f"{len(differ)} of {len(compared)} updates differ: {differ[:3]}"


async def test_a_streaming_log_repaints_its_rows_and_its_scrollbar_only_when_the_thumb_moves() -> None:
    """Lines that arrive repaint the log pane's rows; its scrollbar is drawn again only
    when its thumb moves on screen (the tail still short of LOG_LINES and its thumb
    longer than a cell), never behind what the screen shows, and not at all while the
    thumb stays put: a tail long enough for the least thumb, or full (it was redrawn
    with every frame of a busy log)."""
    client = ReplayClient([snapshot(2, runs=[RUN])])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        tail = app.query_one(TailLog)
        bar = tail.vertical_scrollbar
        drawn: list[list[list[tuple[str, bool]]]] = []  # the whole scrollbar as it was at each render
        render_lines = bar.render_lines

        def cells(lines: Any) -> list[list[tuple[str, bool]]]:
            """Each row's cells, (character, reversed): a thumb is glyphs and reversed blanks."""
            return [[(ch, bool(seg.style and seg.style.reverse)) for seg in line for ch in seg.text]
                    for line in lines]

        def whole() -> list[list[tuple[str, bool]]]:
            return cells(render_lines(Region(0, 0, *bar.outer_size)))

        def due() -> list[list[tuple[str, bool]]]:
            """The bar for its state now, rendered afresh by Textual's ScrollBar (not its cache)."""
            size = bar.outer_size
            return cells(app.console.render_lines(bar.render(), app.console.options.update_dimensions(*size)))

        def spy(crop: Region) -> Any:
            out = render_lines(crop)
            drawn.append(whole())
            return out

        bar.render_lines = spy  # type: ignore[method-assign]
        offset, n = 0, 0

        async def lines(count: int) -> None:
            nonlocal offset, n
            # lines of one width: a wider line lays the pane out (the scrollbar repainted with it)
            data = b"".join(f"INFO step {n + i:05d}: a line of the run's log\n".encode() for i in range(count))
            n += count
            client.push(log_event(data, offset))
            offset += len(data)
            newest = f"step {n - 1:05d}: a line of the run's log"
            await until(pilot, lambda: tail.lines and tail.lines[-1].endswith(newest))
            await pilot.pause(0.3)

        for count, up in ((20, False), (8, False), (12, True), (40, False), (300, False)):
            # short of LOG_LINES: the thumb shrinks and moves down; once while the user
            # reads from the top, where only the tail's range moves
            if up:
                tail.scroll_home(animate=False, immediate=True)
                await pilot.pause(0.3)
            await lines(count)
            assert drawn and drawn[-1] == whole() == due(), "the scrollbar on screen is behind its thumb"
            if up:
                tail.scroll_end(animate=False, immediate=True)
        thumbs = len({str(d) for d in drawn})
        assert thumbs >= 3, thumbs
        before = len(drawn)
        for _ in range(3):  # still short of LOG_LINES, the thumb at its least size at the bottom
            await lines(20)
        assert len(tail.lines) < LOG_LINES
        assert len(drawn) == before, f"a still thumb was drawn {len(drawn) - before} times more"
        await lines(LOG_LINES)  # full now
        before = len(drawn)
        for _ in range(4):
            await lines(20)
            row = [ln for ln in on_screen(tail) if "step" in ln][-1]
            assert f"step {n - 1:05d}:" in row, row  # the newest line is on screen
        assert len(drawn) == before, f"the scrollbar was drawn {len(drawn) - before} times more"
        assert drawn[-1] == whole() == due()
        at_end = drawn[-1]
        tail.scroll_home(animate=False, immediate=True)  # the user goes to the top: the thumb follows
        await pilot.pause(0.3)
        assert len(drawn) > before and drawn[-1] == whole() == due() != at_end
        assert on_screen(tail)[0].startswith(tail.lines[0])  # and the rows follow too


async def test_once_the_snapshots_stop_the_stale_age_keeps_counting() -> None:
    """While snapshots come each second the once-a-second tick leaves the screen to
    them; once they stop, the status bar says "stale for N s" and N counts on."""
    client = ReplayClient([snapshot(1, runs=[RUN])])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        bar = app.query_one(StatusBar)

        def age() -> int | None:
            m = re.search(r"stale for (\d+)s", str(bar.render()))
            return None if m is None else int(m.group(1))

        await until(pilot, lambda: age() is not None, timeout=6)
        first = age()
        await pilot.pause(2.2)
        assert age() is not None and age() >= first + 2, (first, age())  # type: ignore[operator]


async def test_a_training_line_repaints_the_progress_rows_it_changed() -> None:
    """A metrics line moves the loss (its row); a step bar moves the step (its row): each
    repaints that row of the progress panel, not the panel (at 20 lines/s every one of
    its rows was rendered again twice a second), and the panel on screen shows the
    newest step and loss."""
    client = ReplayClient([snapshot(2, runs=[RUN])])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        panel = app.query_one(RunProgress)
        offset = 0

        async def line(text: str, shown: str) -> None:
            nonlocal offset
            data = (text + "\n").encode()
            client.push(log_event(data, offset))
            offset += len(data)
            await until(pilot, lambda: shown in str(panel.render()))
            await pilot.pause(0.3)

        await line(" 10%|██        | 100/1000 [00:50<07:30,  2.00it/s]", "step 100/1000")
        await line("{'loss': 1.2345, 'grad_norm': 0.9, 'learning_rate': 2e-05, 'epoch': 0.1}", "loss  1.234")
        rows = [ln.plain for ln in panel.render().split("\n")]
        train, loss = (next(y for y, row in enumerate(rows) if row.startswith(head)) for head in ("train ", "loss "))
        seen = spy_rows(panel)
        await line("{'loss': 0.9876, 'grad_norm': 0.8, 'learning_rate': 2e-05, 'epoch': 0.1}", "loss  0.9876")
        assert set(seen) == {loss}, (seen, rows)
        seen.clear()
        await line(" 10%|██        | 101/1000 [00:50<07:29,  2.00it/s]", "step 101/1000")
        assert set(seen) == {train}, (seen, rows)
        drawn = on_screen(panel)
        assert "step 101/1000" in drawn[train] and "loss  0.9876" in drawn[loss], drawn


async def test_while_lines_stream_a_snapshot_joins_their_next_repaint() -> None:
    """The agent's snapshot comes once a second, the busy log's repaint twice, each at its
    own steady phase. A snapshot that came just after the lines' repaint was drawn in a
    screen update of its own: one frame more each second for the whole run. Its changed
    cell is now drawn with the lines' next repaint, and it is on screen then."""
    first = snapshot(3, runs=[RUN])
    client = ReplayClient([first])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.pause(0.5)
        frames: list[set[str]] = []  # what each screen update rendered, of the log and the process table
        compositor = app.screen._compositor
        render_update = compositor.render_update

        def frame(*a: Any, **k: Any) -> Any:
            frames.append(set())
            return render_update(*a, **k)

        compositor.render_update = frame  # type: ignore[method-assign]
        procs, tail = app.query_one(ProcessTable), app.query_one(TailLog)
        for widget in (procs, tail):
            render_line = widget.render_line
            widget.render_line = (  # type: ignore[method-assign]
                lambda y, w=widget, r=render_line: (frames and frames[-1].add(type(w).__name__), r(y))[1])
        sent, n, offset = [time.monotonic()], 0, 0  # when each snapshot was sent
        repainted: list[float] = []
        repaint_due = app.dashboard._repaint_due
        app.dashboard._repaint_due = lambda: (repainted.append(time.monotonic()), repaint_due())[1]  # type: ignore[method-assign]
        while len(sent) <= 3 or time.monotonic() - sent[-1] < 0.7:  # lines until the last one's repaint
            line = f"INFO step {n}: a line of the run's log\n".encode()
            client.push(log_event(line, offset))
            offset, n = offset + len(line), n + 1
            await pilot.pause(0.05)
            now = time.monotonic()
            if len(sent) <= 3 and n > 20 and now - sent[-1] > 1.0 and repainted and now - repainted[-1] < 0.1:
                await pilot.pause(0.01)  # the worst phase: the lines' repaint is on screen, their next not due
                sent.append(time.monotonic())
                moved = [dict(pr) for pr in first.wire["processes"]]
                moved[1]["cpu"] = 10.0 + len(sent) - 1
                client.push(snapshot(3, seq=len(sent) - 1, runs=[RUN], processes=moved))
                await pilot.pause(0.03)
        await until(pilot, lambda: app.dashboard.state.seq == 3)
        await pilot.pause(0.7)
        line = next(ln for ln in on_screen(procs) if ln.strip("│ ").startswith("1001 "))
        assert " 13 " in line, line
        drawn = [f for f in frames if "ProcessTable" in f]
        assert len(drawn) >= 3 and all("TailLog" in f for f in drawn), frames


async def test_a_snapshot_that_moves_nothing_the_progress_shows_does_not_make_its_text_again() -> None:
    """Each 1 Hz snapshot asked the progress panel to make its text again (a training
    run's bars and its loss plot over the whole run) to find it unchanged; it is made
    only when the analysis or the phase moved: here the run killed, the same log."""
    client = ReplayClient([snapshot(2, runs=[RUN]),
                           log_event(b"{'loss': 1.5, 'grad_norm': 0.9, 'learning_rate': 2e-05, 'epoch': 0.1}\n")])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        panel = app.query_one(RunProgress)
        await until(pilot, lambda: "loss  1.5" in str(panel.render()))
        await pilot.pause(0.3)
        made: list[str] = []
        put = panel.put
        panel.put = lambda text: (made.append(text.plain), put(text))[1]  # type: ignore[method-assign]
        for seq in (1, 2, 3):
            client.push(snapshot(2, seq=seq, runs=[RUN]))
            await until(pilot, lambda: app.dashboard.state.seq == seq)
        await pilot.pause(0.3)
        assert made == [], made
        client.push(snapshot(2, seq=4, runs=[dict(RUN, state="killed", pid=None)]))
        await until(pilot, lambda: "Phase killed" in str(panel.render()))
        assert len(made) == 1 and "loss  1.5" in made[0], made


async def test_the_tables_follow_a_theme_change() -> None:
    """The tables make their style once per repaint, not once per line: after a theme
    change (the command palette's "Change theme") their lines are drawn in the new one."""
    client = ReplayClient([snapshot(2, runs=[RUN])])
    app = make_app(client, CFG, "gpu-box")  # type: ignore[arg-type]
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.dashboard.state.seq == 0)
        await pilot.pause(0.3)
        tables = (app.query_one(RunsTable), app.query_one(ProcessTable))

        def backgrounds() -> list[set[Any]]:
            return [{s.style.bgcolor for strip in t.render_lines(Region(0, 0, *t.outer_size)) for s in strip
                     if s.style is not None and s.style.bgcolor is not None} for t in tables]

        dark = backgrounds()
        app.theme = "textual-light"
        await pilot.pause(0.5)
        light = backgrounds()
        assert all(light) and all(not (was & now) for was, now in zip(dark, light)), (dark, light)
