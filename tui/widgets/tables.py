"""Process and run tables, updated by row key: only changed cells are touched,
inside one batch, so a 1 Hz snapshot never flickers or loses the cursor."""

from __future__ import annotations

import time
from typing import Any, Sequence

from rich.text import Text
from textual.widgets import DataTable

from tui.format import duration, gib, num
from tui.state.model import AppState, Proc, Run
from tui.state.view import run_row


class KeyedTable(DataTable):
    """A DataTable kept in sync with a dict of row key -> cells."""

    COLUMNS: Sequence[tuple[str, str]] = ()  # (key, label)

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for key, label in self.COLUMNS:
            self.add_column(label, key=key)

    def sync(self, rows: dict[str, tuple[Any, ...]]) -> None:
        """Show `rows` in their given order. Cells update in place; only a change in
        which rows exist rebuilds the table (keeping the cursor on the same row)."""
        keys = [k for k, _ in self.COLUMNS]
        with self.app.batch_update():
            if [rk.value for rk in self.rows] != list(rows):
                selected = self._cursor_key()
                self.clear()
                for key, cells in rows.items():
                    self.add_row(*cells, key=key)
                if selected in rows:
                    self.move_cursor(row=list(rows).index(selected), animate=False)
                return
            for key, cells in rows.items():
                current = self.get_row(key)
                for col, old, new in zip(keys, current, cells):
                    if str(old) != str(new):
                        self.update_cell(key, col, new)

    def _cursor_key(self) -> str | None:
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:  # noqa: BLE001 - cursor outside the table after rows vanished
            return None


class ProcessTable(KeyedTable):
    COLUMNS = (
        ("pid", "PID"), ("ppid", "PPID"), ("user", "USER"), ("s", "S"), ("cpu", "CPU%"),
        ("rss", "RSS GiB"), ("gpu", "GPU GiB"), ("elapsed", "ELAPSED"), ("why", "WHY"),
        ("run", "RUN"), ("cmd", "COMMAND"),
    )

    def show(self, state: AppState) -> None:
        procs = sorted(state.processes, key=lambda p: (p.run_id is None, p.pid))
        self.sync({str(p.pid): self._cells(p) for p in procs})
        self.border_title = f"Processes ({len(procs)})"

    @staticmethod
    def _cells(p: Proc) -> tuple[Any, ...]:
        cmd = " ".join(p.cmdline) or "N/A"
        return (
            p.pid, num(p.ppid, "{}"), p.user or "N/A", p.state or "?", num(p.cpu, "{:.0f}"),
            gib(p.rss, 2), gib(p.gpu_mem, 1) if p.gpu_mem is not None else "-",
            duration(p.elapsed), ",".join(p.why), p.run_id or "-", cmd[:200],
        )


STATE_STYLE = {"running": "bold green", "exited": "", "killed": "yellow", "lost": "red", "failed": "bold red"}


class RunsTable(KeyedTable):
    COLUMNS = (
        ("id", "RUN"), ("name", "NAME"), ("state", "STATE"), ("started", "STARTED"),
        ("dur", "DURATION"), ("exit", "EXIT"), ("patch", "PATCH"), ("note", "FAILURE / NOTE"),
    )

    def show(self, runs: tuple[Run, ...], notes: dict[str, str] | None = None) -> None:
        notes = notes or {}
        ordered = sorted(runs, key=lambda r: (r.launched_at or 0.0, r.run_id), reverse=True)
        self.sync({r.run_id: self._cells(r, notes.get(r.run_id, "")) for r in ordered})

    @staticmethod
    def _cells(r: Run, note: str) -> tuple[Any, ...]:
        row = run_row(r, note, time.time())  # the view model's row: the CLI prints the same
        return (
            row.run_id, row.name[:20], Text(row.state, style=STATE_STYLE.get(row.state, "")),
            row.started, row.duration, row.exit, row.patch, row.note[:60],
        )

    def selected_run_id(self) -> str | None:
        return self._cursor_key()

    def select(self, run_id: str) -> None:
        keys = [rk.value for rk in self.rows]
        if run_id in keys:
            self.move_cursor(row=keys.index(run_id), animate=False)
