"""The fleet: one row per host, its link, GPUs, memory, runs, failures and stalls.

Every host has its own `HostFeed`, started here with at most `limit` connections in
flight (one `asyncio.Semaphore`), so a slow, refusing or unknown-key host holds one
slot and shows its own one-line error while the others fill in. `enter` opens the
host under the cursor in its dashboard (the same feed: no second connection), `esc`
comes back (the host stays connected: its row is live; every host's agent is closed
when the app ends, `EagleApp.on_unmount`); `s` cycles the sort column, `g` turns grouping by state (failed first)
off and on, `/` filters by host name, state or run (enter keeps the filter, esc
clears it). The line at the top sums the fleet up. Rows come from `tui.state.fleet`.

A big fleet costs the client per event: hosts' events are gathered into one repaint
per `fleet.repaint_period` (0.1 s up to 10 hosts, 2 s past 100), a host's cells are
rebuilt only when its row changed, and the host opened with enter gets the
dashboard's `[host] interval` while it is on screen (the fleet's own is slower).
The hosts' logs (read and analysed for each row's failure cause) wait until every
row has its first snapshot, or until no row has filled in for LOG_STALL_S (the hosts
left are slow to answer), or until the host is opened: at 256 hosts their reading and
analysis competed with the connects for the client's CPU. The repaint that shows the
last first snapshot comes at once, not after the gathering period.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import DataTable, Input, Static

from tui import protocol as p
from tui.protocol.hosttext import clean
from tui.services.hostfeed import RETRY_S, HostFeed
from tui.state import fleet
from tui.state.events import Event
from tui.views.driver import NarrowCompositor
from tui.views.readonly import ModeFooter
from tui.views.widgets.render import set_content, terminal_write
from tui.views.widgets.tables import KeyedTable

FLEET_TAIL_BYTES = 256 * 1024  # each host's log tail at first (a dashboard alone reads 4 MiB)
LOG_STALL_S = 2.0  # rows filled, then none for this long: the hosts' logs wait no more
LINK_STYLE = {"ok": "green", "connecting": "dim", "stale": "yellow", "lost": "bold red", "error": "red"}


class FleetTable(KeyedTable):
    COLUMNS = (("host", "HOST"), ("link", "LINK"), ("gpus", "GPUS"), ("mem", "MEM GiB"),
               ("runs", "RUNS"), ("run", "RUN"), ("fail", "FAILURES / STALLS"))
    DROP = ("runs",)  # below ~100 columns; LINK (an error's text) takes what is left
    FLEX = "link"
    FLEX_MIN = 16
    FLEX_WANT = 16
    SHORT_LABELS = {"fail": "FAILURES"}
    ORDERED = True  # a sort changes the order alone


class FleetScreen(Screen[None]):
    """Every host of the fleet, one row each: enter opens its dashboard, s sorts."""

    # `q` and `?` first, as on the dashboard; enter is the table's own (RowSelected).
    BINDINGS = [
        Binding("q", "app.quit", "Quit"),
        Binding("question_mark", "app.help", "Help", key_display="?"),
        Binding("enter", "open_host", "Open host"),
        Binding("s", "sort", "Sort"),
        Binding("g", "group", "Group"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def __init__(self, feeds: dict[str, HostFeed], limit: int, host_interval: float | None = None) -> None:
        """`host_interval`: the snapshot interval of the host opened from the fleet (the
        dashboard's), None to keep the fleet's."""
        super().__init__()
        self._compositor = NarrowCompositor()  # a moved cell renders only what is under it
        self.feeds = feeds
        self.limit = limit
        self.host_interval = host_interval
        self.repaint_s = fleet.repaint_period(len(feeds))
        self._opened: tuple[HostFeed, float] | None = None  # the host in its dashboard, its fleet interval
        self._cells_of: dict[str, tuple[fleet.HostRow, tuple[Any, ...]]] = {}
        self.sort_key = "host"
        self.group = True  # failed, unreachable, stalled, running, idle, connecting
        self.filter_text = ""
        self.all_rows: list[fleet.HostRow] = []  # every host, before the filter
        self.rows: list[fleet.HostRow] = []
        self.first_full_frame: float | None = None  # monotonic time every row was settled
        self.frames = 0
        self._due: Timer | None = None  # the gathered repaint on its way
        self.logs_released = False  # every host's log followed (see LOG_STALL_S)
        self._filled = (0, time.monotonic())  # rows with their first snapshot or error, since when
        self._shown: set[str] = set()  # hosts whose first snapshot came

    def compose(self) -> ComposeResult:
        yield Static(id="fleet-title")
        yield Input(placeholder="filter: host, state or run (enter keeps it, esc clears it)", id="fleet-filter")
        yield FleetTable(id="fleet")
        yield ModeFooter()

    DEFAULT_CSS = """
    FleetScreen #fleet-filter { display: none; height: 1; border: none; padding: 0 1; }
    FleetScreen #fleet-filter.shown { display: block; }
    """

    def on_mount(self) -> None:
        gate = asyncio.Semaphore(self.limit)
        for feed in self.feeds.values():
            feed.log_held = True  # until every row has its first snapshot: _release_logs
            feed.listen(functools.partial(self._changed, feed))
            self.run_worker(feed.run(gate, RETRY_S), group="feeds", exit_on_error=False)
        box = self.query_one("#fleet-filter", Input)
        box.can_focus = False  # until `/`: the rows take the keys
        self.query_one(FleetTable).focus()
        self._repaint()
        self.set_interval(max(1.0, self.repaint_s), self._tick)  # ages: "stale for N s"
        self._log_timer = self.set_interval(0.5, self._check_logs)

    def _filled_rows(self) -> int:
        """Hosts with their first snapshot, or whose connect failed."""
        return sum(1 for f in self.feeds.values() if f.state.seq >= 0 or f.error is not None)

    def _check_logs(self) -> None:
        """Rows filled in, then none for LOG_STALL_S: the hosts left are slow (a connect
        that hangs until its timeout), and hold no other host's log."""
        n, since = self._filled
        filled = self._filled_rows()
        if filled > n:
            self._filled = (filled, time.monotonic())
        elif filled and time.monotonic() - since >= LOG_STALL_S:
            self._release_logs()

    def _release_logs(self) -> None:
        """Every host follows its log from now on."""
        if self.logs_released:
            return
        self.logs_released = True
        self._log_timer.stop()
        for feed in self.feeds.values():
            self.run_worker(feed.release_log(), group="logs", exit_on_error=False)

    def _changed(self, feed: HostFeed, event: Event) -> None:
        # any host's failed, finished, stalled or hung run: told once, whatever is on screen
        for ev in feed.notifier(lambda seq: terminal_write(self.app, seq)).send_new(feed.state.watch):
            self.notify(ev.message, title=f"{fleet.host_text(feed.target)}: run {ev.run_id} {ev.kind}", timeout=15,
                        markup=False,
                        severity="information" if ev.kind in ("finished", "resumed") else "error")
        if self.first_full_frame is None and isinstance(event, p.Snapshot) and feed.target not in self._shown:
            self._shown.add(feed.target)  # a host's first snapshot; the last one's frame is drawn now
            if self._filled_rows() == len(self.feeds):
                self._repaint()
                return
        if self._due is None:  # one repaint for a burst of events from many hosts
            self._due = self.set_timer(self.repaint_s, self._repaint_due)

    def _tick(self) -> None:
        if self._due is None:  # else the hosts' own repaint is on its way
            self._repaint()

    def _repaint_due(self) -> None:
        self._due = None
        self._repaint()

    def _repaint(self) -> None:
        if self._due is not None:  # drawn now (a key, the full frame): the gathered one is not needed
            self._due.stop()  # else each such repaint started one more gathering for good
            self._due = None
        now = time.time()
        rows = [fleet.host_row(h, f.state, now, f.error, f.retry_at) for h, f in self.feeds.items()]
        self.all_rows = rows
        self.rows = fleet.arrange(rows, self.sort_key, self.group, self.filter_text)
        table = self.query_one(FleetTable)
        table.sync({r.host: self._cached_cells(r) for r in self.rows})
        how = f"sorted by {self.sort_key} (s)" + (", grouped by state (g)" if self.group else "")
        if self.filter_text.strip():
            how = f"{len(self.rows)} shown of filter {self.filter_text.strip()!r} (/) · " + how
        set_content(self.query_one("#fleet-title", Static), f" fleet: {fleet.summary(rows)} · {how}")
        self.frames += 1
        settled = all(r.link == "error" or (r.link != "connecting" and r.gpus_total is not None) for r in rows)
        if self.first_full_frame is None and settled:  # every host shown with its first snapshot
            self.first_full_frame = time.monotonic()
            self._release_logs()

    def _cached_cells(self, row: fleet.HostRow) -> tuple[Any, ...]:
        """The row's cells, built again only when the row changed."""
        cached = self._cells_of.get(row.host)
        if cached is not None and cached[0] == row:
            return cached[1]
        cells = self._cells(row)
        self._cells_of[row.host] = (row, cells)
        return cells

    @staticmethod
    def _cells(row: fleet.HostRow) -> tuple[Any, ...]:
        host, link, gpus, mem, runs, run, fail = fleet.cells(row)
        return (Text(host), Text(link, style=LINK_STYLE.get(row.link, "")), Text(gpus), Text(mem), Text(runs),
                Text(run),
                Text(fail, style="bold red" if fail else ""))

    def selected_host(self) -> str | None:
        return self.query_one(FleetTable).cursor_key()

    def action_sort(self) -> None:
        self.sort_key = fleet.next_sort(self.sort_key)
        self._repaint()

    def action_group(self) -> None:
        self.group = not self.group
        self._repaint()

    def action_filter(self) -> None:
        """`/`: the filter line, focused; each key narrows the rows at once."""
        box = self.query_one("#fleet-filter", Input)
        box.add_class("shown")
        box.can_focus = True
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.filter_text = event.value
        self._repaint()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """enter: keep the filter, back to the rows (hidden when it is empty)."""
        event.stop()
        if not event.value.strip():
            event.input.remove_class("shown")
            event.input.can_focus = False
        self.query_one(FleetTable).focus()

    def action_clear_filter(self) -> None:
        """esc: the filter cleared and hidden, every host shown again."""
        box = self.query_one("#fleet-filter", Input)
        box.value = ""
        self.filter_text = ""
        box.remove_class("shown")
        box.can_focus = False
        self.query_one(FleetTable).focus()
        self._repaint()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """enter on the table (the focused widget takes the key before the screen)."""
        event.stop()
        self.action_open_host(event.row_key.value)

    def action_open_host(self, host: str | None = None) -> None:
        from tui.views.screens.dashboard import DashboardScreen

        host = host or self.selected_host()
        feed = self.feeds.get(host or "")
        if feed is None:
            return
        if feed.error is not None:
            self.notify(f"{fleet.host_text(feed.target)}: {clean(feed.error, newline=False)}", severity="error",
                        markup=False)
            return
        if not feed.started:
            self.notify(f"{fleet.host_text(feed.target)}: still connecting", severity="warning", markup=False)
            return
        if feed.log_held:  # its log at once, the others' still wait for the first full frame
            self.run_worker(feed.release_log(), group="logs", exit_on_error=False)
        if self.host_interval is not None:  # the host on screen at the dashboard's pace
            self._opened = (feed, feed.cfg.host.interval)
            self.run_worker(feed.set_interval(self.host_interval), group="interval")
        self.app.push_screen(DashboardScreen(feed, attached=True))

    def on_screen_resume(self) -> None:
        """Back from a host's dashboard: that host at the fleet's pace again."""
        opened, self._opened = self._opened, None
        if opened is not None:
            self.run_worker(opened[0].set_interval(opened[1]), group="interval")
