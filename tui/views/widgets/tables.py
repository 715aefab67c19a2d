"""Process and run tables, updated by row key: only changed cells are touched,
inside one batch, so a 1 Hz snapshot never flickers or loses the cursor."""

from __future__ import annotations

import time
from typing import Any, Sequence

from rich.cells import cell_len
from rich.text import Text
from textual.cache import LRUCache
from textual.coordinate import Coordinate
from textual.geometry import Size
from textual.reactive import Reactive
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowKey

from tui.protocol.records import ProcReading, RunRecord
from tui.state.format import clock, gib, num
from tui.state.model import AppState
from tui.state.view import run_row
from tui.views.widgets.render import StyleOncePerRepaint, set_title


class KeyedTable(StyleOncePerRepaint, DataTable[Any]):
    """A DataTable kept in sync with a dict of row key -> cells, fitted to its width.

    When the columns do not fit, they give way in a stated order: those in `DROP` hide,
    first to last, until the `FLEX` column has room for `FLEX_WANT` cells of its text;
    then those in `SHRINK` keep only their last N characters; the `FLEX` column takes
    what is left (at least `FLEX_MIN` cells) and its text is clipped."""

    COLUMNS: Sequence[tuple[str, str]] = ()  # (key, label)
    DROP: Sequence[str] = ()
    SHRINK: dict[str, int] = {}
    FLEX: str = ""
    FLEX_MIN = 10
    FLEX_WANT = 10
    SHORT_LABELS: dict[str, str] = {}  # a column's label when its width is cut below it
    ORDERED = False  # True: the same rows in a new order (a sort) are laid out again too
    _synced: dict[str, tuple[Any, ...]] | None = None
    _fitted: tuple[int, tuple[str, ...]] | None = None  # (width, visible columns)
    _all_rows: dict[str, tuple[Any, ...]] = {}
    _shown_cols: tuple[str, ...] = ()
    _shown_heads: tuple[str, ...] | None = None
    _widths: dict[str, int] = {}  # each shown column's width as the last sync fitted it
    _drawn: list[tuple[Any, ...]] = []  # the cells on screen, row by row in their order
    _cell_strips: LRUCache[tuple[Any, ...], Any] | None = None
    _clips: dict[tuple[str, str], tuple[tuple[Any, int | None], Any]] = {}  # (row, column) -> (cell, width), clipped
    # A row's cells object as last given, with its cells' widths and its clipped row: a
    # row given again as the same object (a host's ended runs, snapshot after snapshot)
    # is neither measured, clipped nor compared again.
    _needs: dict[str, tuple[tuple[Any, ...], list[int]]] = {}
    _rows_clipped: dict[str, tuple[tuple[Any, ...], Any, tuple[Any, ...]]] = {}

    # Rows that come or go change the table's virtual size, and Widget's virtual_size
    # lays the whole screen out (every scroll view's scrollbars repainted, the regions
    # that moved rendered again). A table whose height is set (the process table: 1fr)
    # needs only its scrollbars to follow; one whose height follows its rows (auto, the
    # runs table) still lays the screen out, and its scrollbars follow once that layout is
    # done: the layout itself updates them only when the table's size moved, so a runs
    # table narrowed to fit a smaller terminal kept the horizontal scrollbar it had needed,
    # a row of its height (asked before the layout, they read the old height and a new
    # row flashed a vertical one).
    virtual_size: Reactive[Size] = Reactive(Size(0, 0), layout=False)

    def watch_virtual_size(self, size: Size) -> None:
        height = self.styles.height
        if height is None or height.is_auto:
            self.refresh(layout=True)
            self.call_after_refresh(self._scrollbars_follow)
        elif self.is_mounted:
            self._scroll_update(size)

    def _scrollbars_follow(self) -> None:
        if self.is_mounted:
            self._scroll_update(self.virtual_size)

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        # DataTable keys its render caches by an update counter that every cell update
        # bumps, so with 1 Hz snapshots old entries are never read again; its default
        # sizes (10,000 cells, 1,000 rows and lines) only hold dead renders, megabytes
        # of them. A few screens' worth is enough.
        for name, size in (("_cell_render_cache", 1000), ("_row_render_cache", 200),
                           ("_row_renderable_cache", 200), ("_line_cache", 200)):
            if isinstance(getattr(self, name, None), LRUCache):
                setattr(self, name, LRUCache(size))
        self._cell_strips = LRUCache(1000)

    def _render_cell(self, row_index: int, column_index: int, base_style: Any, width: int,
                     cursor: bool = False, hover: bool = False) -> Any:
        """A cell's rendering, kept while the cell's text, place and style are the same.

        DataTable keys its own cell cache by a counter every `update_cell` bumps, so a
        1 Hz snapshot that changes one cell (a run's duration, a process's CPU%) renders
        every cell of the table again, the header too: most of an idle dashboard's CPU.
        Keyed here by what the cell shows instead, only the changed cells are rendered."""
        cells = self._shown_heads if row_index < 0 else (
            self._drawn[row_index] if 0 <= row_index < len(self._drawn) else None)
        if cells is None or not 0 <= column_index < len(cells) or self._cell_strips is None:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        key = (row_index, column_index, _cell_key(cells[column_index]), base_style, width, cursor, hover,
               getattr(self, "_show_hover_cursor", None), getattr(self, "_pseudo_class_state", None))
        lines = self._cell_strips.get(key)
        if lines is None:
            lines = super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
            self._cell_strips[key] = lines
        return lines

    def notify_style_update(self) -> None:
        super().notify_style_update()
        if self._cell_strips is not None:
            self._cell_strips.clear()  # a theme or CSS change restyles every cell

    def on_resize(self) -> None:
        self.sync(self._all_rows)

    def watch_show_vertical_scrollbar(self, shown: bool) -> None:
        """A vertical scrollbar that comes or goes changes the width the columns fit
        (no resize event says so): fit them again."""
        if self._synced is not None:
            self.call_later(self.sync, self._all_rows)

    def layout_for(self, rows: dict[str, tuple[Any, ...]],
                   width: int) -> tuple[tuple[str, ...], dict[str, int], dict[str, int]]:
        """The columns shown at `width`, the columns cut to a width (SHRINK, FLEX), and
        each column's width uncut (its widest cell, or its short label)."""
        keys = [k for k, _ in self.COLUMNS]
        need = {k: cell_len(self.SHORT_LABELS.get(k, label)) for k, label in self.COLUMNS}
        measured, self._needs = self._needs, {}
        for rk, cells in rows.items():
            kept = measured.get(rk)
            lens = kept[1] if kept is not None and kept[0] is cells else [_cell_len(c) for c in cells]
            self._needs[rk] = (cells, lens)
            for k, n in zip(keys, lens):
                if n > need[k]:
                    need[k] = n
        shown, cut = list(keys), dict[str, int]()
        pad = 2 * self.cell_padding

        def total() -> int:
            return sum(cut.get(k, need[k]) + pad for k in shown)

        if width <= 0:
            return tuple(shown), cut, need
        if self.FLEX:
            cut[self.FLEX] = min(need[self.FLEX], max(self.FLEX_WANT, self.FLEX_MIN))
        for k in self.DROP:
            if total() <= width:
                break
            shown.remove(k)
        if self.FLEX:
            cut[self.FLEX] = min(need[self.FLEX], self.FLEX_MIN)
        for k, n in self.SHRINK.items():
            if total() > width and need[k] > n:
                cut[k] = n
        if self.FLEX:
            cut[self.FLEX] = max(width - (total() - cut[self.FLEX] - pad) - pad, self.FLEX_MIN)
        return tuple(shown), cut, need

    def sync(self, rows: dict[str, tuple[Any, ...]]) -> None:
        """Show `rows` in their given order. Cells update in place; only a change in
        which rows or columns exist rebuilds the table (keeping the cursor on its row)."""
        width = self.scrollable_content_region.width
        if self.ORDERED and self._synced is not None and list(rows) != list(self._synced):
            self._synced = None  # dicts compare equal in any order
        if rows == self._synced and self._fitted is not None and self._fitted[0] == width:
            return  # nothing changed: no cell touched, nothing repainted
        self._all_rows = rows
        keys = [k for k, _ in self.COLUMNS]
        cols, cut, need = self.layout_for(rows, width)
        self._synced, self._fitted = rows, (width, cols)
        index = [keys.index(k) for k in cols]
        # A cell is clipped (made a `Text`) again only when it or its width changed: a
        # snapshot moves a few cells of many rows, and the same objects mean "unchanged" below.
        clips, made = self._clips, dict[tuple[str, str], tuple[tuple[Any, int | None], Any]]()
        before, self._rows_clipped = self._rows_clipped, {}
        layout = (cols, sorted(cut.items()))
        shown = {}
        for rk, cells in rows.items():
            kept = before.get(rk)
            if kept is not None and kept[0] is cells and kept[1] == layout:
                shown[rk] = kept[2]
                made.update(((rk, k), clips[(rk, k)]) for k in cols)
            else:
                row = []
                for i in index:
                    k, w, what = keys[i], cut.get(keys[i]), _what(cells[i])
                    old = clips.get((rk, k))
                    if old is None or old[0] != (what, w):
                        old = ((what, w), _clip(cells[i], w, k in self.SHRINK))
                    made[(rk, k)] = old
                    row.append(old[1])
                shown[rk] = tuple(row)
            self._rows_clipped[rk] = (cells, layout, shown[rk])
        self._clips = made
        unchanged = {rk for rk, kept in before.items() if kept[2] is shown.get(rk)}
        labels = dict(self.COLUMNS)
        heads = tuple(self.SHORT_LABELS.get(k, labels[k]) if cut.get(k, len(labels[k])) < len(labels[k])
                      else labels[k] for k in cols)
        # a label follows its column's width too: the first row can narrow the FLEX column
        # ("FAILURE / NOTE" left as it was ran past the edge as "FAILURE / NO")
        new_cols = (cols, heads) != (self._shown_cols, self._shown_heads)
        self._drawn = list(shown.values())
        fitted = {k: min(n, cut.get(k, n)) for k, n in need.items()}  # each column's width, cut as shown
        with self.app.batch_update():
            had = [rk.value for rk in self.rows if rk.value is not None]
            if not new_cols and had != list(shown) and [k for k in had if k in shown] + [
                    k for k in shown if k not in self.rows] == list(shown):
                # Rows came or went, the others keep their order (a new process sorts
                # last, by pid): those removed and added alone, not every row again.
                selected = self.cursor_key()
                for key in had:
                    if key not in shown:
                        self.remove_row(key)
                for key, cells in shown.items():
                    if key not in self.rows:
                        self.add_row(*cells, key=key)
                if selected in shown and self.cursor_key() != selected:
                    self.move_cursor(row=list(shown).index(selected), animate=False)
            if new_cols or [rk.value for rk in self.rows] != list(shown):
                selected = self.cursor_key()
                self.clear(columns=new_cols)
                if new_cols:
                    for k, label in zip(cols, heads):
                        self.add_column(label, key=k)
                    self._shown_cols, self._shown_heads = cols, heads
                for key, cells in shown.items():
                    self.add_row(*cells, key=key)
                if selected in shown:
                    self.move_cursor(row=list(shown).index(selected), animate=False)
                self._narrow(cols, heads, shown, fitted)  # `clear` keeps the columns' widths
                return
            for y, (key, cells) in enumerate(shown.items()):
                if key in unchanged:
                    continue  # the same cells as drawn
                current = self.get_row(key)
                for x, (col, old, new) in enumerate(zip(cols, current, cells)):
                    if old is not new and (str(old) != str(new) or (isinstance(new, Text) and old != new)):
                        if _cell_len(new) > self.columns[ColumnKey(col)].content_width:
                            self.update_cell(key, col, new, update_width=True)  # the columns move
                        else:
                            self._set_cell(key, col, new, Coordinate(y, x))
            self._narrow(cols, heads, shown, fitted)

    def _narrow(self, cols: tuple[str, ...], heads: tuple[str, ...], shown: dict[str, tuple[Any, ...]],
                widths: dict[str, int]) -> None:
        """Give back the width a column no longer needs. DataTable widens a column for a
        wider cell but never narrows one for a row removed or a cell cut shorter: a row
        that went (a process with a long WHY) left its width behind while COMMAND took
        the room it freed, and the table ran past its panel, behind a horizontal
        scrollbar that hid its last row. Asked only when the widths the columns should
        have moved; `update_cell(..., update_width=True)` has DataTable measure the
        column's cells again."""
        want = {k: max(widths[k], cell_len(head)) for k, head in zip(cols, heads)}
        if want == self._widths or not shown:
            return
        self._widths = want
        key, cells = next(iter(shown.items()))
        for x, col in enumerate(cols):
            column = self.columns.get(ColumnKey(col))
            if column is not None and column.content_width > want[col]:
                self.update_cell(key, col, cells[x], update_width=True)

    def _set_cell(self, row_key: str, column_key: str, value: Any, at: Coordinate) -> None:
        """`update_cell` for a cell that fits its column, repainting that cell only.

        `update_cell` repaints the whole table, so a 1 Hz snapshot whose clocks tick
        (ELAPSED, DURATION) or a process's CPU% moved rendered every visible row again;
        here only the changed cells' regions are refreshed (DataTable's own
        `refresh_coordinate`). The update counter is bumped as `update_cell` does: the
        table's row and line caches are keyed by it, so the repainted line is new."""
        self._data[RowKey(row_key)][ColumnKey(column_key)] = value
        self._update_count += 1
        self.refresh_coordinate(at)

    def cursor_key(self) -> str | None:
        """The row key under the cursor; None when the table is empty."""
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:  # noqa: BLE001 - cursor outside the table after rows vanished
            return None


