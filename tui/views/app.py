"""The dashboard: one screen for one host and its run.

Data flows one way: every event (agent messages, link status, the user's cursor, the
config as re-read, actions started and ended) goes through the pure reducer
(`tui.state.reducer.apply`) into `AppState`; the widgets render what the view model
(`tui.state.view`) makes of it. The run an action applies to is chosen by
`view.select_run`, the same rule the CLI uses. Actions (kill, launch, relaunch) call
`tui.services`, the same code the CLI subcommands run, and live in the state under
an id until their outcome is known (asked again after a reconnect when the reply was
lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Iterable

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from tui import protocol as p
from tui.services import actions as services
from tui.services import ledger, notify
from tui.services.config import Config
from tui.state import logparse, view
from tui.state.logindex import RootCause
from tui.state.model import AppState, Run
from tui.state.reducer import (
    ActionEnded,
    ActionStarted,
    ActionUnconfirmed,
    ConfigRead,
    CursorMoved,
    LedgerRead,
    LogFollowed,
    Notice,
    ShowAll,
    apply,
)
from tui.state.watch import WatchState
from tui.transport import AgentClient, AgentRequestError, LinkLost, TransportError
from tui.transport import ConfigError as TransportConfigError
from tui.views.screens.confirm import ConfirmScreen
from tui.views.screens.help import HelpScreen
from tui.views.screens.logviewer import LogViewerScreen
from tui.views.widgets.gpus import GpuPanel
from tui.views.widgets.logtail import BUSY_S, LogPane
from tui.views.widgets.progress import RunProgress
from tui.views.widgets.render import set_content, set_title
from tui.views.widgets.status import StatusBar
from tui.views.widgets.tables import ProcessTable, RunsTable

TAIL_BYTES = 4 * 1024 * 1024  # a new subscription starts this far from the end of the log
LEDGER_EVERY = 30.0  # seconds between refreshes of past runs' summaries and the patch probe
LIVENESS_EVERY = 0.1  # seconds between checks of how old the agent's last message is (a float compare)


class EagleApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "eagle3-tui"
    # `q` and `?` first: the footer cuts from the right on a narrow terminal.
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("k", "kill", "Kill run"),
        Binding("r", "relaunch", "Relaunch"),
        Binding("l", "launch", "Launch"),
        Binding("p", "patches", "Patches"),
        Binding("L", "open_log", "Log viewer"),
        Binding("enter", "open_log", "Open log", show=False),  # tables keep their own enter
        Binding("a", "all_runs", "All runs", show=False),
    ]
    # Screen classes for app.tcss: below 120 columns the GPU cards narrow; below 30 rows
    # the Processes panel gives its rows to the runs, the phase and the log.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]

    def __init__(self, client: AgentClient, cfg: Config, target: str, launch: bool = False) -> None:
        super().__init__()
        self._launch_on_connect = launch
        self.client = client
        self.cfg = cfg  # this session's config; [run] is re-read from its file on l and r
        self.state = apply(AppState(target=target, watch=WatchState(config=cfg.watch)),
                           ConfigRead(services.settings_of(cfg)), time.time())
        self._notifier = notify.Notifier(cfg.notify.command, host=target, write=self._terminal_write)
        self.fatal_error: str | None = None
        self._log_subs = 0  # each followed log gets a fresh subscription name
        self._follow_lock = asyncio.Lock()
        self._ledger_at = float("-inf")
        self._notified = 0  # serial of the last state notice shown as a notification
        self._stale_shown = False
        self._bindings_shown: tuple[Any, ...] | None = None  # check_action results on the footer
        self._progress_due = False  # a progress repaint is scheduled for the next frame

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
        yield LogPane(id="log")
        yield Footer()

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
        for err in logparse.signature_errors():
            self._apply(Notice("warning", f"signatures: {err}"))
        self._render_all()
        self.connect_agent()
        self.set_interval(1.0, self._tick)
        self.set_interval(LIVENESS_EVERY, self._check_liveness)

    # ---- the agent stream ---------------------------------------------------------
    @work(exclusive=True, group="agent")
    async def connect_agent(self) -> None:
        try:
            hello = await self.client.start()
            self._apply(hello)
            await services.configure(self.client, self.cfg)
        except (TransportError, AgentRequestError) as exc:
            self.fatal_error = str(exc)
            # A config mistake (e.g. the host's Python too old) is exit 2, like the CLI's.
            self.exit(return_code=2 if isinstance(exc, TransportConfigError) else 3)
            return
        for warning in self.cfg.warnings:
            self._apply(Notice("warning", warning))
        notice = getattr(getattr(self.client, "link", None), "notice", None)
        if notice:  # said once, e.g. that the host has no SFTP and the agent came over exec
            self._apply(Notice("information", notice))
        await self._follow_log()
        if self._launch_on_connect:
            self._launch_worker(None)
        async for event in self.client.events():
            self._apply(event)
            if isinstance(event, p.Hello):
                self._stale_shown = False
            if isinstance(event, p.Snapshot):
                await self._follow_log()
                if time.monotonic() - self._ledger_at > LEDGER_EVERY:
                    self._ledger_at = time.monotonic()
                    self._refresh_ledger()

    @work(exclusive=True, group="ledger")
    async def _refresh_ledger(self) -> None:
        """Summaries of ended runs (cached; one read each) and the host's applied patch."""
        summaries = await ledger.fetch_summaries(self.client, self.state.runs)
        applied, order = None, self.state.version_order
        if self.cfg.patches.set:
            from tui.services import patches as patch_service
            from tui.state import patches as patchsets

            try:
                st = await patch_service.status(self.client, self.cfg.patches.set, self.cfg.host.python)
                applied = st.get("version") or st.get("state")
                order = tuple(v.name for v in patchsets.load_set(self.cfg.patches.set).versions)
            except Exception:  # noqa: BLE001 - advice is optional; no probe, no stale warning
                applied = None
        self._apply(LedgerRead(summaries, applied, tuple(order)))

    def _apply(self, event: Any) -> None:
        """The one route: the reducer, then the widgets, then any new notifications."""
        self.state = apply(self.state, event, time.time())
        with contextlib.suppress(NoMatches):  # events still arriving while the app tears down
            self._render(event)
        for serial, severity, text in self.state.notices:
            if serial > self._notified:
                self.notify(text, severity=severity, timeout=10 if severity == "error" else 6)  # type: ignore[arg-type]
        self._notified = self.state.notice_serial
        for ev in self._notifier.send_new(self.state.watch):  # failed, finished, stalled, hung: once each
            self.notify(ev.message, title=f"run {ev.run_id} {ev.kind}", timeout=15,
                        severity="information" if ev.kind in ("finished", "resumed") else "error")

    def _render(self, event: Any) -> None:
        if isinstance(event, (p.LogData, p.LogReset, LogFollowed)):
            self._log_pane.show(self.state.log)  # drawn with the next frame
            if not self._progress_due:  # the phase follows the log, once per frame too
                self._progress_due = True
                self.set_timer(BUSY_S, self._render_progress)
        elif isinstance(event, p.KillProgress):
            self._render_banner()
        else:
            self._render_all()

    async def _follow_log(self) -> None:
        """Subscribe to the selected run's log (`view.wanted_log`) when it changed.

        Serialised by a lock, never cancelled half-way, so the agent's subscription and
        `state.log` always agree; chunks of the previous log still in flight carry the
        old subscription name and are dropped by the reducer."""
        async with self._follow_lock:
            path, note = view.wanted_log(self.state)
            log = self.state.log
            if path == log.path and (path is None or log.sub is not None) and (path is not None or log.note == note):
                return
            old = log.sub
            if path is None:
                self._apply(LogFollowed(None, None, note))
                if old is not None:
                    await self._request("unsubscribe", sub=old)
                return
            self._log_subs += 1
            sub = f"log{self._log_subs}"
            self._apply(LogFollowed(path, sub))
            if old is not None:
                await self._request("unsubscribe", sub=old)
            ok = await self._request("subscribe", sub=sub, path=path, offset=-TAIL_BYTES, inode=None)
            if ok is None and self.state.log.sub == sub:
                self._apply(LogFollowed(path, None, f"cannot follow {path}"))  # tried again next snapshot

    async def _request(self, op: str, **args: Any) -> dict[str, Any] | None:
        try:
            return await self.client.request(op, **args)
        except (AgentRequestError, TransportError) as exc:
            self.notify(f"{op}: {exc}", severity="error", timeout=8)
            return None

    # ---- rendering ----------------------------------------------------------------
    def _render_all(self) -> None:
        st = self.state
        self._status.show(st)
        self._gpus.show(st)
        self._procs.show(st)
        runs_table = self._runs_table
        visible = view.visible_runs(st)
        runs_table.show(visible, view.run_notes(st))
        hidden = len(st.runs) - len(visible)
        set_title(
            self.query_one("#runs-box"),
            f"Runs ({len(visible)}; a: all {len(st.runs)})" if hidden else f"Runs ({len(visible)})",
        )
        chosen = self._run()
        if chosen is not None and runs_table.selected_run_id() != chosen.run_id:
            runs_table.select(chosen.run_id)  # the cursor shows the run actions apply to
        set_title(self.query_one("#gpu-box"), f"GPUs ({len(st.gpus)}, {st.gpu_source})" if st.gpus else "GPUs")
        self._render_progress()
        self._render_banner()
        self._refresh_bindings()  # kill/relaunch availability follows the runs

    def _refresh_bindings(self) -> None:
        """Rebuild the footer only when a key's availability changed: a rebuild
        recomposes the whole footer."""
        shown = (len(self.screen_stack), *(self.check_action(a, ()) for a in self.DASHBOARD_ACTIONS))
        if shown != self._bindings_shown:
            self._bindings_shown = shown
            self.refresh_bindings()

    def _render_progress(self) -> None:
        self._progress_due = False
        run = self._run()
        self._progress.show(self.state, self._phase(run), view.progress_label(run))

    def _phase(self, run: Run | None) -> str | None:
        return view.phase(self.state, run, time.time())

    def _terminal_write(self, seq: str) -> None:
        """Bell and desktop-notification escapes, through Textual's own writer."""
        if not self.is_headless and self._driver is not None:
            self._driver.write(seq)

    def _render_banner(self) -> None:
        banner = self._banner
        text, kind = view.banner(self.state, time.time(), self.cfg.patches.set)
        banner.set_class(text is not None, "shown")
        banner.set_class(kind == "error", "error")
        banner.set_class(kind == "ok", "ok")
        set_content(banner, text or "")

    def _tick(self) -> None:
        self._status.show(self.state)
        self._render_banner()  # ages: "stale for N s", a finished kill's verdict expiring

    def _check_liveness(self) -> None:
        """Repaint as soon as the agent's last message is older than two intervals + 1 s."""
        stale = view.link_text(self.state, time.time())[0].startswith("stale")
        if stale != self._stale_shown and self.is_running:
            self._stale_shown = stale
            with contextlib.suppress(NoMatches):  # the screen is being torn down
                self._tick()

    def _run_notes(self) -> dict[str, str]:
        return view.run_notes(self.state)

    # ---- selection ----------------------------------------------------------------
    def _run(self) -> Run | None:
        """The run actions apply to: `view.select_run`, the rule the CLI uses too."""
        return view.select_run(self.state)

    def _visible_runs(self) -> tuple[Run, ...]:
        return view.visible_runs(self.state)

    def action_all_runs(self) -> None:
        self._apply(ShowAll(not self.state.show_all))
        self.notify("showing every run on the host" if self.state.show_all else f"showing runs of {self.cfg.run.name!r}")

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if isinstance(event.data_table, RunsTable) and event.row_key is not None:
            if event.row_key.value != event.data_table.selected_run_id():
                return  # a stale highlight from a table rebuild, not the user's choice
            chosen = self._run()
            if chosen is not None and event.row_key.value == chosen.run_id:
                return  # the cursor follows the rule's choice: not a choice of the user's
            self._apply(CursorMoved(event.row_key.value))
            self.run_worker(self._follow_log(), group="follow")

    # ---- actions --------------------------------------------------------------------
    DASHBOARD_ACTIONS = ("kill", "relaunch", "launch", "patches", "open_log", "all_runs")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """True: enabled; None: shown dimmed (does not apply now); False: hidden.

        Keys that would only explain why they do nothing (k on an ended run, l while a
        kill runs) stay enabled, so the key answers with a notification."""
        if action in self.DASHBOARD_ACTIONS and len(self.screen_stack) > 1:
            return False  # another screen is on top: its keys, never the dashboard's
        if action == "patches":
            return True if self.cfg.patches.set else None
        if action == "open_log":
            return True if self.state.log.path is not None else None
        return True

    def _refuse_if_busy(self) -> bool:
        busy = self.state.busy
        if busy is not None:
            self.notify(f"wait: {view.action_text(busy)}", severity="warning")
            return True
        return False

    def action_kill(self) -> None:
        if self._refuse_if_busy():
            return
        run = self._run()
        if run is None:
            self.notify("no run to kill", severity="warning")
            return
        if not run.alive:
            self.notify(view.already_ended(run) + ": nothing to kill", severity="warning")
            return

        def decided(yes: bool | None) -> None:
            if yes:
                self._kill_worker(run.run_id, None)

        self.push_screen(ConfirmScreen(f"Kill run {run.run_id}?", self._kill_lines(run)), decided)

    def _kill_lines(self, run: Run) -> list[str]:
        return view.kill_confirm_lines(self.state, run, self.cfg.run.graces)

    def action_relaunch(self) -> None:
        if self._refuse_if_busy() or not self._reread_config():
            return
        run = self._run()
        argv, cwd = (run.argv, run.cwd) if run is not None and not run.external else (self.cfg.run.command, self.cfg.run.cwd)
        if run is None and not self.cfg.run.command:
            self.notify("no run to relaunch and no [run] command in the config", severity="warning")
            return
        what = [f"launches: {view.clip(' '.join(argv), 70)}", f"in:       {cwd}"]
        if run is not None and run.external:
            what.insert(0, "An adopted run has no manifest: the config's [run] command is launched instead.")
        if run is not None and run.alive:
            lines = self._kill_lines(run) + ["", "It is still running: kill it first, then:", *what]

            def decided(yes: bool | None) -> None:
                if yes:
                    self._kill_worker(run.run_id, run)

            self.push_screen(ConfirmScreen(f"Kill and relaunch run {run.run_id}?", lines, "Kill + relaunch"), decided)
            return

        def go(yes: bool | None) -> None:
            if yes:
                self._launch_worker(run)

        title = f"Relaunch run {run.run_id}?" if run is not None else "Launch the config's run?"
        self.push_screen(ConfirmScreen(title, [f"host:     {self.state.hostname or self.state.target}", *what], "Relaunch"), go)

    def action_launch(self) -> None:
        if not self._refuse_if_busy():
            self._launch_worker(None)

    def _reread_config(self) -> bool:
        """eagle3.toml again (its [run] and [patches]); a broken file is one line in the
        banner and nothing launches."""
        cfg, error = services.reread_config(self.cfg)
        self._apply(ConfigRead(services.settings_of(cfg, error)))
        if error is None:
            self.cfg = cfg
        return error is None

    def action_patches(self) -> None:
        """Open the patch screen for `[patches] set`; relaunch when it asks to."""
        from tui.views.screens.patches import RELAUNCH, PatchScreen

        if not self.cfg.patches.set:
            self.notify("no [patches] set in eagle3.toml", severity="warning")
            return

        def done(result: str | None) -> None:
            self._ledger_at = float("-inf")  # re-read the applied patch on the next snapshot
            if result == RELAUNCH:
                self.action_relaunch()

        host = self.state.hostname or self.state.target
        screen = PatchScreen(
            self.client, self.cfg.patches.set, self.cfg.host.python, host,
            can_relaunch=lambda: self._run() is not None or bool(self.cfg.run.command),
        )
        self.push_screen(screen, done)

    def action_open_log(self) -> None:
        """Full-screen viewer of the followed log: search, filter, errors, root cause."""
        log = self.state.log
        if log.path is None:
            self.notify(log.note or "no log to open", severity="warning")
            return
        self.push_screen(
            LogViewerScreen(client=self.client, path=log.path, root_cause=RootCause.from_log(log), follow=True)
        )

    def action_help(self) -> None:
        """The help of the screen `?` was pressed on (each screen declares its keys)."""
        self.push_screen(HelpScreen.for_screen(self.screen, self))

    def track_push(self, goal: str) -> Any:
        """A patch push (or rollback) as an action of the state; returns `end(ok, error)`."""
        aid = services.new_action_id()
        self._apply(ActionStarted(aid, "push", None))

        def end(ok: bool, error: str | None = None, unknown: bool = False) -> None:
            self._apply(ActionEnded(aid, ok, {"version": goal, "unknown": unknown}, error))

        return end

    async def _settle(self, action_id: str, call: Any) -> dict[str, Any] | None:
        """Run an action's request; its outcome goes through the reducer. When the link
        drops before the reply, the outcome is asked of the host after the reconnect,
        so a kill that succeeded never ends shown as failed, nor the reverse."""
        try:
            result = await call
        except LinkLost as exc:
            self._apply(ActionUnconfirmed(action_id, str(exc)))
            rec = await services.outcome(self.client, action_id, self.cfg.host.runs_dir)
            result = rec.get("result") if rec.get("ok") else None
            self._apply(ActionEnded(action_id, bool(rec.get("ok")), result, rec.get("error"),
                                    confirmed_after_reconnect=True))
            return result
        except (AgentRequestError, TransportError, ValueError) as exc:
            self._apply(ActionEnded(action_id, False, None, str(exc)))
            return None
        self._apply(ActionEnded(action_id, True, result))
        return result

    @work(group="action")
    async def _kill_worker(self, run_id: str, relaunch: Run | None) -> None:
        aid = services.new_action_id()
        self._apply(ActionStarted(aid, "kill", run_id))
        report = await self._settle(aid, services.kill(self.client, self.cfg, run_id, action=aid))
        if relaunch is not None and report is not None and report.get("ok"):
            await self._launch(relaunch if not relaunch.external else None)

    @work(group="action")
    async def _launch_worker(self, run: Run | None) -> None:
        await self._launch(run)

    async def _launch(self, run: Run | None) -> None:
        if not self._reread_config():
            return
        if run is None and not self.cfg.run.command:
            self.notify("no [run] command in the config: nothing to launch", severity="warning")
            return
        aid = services.new_action_id()
        self._apply(ActionStarted(aid, "launch" if run is None else "relaunch", run.run_id if run else None))

        async def call() -> dict[str, Any]:
            ps = await services.patch_state(self.client, self.cfg)
            if run is None:
                return await services.launch(self.client, self.cfg, ps, action=aid)
            return await services.relaunch(self.client, self.cfg, services.run_dict(run), ps, action=aid)

        record = await self._settle(aid, call())
        if record is None:
            return
        self._apply(CursorMoved(record.get("run_id")))  # the new run is the one to watch
        try:
            await services.configure(self.client, self.cfg)  # answers with an immediate snapshot
        except (AgentRequestError, TransportError):
            pass  # the next periodic snapshot shows the run

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Kill run", "Kill the selected run and wait until its GPUs are free", self.action_kill)
        yield SystemCommand("Relaunch run", "Launch the selected run again (same argv, cwd, env)", self.action_relaunch)
        yield SystemCommand("Launch run", "Launch the \\[run] command from eagle3.toml", self.action_launch)
        yield SystemCommand("All runs", "Show every run on the host, or only this config's", self.action_all_runs)
        yield SystemCommand("Log viewer", "The whole log: follow, search, filter, errors, root cause", self.action_open_log)
        yield SystemCommand("Patches", "Patch versions on the host: status, diff, push, roll back", self.action_patches)


def make_app(client: AgentClient, cfg: Config, target: str, launch: bool = False) -> EagleApp:
    """Build the dashboard around an injected client (local, SSH, or a test's);
    `launch` starts the config's run once connected (the demo)."""
    return EagleApp(client, cfg, target, launch)
