"""The dashboard's keys: kill, relaunch, launch, patches, the log viewer, all runs.

A mixin of `DashboardScreen` (tui/views/screens/dashboard.py, which draws the panels):
it reaches the screen only through public names (`state`, `client`, `cfg`, `feed`,
`attached`, `apply(event)`, `selected_run()`), and the screen starts a launch on
connect through `start_launch`. Each action calls `tui.services`, the
code the CLI subcommands run too, and lives in the state under an id until its
outcome is known (asked again after a reconnect when the reply was lost);
destructive ones go through `ConfirmScreen` (Cancel focused). The run an action
applies to is `view.select_run`, the CLI's rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual import work
from textual.binding import Binding

from tui.protocol.ops import KillReport, LaunchReply
from tui.protocol.records import RunRecord
from tui.services import actions as services
from tui.state import view
from tui.state.events import (
    ActionEnded,
    ActionStarted,
    ConfigRead,
    CursorMoved,
    Event,
    ShowAll,
)
from tui.state.logpage.document import RootCause
from tui.state.model import PushResult
from tui.transport import AgentRequestError, TransportError
from tui.views.readonly import refused
from tui.views.screens.confirm import ConfirmScreen
from tui.views.screens.logviewer import LogViewerScreen

if TYPE_CHECKING:
    from textual.screen import Screen

    from tui.services.config import Config
    from tui.services.hostfeed import HostFeed
    from tui.state.model import AppState
    from tui.transport import AgentClient

    _Base = Screen[None]
else:
    _Base = object

# The dashboard's keys, each declared once, beside its `action_*` below: the key, the
# action, the footer's words, `id` (the CLI twin: `runs-show` is `eagle3-tui runs show`)
# and `tooltip` (the command palette's help). The footer, `?` (tui/views/screens/help.py),
# the command palette (tui/views/app.py) and `check_action` all read them from here.
ACTION_KEYS = (
    Binding("k", "kill", "Kill run", id="kill",
            tooltip="Kill the selected run and wait until its GPUs are free"),
    Binding("r", "relaunch", "Relaunch", id="relaunch",
            tooltip="Launch the selected run again (same argv, cwd, env)"),
    Binding("l", "launch", "Launch", id="launch", tooltip="Launch the run command of eagle3.toml"),
    Binding("p", "patches", "Patches", id="patch-status",
            tooltip="Patch versions on the host: status, diff, push, roll back"),
    Binding("L", "open_log", "Log viewer", id="watch",
            tooltip="The whole log: follow, search, filter, errors, root cause"),
    Binding("t", "timeline", "Timeline", show=False, id="runs-show",  # the footer is full
            tooltip="The selected run's whole timeline: loss, GPU memory, rate, phases"),
    Binding("a", "all_runs", "All runs", show=False, id="runs-list",
            tooltip="Show every run on the host, or only this config's"),
    Binding("D", "disk", "Disk space", show=False, id="runs-df",
            tooltip="Free space where the selected run writes (its cwd), else in the runs dir"),
)


class DashboardActions(_Base):
    """The keys of one host's dashboard (see the module docstring)."""

    if TYPE_CHECKING:  # what DashboardScreen provides
        feed: HostFeed
        attached: bool
        cfg: Config

        @property
        def state(self) -> AppState: ...
        @property
        def client(self) -> AgentClient: ...

        def apply(self, event: Event) -> None: ...
        def selected_run(self) -> RunRecord | None: ...

    DASHBOARD_ACTIONS = tuple(b.action for b in ACTION_KEYS)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """True: enabled; None: shown dimmed (does not apply now); False: hidden.

        Keys that would only explain why they do nothing (k on an ended run, l while a
        kill runs) stay enabled, so the key answers with a notification."""
        if action == "back":
            return self.attached
        if action in self.DASHBOARD_ACTIONS and self.app.screen is not self:
            return False  # another screen is on top: its keys, never the dashboard's
        if action == "patches":
            return True if self.cfg.patches.set else None
        if action == "open_log":
            return True if self.state.log.path is not None else None
        return True

    def action_all_runs(self) -> None:
        self.apply(ShowAll(not self.state.show_all))
        self.notify("showing every run on the host" if self.state.show_all
                    else f"showing runs of {self.cfg.run.name!r}")

    def _refuse_if_busy(self) -> bool:
        busy = self.state.busy
        if busy is not None:
            self.notify(f"wait: {view.action_text(busy)}", severity="warning")
            return True
        return False

    def action_kill(self) -> None:
        if refused(self, "kill") or self._refuse_if_busy():
            return
        run = self.selected_run()
        if run is None:
            self.notify("no run to kill", severity="warning")
            return
        if not run.alive:
            self.notify(view.already_ended(run) + ": nothing to kill", severity="warning")
            return

        def decided(yes: bool | None) -> None:
            if yes:
                self._kill_worker(run.run_id, None)

        self.app.push_screen(ConfirmScreen(f"Kill run {run.run_id}?", self._kill_lines(run)), decided)

    def _kill_lines(self, run: RunRecord) -> list[str]:
        return view.kill_confirm_lines(self.state, run, self.cfg.run.graces)

    def action_relaunch(self) -> None:
        if refused(self, "relaunch") or self._refuse_if_busy() or not self._reread_config():
            return
        run = self.selected_run()
        argv, cwd = ((run.argv, run.cwd) if run is not None and not run.external
                     else (self.cfg.run.command, self.cfg.run.cwd))
        if run is None and not self.cfg.run.command:
            self.notify(f"no run to relaunch and {self.cfg.lacks_command()}", severity="warning", markup=False)
            return
        what = [f"launches: {view.clip(' '.join(argv), 70)}", f"in:       {cwd}"]
        if run is not None and run.external:
            what.insert(0, "An adopted run has no manifest: the config's [run] command is launched instead.")
        if run is not None and run.alive:
            lines = self._kill_lines(run) + ["", "It is still running: kill it first, then:", *what]

            def decided(yes: bool | None) -> None:
                if yes:
                    self._kill_worker(run.run_id, run)

            self.app.push_screen(ConfirmScreen(f"Kill and relaunch run {run.run_id}?", lines, "Kill + relaunch"),
                                 decided)
            return

        def go(yes: bool | None) -> None:
            if yes:
                self.start_launch(run)

        title = f"Relaunch run {run.run_id}?" if run is not None else "Launch the config's run?"
        host = [f"host:     {self.state.hostname or self.state.target}", *what]
        self.app.push_screen(ConfirmScreen(title, host, "Relaunch"), go)

    def action_launch(self) -> None:
        if not refused(self, "launch") and not self._refuse_if_busy():
            self.start_launch(None)

    def _reread_config(self) -> bool:
        """eagle3.toml again (its [run] and [patches]); a broken file is one line in the
        banner and nothing launches."""
        cfg, error = services.reread_config(self.cfg)
        self.apply(ConfigRead(services.settings_of(cfg, error)))
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
            self.feed.reread_ledger_soon()  # the applied patch, on the next snapshot
            if result == RELAUNCH:
                self.action_relaunch()

        host = self.state.hostname or self.state.target
        screen = PatchScreen(
            self.client, self.cfg.patches.set, self.cfg.host.python, host,
            can_relaunch=lambda: self.selected_run() is not None or bool(self.cfg.run.command),
        )
        self.app.push_screen(screen, done)

    def action_open_log(self) -> None:
        """Full-screen viewer of the followed log: search, filter, errors, root cause."""
        log = self.state.log
        if log.path is None:
            self.notify(log.note or "no log to open", severity="warning")
            return
        self.app.push_screen(
            LogViewerScreen(client=self.client, path=log.path, root_cause=RootCause.from_log(log), follow=True)
        )

    def action_timeline(self) -> None:
        """The selected run's whole timeline, fetched from the host on demand."""
        run = self.selected_run()
        if run is None or run.external:
            self.notify("no run with a timeline selected (adopted runs have none)", severity="warning")
            return
        self._timeline_worker(run)

    @work(group="timeline", exclusive=True)
    async def _timeline_worker(self, run: RunRecord) -> None:
        from tui.services import timeline as tls
        from tui.views.screens.timeline import TimelineScreen

        tl = await tls.fetch(self.client, self.cfg.host.runs_dir, run.run_id)
        self.app.push_screen(TimelineScreen(run.run_id, tl, run))

    @work(group="disk", exclusive=True)
    async def action_disk(self) -> None:
        """Free space where the selected run writes (its cwd), else in the runs dir."""
        run = self.selected_run()
        try:
            disk = await self.client.disk_usage(run.cwd if run is not None and run.cwd else self.cfg.host.runs_dir)
        except (AgentRequestError, TransportError, ValueError) as exc:
            self.notify(f"disk space: {exc}", severity="error")
            return
        self.notify(disk.summary(), severity="warning" if disk.low else "information")

    def track_push(self, goal: str) -> Any:
        """A patch push (or rollback) as an action of the state; returns `end(ok, error)`."""
        aid = services.new_action_id()
        self.apply(ActionStarted(aid, "push", None))

        def end(ok: bool, error: str | None = None, unknown: bool = False) -> None:
            self.apply(ActionEnded(aid, ok, PushResult(goal, unknown), error))

        return end

    @work(group="action")
    async def _kill_worker(self, run_id: str, relaunch: RunRecord | None) -> None:
        aid = services.new_action_id()
        self.apply(ActionStarted(aid, "kill", run_id))
        report = await services.settle(
            self.client, self.cfg.host.runs_dir, aid, services.kill(self.client, self.cfg, run_id, action=aid),
            KillReport.parse, self.apply)
        if relaunch is not None and report is not None and report.ok:
            await self._launch(relaunch if not relaunch.external else None)

    @work(group="action")
    async def start_launch(self, run: RunRecord | None) -> None:
        await self._launch(run)

    async def _launch(self, run: RunRecord | None) -> None:
        if not self._reread_config():
            return
        if run is None and not self.cfg.run.command:
            self.notify(f"nothing to launch: {self.cfg.lacks_command()}", severity="warning", markup=False)
            return
        aid = services.new_action_id()
        self.apply(ActionStarted(aid, "launch" if run is None else "relaunch", run.run_id if run else None))

        async def call() -> LaunchReply:
            ps = await services.patch_state(self.client, self.cfg)
            if run is None:
                return await services.launch(self.client, self.cfg, ps, action=aid)
            return await services.relaunch(self.client, self.cfg, run, ps, action=aid)

        record = await services.settle(self.client, self.cfg.host.runs_dir, aid, call(),
                                       LaunchReply.parse, self.apply)
        if record is None:
            return
        self.apply(CursorMoved(record.run_id))  # the new run is the one to watch
        try:
            await services.configure(self.client, self.cfg)  # answers with an immediate snapshot
        except (AgentRequestError, TransportError):
            pass  # the next periodic snapshot shows the run