def _cell_key(cell: Any) -> Any:
    """What a cell shows, hashable (`Text` is not: its text, spans and style)."""
    return (cell.plain, tuple(cell.spans), str(cell.style)) if isinstance(cell, Text) else cell


def _what(cell: Any) -> tuple[type, Any]:
    """A cell's identity for the clip memo: its type too (1 == 1.0 == True)."""
    return type(cell), _cell_key(cell)


def _cell_len(cell: Any) -> int:
    return cell.cell_len if isinstance(cell, Text) else cell_len(str(cell))


def _clip(cell: Any, width: int | None, keep_tail: bool) -> Any:
    """A cell cut to `width` cells: the tail of a run id (its unique end), the head of
    a text (with an ellipsis). A str cell becomes plain `Text`: `DataTable` would parse
    it as markup, and cells hold argv, run names and failure notes from the host."""
    if isinstance(cell, str):
        cell = Text(cell)
    if width is None or _cell_len(cell) <= width:
        return cell
    text = cell.plain if isinstance(cell, Text) else str(cell)
    short = text[len(text) - width :] if keep_tail else text[: max(width - 1, 0)] + "…"
    return Text(short, style=cell.style) if isinstance(cell, Text) else short


class ProcessTable(KeyedTable):
    COLUMNS = (
        ("pid", "PID"), ("ppid", "PPID"), ("user", "USER"), ("s", "S"), ("cpu", "CPU%"),
        ("rss", "RSS GiB"), ("gpu", "GPU GiB"), ("started", "STARTED"), ("why", "WHY"),
        ("run", "RUN"), ("cmd", "COMMAND"),
    )
    # Narrow: PPID, USER, WHY, S, STARTED, RSS hide in this order; RUN keeps the id's
    # unique tail; COMMAND takes the rest. PID, CPU% and GPU GiB always stay. STARTED, not
    # an age: an age column moves each second for every young process, and each move
    # repaints its whole table line (most of an idle dashboard's cost).
    DROP = ("ppid", "user", "why", "s", "started", "rss")
    SHRINK = {"run": 11}
    FLEX = "cmd"

    def show(self, state: AppState) -> None:
        procs = sorted(state.processes, key=lambda p: (p.run_id is None, p.node or "", p.pid))
        now = time.time()
        self.sync({f"{p.node}:{p.pid}" if p.node else str(p.pid): self._cells(p, now) for p in procs})
        set_title(self, f"Processes ({len(procs)})" if procs else
                  "Processes (0) · none of a run and none holding GPU memory on this host")

    @staticmethod
    def _cells(p: ProcReading, now: float) -> tuple[Any, ...]:
        cmd = " ".join(p.cmdline) or "N/A"
        return (
            f"{p.node}:{p.pid}" if p.node else p.pid, num(p.ppid, "{}"), p.user or "N/A", p.state or "?",
            num(p.cpu, "{:.0f}"),
            gib(p.rss, 2), gib(p.gpu_mem, 1) if p.gpu_mem is not None else "-",
            clock(p.start_time, now), ",".join(p.why), p.run_id or "-", cmd[:200],
        )


