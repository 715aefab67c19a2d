"""The dashboard of one host: its status, runs, phase, GPUs, processes and log.

`DashboardScreen` renders one `HostFeed` (the host's agent client and `AppState`).
Data flows one way: every event (agent messages, link status, the user's cursor, the
config as re-read, actions started and ended) goes through the pure reducer
(`tui.state.reducer.apply`, via `HostFeed.apply`) into the state; the widgets render
what the view model (`tui.state.view`) makes of it. `connect HOST` shows it as the
app's only screen (it starts the feed itself); the fleet pushes it over a feed that is
already running (`attached`), and `esc` goes back. The keys' actions live in
`DashboardActions` (tui/views/screens/dashboard_actions.py).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import DataTable, Static

from tui import protocol as p
from tui import trace
from tui.protocol.records import RunRecord
from tui.services.hostfeed import HostFeed
from tui.state import history, view
from tui.state.events import AnalyseLog, CursorMoved, Event, LogFollowed, LogOlder, Notice, TailSize
from tui.state.loganalysis import fold
from tui.state.model import AppState
from tui.transport import AgentRequestError, TransportError
from tui.transport import ConfigError as TransportConfigError
from tui.views.driver import NarrowCompositor
from tui.views.readonly import ModeFooter
from tui.views.screens.dashboard_actions import ACTION_KEYS, DashboardActions
from tui.views.widgets.gpus import GpuPanel
from tui.views.widgets.logtail import LogPane, repaint_wait
from tui.views.widgets.progress import RunProgress
from tui.views.widgets.render import set_content, set_title, terminal_write
from tui.views.widgets.status import StatusBar
from tui.views.widgets.tables import ProcessTable, RunsTable

LIVENESS_EVERY = 0.1  # at most this late, the link is shown stale once its last message is too old


class DashboardScreen(DashboardActions, Screen[None]):
    """One host: its run, GPUs, processes and log."""

    # `q` and `?` first: the footer cuts from the right on a narrow terminal.
    BINDINGS = [
        Binding("q", "app.quit", "Quit"),
        Binding("question_mark", "app.help", "Help", key_display="?"),
        *ACTION_KEYS,  # declared with their actions (dashboard_actions.py)
        Binding("enter", "open_log", "Open log", show=False),  # tables keep their own enter
        Binding("escape", "back", "Fleet", show=False),  # only when opened from the fleet
    ]

    def __init__(self, feed: HostFeed, *, launch: bool = False, attached: bool = False) -> None:
        """`attached`: the feed runs already (the fleet's); else this screen starts it."""
        super().__init__()
        self._compositor = NarrowCompositor()  # a moved cell renders only what is under it
        self.feed = feed
        self.attached = attached
        self._launch_on_connect = launch
        self.notifier = feed.notifier(lambda seq: terminal_write(self.app, seq))
        self._notified = feed.state.notice_serial if attached else 0  # last notice shown
        self._stale_shown = False
        self._bindings_shown: tuple[Any, ...] | None = None  # check_action results on the footer
        # What the log's lines call for (None, "progress" or "all"), drawn by one timer
        # once per slot while lines keep coming (`_repaint_soon`, logtail.busy_slot).
        self._due: str | None = None
        self._repaint_timer: Any = None
        self._repainted_at = 0.0
        self._tables_drawn = False  # the first snapshot's tables are drawn at once, never deferred
        self._drawn_at = 0.0  # monotonic time of the last `_render_all`
        self._unlisten: Any = None

    # The host's state lives in its feed; the screen reads it from there.
    @property
    def state(self) -> AppState:
        return self.feed.state

    @property
    def client(self) -> Any:
        return self.feed.client

    @property
    def cfg(self) -> Any:
        return self.feed.cfg

    @cfg.setter
    def cfg(self, cfg: Any) -> None:
        self.feed.cfg = cfg

    # ---- layout -------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        yield Static(id="banner")
        with Horizontal(id="top"):
            with Vertical(id="left"):
                with Vertical(id="runs-box"):
                    yield RunsTable(id="runs")
                with Vertical(id="progress-box"):
                    yield RunProgress(id="progress")
            with VerticalScroll(id="gpu-box"):
                yield GpuPanel(id="gpus")
        yield ProcessTable(id="procs")
        yield LogPane(id="log", pace=self._pace_log)
        yield ModeFooter()

    def on_mount(self) -> None:
        # The widgets, looked up once: timers that fire while the app shuts down find
        # them still (a query would not), and renders skip a DOM query each.
        self._status = self.query_one(StatusBar)
        self._gpus = self.query_one(GpuPanel)
        self._procs = self.query_one(ProcessTable)
        self._runs_table = self.query_one(RunsTable)
        self._progress = self.query_one(RunProgress)
        self._log_pane = self.query_one(LogPane)
        self._banner = self.query_one("#banner", Static)
        set_title(self.query_one("#runs-box"), "Runs")
        set_title(self.query_one("#progress-box"), "Progress")
        set_title(self.query_one("#gpu-box"), "GPUs")
        set_title(self.query_one("#procs"), "Processes")
        trace.mark("dashboard mounted")
        self._unlisten = self.feed.listen(self._on_feed_event)
        for err in fold.signature_errors():
            self.apply(Notice("warning", f"signatures: {err}"))
        if self.attached:  # the fleet's feed is under way: its log so far
            self._log_pane.show(self.state.log)
        self._render_all()
        if not self.attached:  # `connect HOST`: this screen starts its host's feed
            self.connect_agent()
        self.set_interval(1.0, self._each_second)
        self._check_liveness()

    def on_unmount(self) -> None:
        if self._unlisten is not None:
            self._unlisten()

    def action_back(self) -> None:
        """esc: back to the fleet (the host stays connected); not while an action runs,
        whose worker lives on this screen."""
        if not self.attached:
            return
        if self.state.busy is not None:
            self.notify(f"wait: {view.action_text(self.state.busy)}", severity="warning")
            return
        self.app.pop_screen()

    # ---- the agent stream ---------------------------------------------------------
    @work(exclusive=True, group="agent")
    async def connect_agent(self) -> None:
        """Start this screen's own feed (`connect HOST`): a failed connect ends the app
        with its one line and exit code; then the events until the link ends."""
        try:
            await self.feed.connect()
        except (TransportError, AgentRequestError, OSError) as exc:
            setattr(self.app, "fatal_error", str(exc))
            # A config mistake (e.g. the host's Python too old) is exit 2, like the CLI's.
            self.app.exit(return_code=2 if isinstance(exc, TransportConfigError) else 3)
            return
        await self.feed.follow(on_ready=self._connected)

    def _connected(self) -> None:
        if self._launch_on_connect:
            self.start_launch(None)

    def apply(self, event: Event) -> None:
        """The one route: the reducer (the feed), then the widgets (`_on_feed_event`)."""
        self.feed.apply(event)

    def _on_feed_event(self, event: Event) -> None:
        """After each event: the widgets, then any new notifications."""
        if isinstance(event, p.Hello):
            self._stale_shown = False
        with contextlib.suppress(NoMatches):  # events still arriving while the app tears down
            self._render_event(event)
        for serial, severity, text in self.state.notices:
            if serial > self._notified:
                self.notify(text, severity=severity, timeout=10 if severity == "error" else 6)  # type: ignore[arg-type]
        self._notified = self.state.notice_serial
        for ev in self.notifier.send_new(self.state.watch):  # failed, finished, stalled, hung: once each
            self.notify(ev.message, title=f"run {ev.run_id} {ev.kind}", timeout=15,
                        severity="information" if ev.kind in ("finished", "resumed") else "error")

    def _render_event(self, event: Event) -> None:
        if isinstance(event, (p.LogData, p.LogReset, LogFollowed, TailSize, LogOlder)):
            self._log_pane.show(self.state.log)  # drawn with the next frame
            self._repaint_soon("progress")  # the phase follows the log
        elif isinstance(event, AnalyseLog):  # the phase follows; all of it once the backlog is in
            self._repaint_soon("progress" if self.state.log.backlog else "all")
        elif isinstance(event, p.KillProgress):
            self._render_banner()
        elif isinstance(event, p.Snapshot) and self._tables_drawn and self._lines_coming():
            self._repaint_soon("all")  # the tables join the lines' next repaint: one frame, not two
        else:
            self._render_all()

    def _repaint_soon(self, what: str, wait: float | None = None) -> None:
        """Draw `what` ("progress", or "all" the panels) with the next frame, or while
        lines keep coming once per the log pane's slot (`LogPane.slot`): a training log at
        20 lines/s changes the step and loss with every line."""
        self._due = "all" if "all" in (what, self._due) else what
        if self._repaint_timer is None:
            if wait is None:
                wait = repaint_wait(time.monotonic(), self._repainted_at, self._log_pane.slot())
            self._repaint_timer = self.set_timer(wait, self._repaint_due)

    def _pace_log(self, wait: float) -> None:
        """The log pane's throttled lines, drawn by the panels' one repaint timer: with a
        timer of its own, the pane's repaint and the panels' fell into two screen updates
        whenever the two timers fired a few ms apart."""
        self._repaint_soon("progress", wait)

    def _lines_coming(self) -> bool:
        """A repaint is due, or the log is busy (`LogPane.busy`). A snapshot drawn at once
        just after the lines' repaint cost a frame of its own each second (the agent's
        1 Hz snapshots and the lines' slots keep their phase for the whole run); while
        lines keep coming it waits for their next slot instead, at most CALM_S."""
        return self._repaint_timer is not None or self._log_pane.busy(time.monotonic())

    def _repaint_due(self) -> None:
        self._repaint_timer, self._repainted_at = None, time.monotonic()
        with contextlib.suppress(NoMatches):  # the screen is being torn down
            self._log_pane.flush()
            if self._due == "all":
                self._render_all()
            elif self._due == "progress":
                self._render_progress()

    async def _follow_log(self) -> None:
        await self.feed.follow_log()

    # ---- rendering ----------------------------------------------------------------
    def _render_all(self) -> None:
        throttled = self._repaint_timer is not None  # lines keep coming: the progress waits for that repaint
        self._due = "progress" if throttled else None
        st = self.state
        self._tables_drawn = self._tables_drawn or st.snapshot_time is not None
        self._drawn_at = time.monotonic()
        self._status.show(st)
        self._gpus.show(st)
        self._procs.show(st)
        runs_table = self._runs_table
        visible = view.visible_runs(st)
        runs_table.show(visible, view.run_notes(st))
        hidden = len(st.runs) - len(visible)
        set_title(
            self.query_one("#runs-box"),
            f"Runs ({len(visible)}; a: all {len(st.runs)})" if hidden else f"Runs ({len(visible)})"
            + ("" if visible else " · l: launch" if self.cfg.run.command
               else " · none: add a run command to eagle3.toml"),
        )
        chosen = self.selected_run()
        if chosen is not None and runs_table.selected_run_id() != chosen.run_id:
            runs_table.select(chosen.run_id)  # the cursor shows the run actions apply to
        set_title(self.query_one("#gpu-box"), f"GPUs ({len(st.gpus)}, {st.gpu_source})" if st.gpus else "GPUs")
        if not throttled:
            self._render_progress()
        self._render_banner()
        self._refresh_bindings()  # kill/relaunch availability follows the runs
        if st.seq >= 0:
            trace.mark("snapshot drawn")

    def _refresh_bindings(self) -> None:
        """Rebuild the footer only when a key's availability changed: a rebuild
        recomposes the whole footer."""
        shown = (len(self.app.screen_stack), *(self.check_action(a, ()) for a in self.DASHBOARD_ACTIONS))
        if shown != self._bindings_shown:
            self._bindings_shown = shown
            self.refresh_bindings()

    def _render_progress(self) -> None:
        if self._due == "progress":
            self._due = None
        run, st = self.selected_run(), self.state
        phase = self._phase(run)
        shown = view.analysis_of(st, run)  # None: the previous run's log, still followed
        if shown is not st.log.analysis:  # or, while the analysis catches up, the newest lines'
            st = replace(st, log=replace(st.log, analysis=shown))
        shards = list((getattr(st.log.analysis, "shards", None) or {}).values())
        now = st.snapshot_time or time.time()  # the host's clock, as the run's launch time is
        self._progress.show(st, phase, view.progress_label(run), history.load_line(run, shards, phase, now))

    def _phase(self, run: RunRecord | None) -> str | None:
        return view.phase(self.state, run, time.time())

    def _render_banner(self) -> None:
        banner = self._banner
        text, kind = view.banner(self.state, time.time(), self.cfg.patches.set)
        banner.set_class(text is not None, "shown")
        banner.set_class(kind == "error", "error")
        banner.set_class(kind == "ok", "ok")
        set_content(banner, text or "")

    def _each_second(self) -> None:
        """The ages on screen ("stale for N s", a kill's verdict expiring), unless a
        snapshot drew them within the last second: with the link alive at the default
        interval that is every second, and the tick only did it again."""
        if time.monotonic() - self._drawn_at >= 1.0:
            self._tick()

    def _tick(self) -> None:
        self._status.show(self.state)
        self._render_banner()  # ages: "stale for N s", a finished kill's verdict expiring

    def _check_liveness(self) -> None:
        """Repaint as soon as the agent's last message is older than two intervals + 1 s.

        Checked when that moment comes (then again at the next one: messages keep moving
        it), not ten times a second: an idle dashboard's timer wake-ups cost more than
        the comparison."""
        now = time.time()
        stale = view.link_text(self.state, now)[0].startswith("stale")
        if stale != self._stale_shown and self.app.is_running:
            self._stale_shown = stale
            with contextlib.suppress(NoMatches):  # the screen is being torn down
                self._tick()
        last = self.state.link.last_data
        due = None if last is None else last + view.stale_after(self.state) - now
        wait = due + LIVENESS_EVERY / 2 if due is not None and due > 0 else 1.0  # stale, or no data: the tick's pace
        self.set_timer(max(LIVENESS_EVERY, wait), self._check_liveness)

    def _run_notes(self) -> dict[str, str]:
        return view.run_notes(self.state)

    # ---- selection ----------------------------------------------------------------
    def selected_run(self) -> RunRecord | None:
        """The run actions apply to: `view.select_run`, the rule the CLI uses too."""
        return view.select_run(self.state)

    def _visible_runs(self) -> tuple[RunRecord, ...]:
        return view.visible_runs(self.state)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if isinstance(event.data_table, RunsTable) and event.row_key is not None:
            if event.row_key.value != event.data_table.selected_run_id():
                return  # a stale highlight from a table rebuild, not the user's choice
            chosen = self.selected_run()
            if chosen is not None and event.row_key.value == chosen.run_id:
                return  # the cursor follows the rule's choice: not a choice of the user's
            self.apply(CursorMoved(event.row_key.value))
            self.run_worker(self._follow_log(), group="follow")