STATE_STYLE = {"running": "bold green", "pending": "cyan", "waiting": "bold yellow", "exited": "", "killed": "yellow",
               "lost": "red", "failed": "bold red"}


class RunsTable(KeyedTable):
    COLUMNS = (
        ("id", "RUN"), ("name", "NAME"), ("state", "STATE"), ("started", "STARTED"),
        ("dur", "DURATION"), ("exit", "EXIT"), ("patch", "PATCH"), ("note", "FAILURE / NOTE"),
    )
    # Narrow: STARTED, PATCH, NAME, DURATION hide in this order (while a failure note
    # needs the room); RUN keeps the id's
    # unique tail (HHMMSS-xxxx); STATE, EXIT and FAILURE / NOTE always stay.
    DROP = ("started", "patch", "name", "dur")
    SHRINK = {"id": 11}
    FLEX = "note"
    FLEX_MIN = 9
    FLEX_WANT = 40  # a failure's title outranks NAME, STARTED, PATCH and DURATION
    SHORT_LABELS = {"note": "FAILURE"}

    def show(self, runs: tuple[RunRecord, ...], notes: dict[str, str] | None = None) -> None:
        notes = notes or {}
        ordered = sorted(runs, key=lambda r: (r.launched_at or 0.0, r.run_id), reverse=True)
        now = time.time()
        day = time.localtime(now)[:3]
        ended = self._ended
        self._ended = {}
        rows = {}
        for r in ordered:
            note = notes.get(r.run_id, "")
            kept = ended.get(r.run_id)
            if kept is not None and kept[0] is r and kept[1:3] == (note, day):
                cells = kept[3]
            else:
                cells = self._cells(r, note, now)
            if not r.alive and r.restart_at is None:  # its row moves only with its record, its note, the day
                self._ended[r.run_id] = (r, note, day, cells)
            rows[r.run_id] = cells
        self.sync(rows)

    _ended: dict[str, tuple[RunRecord, str, Any, tuple[Any, ...]]] = {}  # an ended run's row, as last made

    @staticmethod
    def _cells(r: RunRecord, note: str, now: float) -> tuple[Any, ...]:
        row = run_row(r, note, now)  # the view model's row: the CLI prints the same
        return (
            row.run_id, row.name[:20], Text(row.state, style=STATE_STYLE.get(row.state, "")),
            row.started, row.duration, row.exit, row.patch, row.note,
        )

    def selected_run_id(self) -> str | None:
        return self.cursor_key()

    def select(self, run_id: str) -> None:
        keys = [rk.value for rk in self.rows]
        if run_id in keys:
            self.move_cursor(row=keys.index(run_id), animate=False)
