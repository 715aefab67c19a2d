"""The dashboard: one screen for one host and its run.

Data flows one way: the agent worker feeds events to the pure reducer
(`tui.state.reducer.apply`), and the new state is handed to the widgets, which only
render it. Actions (kill, launch, relaunch) call `tui.services`, the same code the
CLI subcommands run.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any, Iterable

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from tui import ledger, notify, services
from tui import protocol as p
from tui.config import Config
from tui.format import gib, size
from tui.screens.confirm import ConfirmScreen
from tui.screens.help import HelpScreen
from tui.screens.logviewer import LogViewerScreen
from tui.state import advice as advisor
from tui.state.logindex import RootCause
from tui.state.model import AppState, KillView, LogTail, Run
from tui.state.reducer import apply
from tui.state.watch import WatchState
from tui.transport import AgentClient, AgentRequestError, TransportError
from tui.transport import ConfigError as TransportConfigError
from tui.widgets.gpus import GpuPanel
from tui.widgets.logtail import BUSY_S, LogPane
from tui.widgets.progress import RunProgress
from tui.widgets.render import set_content, set_title
from tui.widgets.status import StatusBar
from tui.widgets.tables import ProcessTable, RunsTable

TAIL_BYTES = 4 * 1024 * 1024  # a new subscription starts this far from the end of the log
KILL_BANNER_S = 60.0  # how long a finished kill's report stays in the banner
LEDGER_EVERY = 30.0  # seconds between refreshes of past runs' summaries and the patch probe


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
        self.cfg = cfg
        self.state = AppState(target=target, watch=WatchState(config=cfg.watch))
        self._notifier = notify.Notifier(cfg.notify.command, host=target, write=self._terminal_write)
        self.selected_run: str | None = None
        self.show_all_runs = False
        self.fatal_error: str | None = None
        self._log_path: str | None = None
        self._log_subs = 0  # each followed log gets a fresh subscription name
        self._follow_lock = asyncio.Lock()
        self._busy: str | None = None  # an action in flight ("kill", "launch")
        self._summaries: dict[str, advisor.RunSummary] = {}
        self._applied_patch: str | None = None  # "v5", "pristine", … on the host now
        self._version_order: list[str] = []
        self._ledger_at = float("-inf")
        self._kill_done_at = float("inf")
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
        self._render_all()
        self.connect_agent()
        self.set_interval(1.0, self._tick)

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
            self.notify(warning, severity="warning", timeout=10)
        notice = getattr(getattr(self.client, "link", None), "notice", None)
        if notice:  # said once, e.g. that the host has no SFTP and the agent came over exec
            self.notify(notice, title="eagle3-tui", timeout=10)
        await self._follow_log()
        if self._launch_on_connect:
            self._launch_worker(None)
        async for event in self.client.events():
            self._apply(event)
            if isinstance(event, p.Snapshot):
                await self._follow_log()
                if time.monotonic() - self._ledger_at > LEDGER_EVERY:
                    self._ledger_at = time.monotonic()
                    self._refresh_ledger()

    @work(exclusive=True, group="ledger")
    async def _refresh_ledger(self) -> None:
        """Summaries of ended runs (cached; one read each) and the host's applied patch."""
        self._summaries = await ledger.fetch_summaries(self.client, self.state.runs)
        if self.cfg.patches.set:
            from tui import patch_service
            from tui.state import patches as patchsets

            try:
                st = await patch_service.status(self.client, self.cfg.patches.set, self.cfg.host.python)
                self._applied_patch = st.get("version") or st.get("state")
                self._version_order = [v.name for v in patchsets.load_set(self.cfg.patches.set).versions]
            except Exception:  # noqa: BLE001 - advice is optional; no probe, no stale warning
                self._applied_patch = None
        self._render_all()  # failure notes in the runs table, and the banner

    def _advice(self) -> advisor.Advice | None:
        run = self._run()
        if run is None or not run.alive:
            return None
        log = self.state.log
        analysis = log.analysis if log.path in (run.log, self.cfg.run.log) else None
        return advisor.advise(
            run, analysis, self._summaries, self._applied_patch, self._version_order,
            time.time(), patch_set=self.cfg.patches.set,
        )

    def _apply(self, event: Any) -> None:
        self.state = apply(self.state, event, time.time())
        for ev in self._notifier.send_new(self.state.watch):  # failed, finished, stalled, hung: once each
            self.notify(ev.message, title=f"run {ev.run_id} {ev.kind}", timeout=15,
                        severity="information" if ev.kind in ("finished", "resumed") else "error")
        if isinstance(event, (p.LogData, p.LogReset)):
            self._log_pane.show(self.state.log)  # drawn with the next frame
            if not self._progress_due:  # the phase follows the log, once per frame too
                self._progress_due = True
                self.set_timer(BUSY_S, self._render_progress)
        elif isinstance(event, p.KillProgress):
            self._render_banner()
        else:
            self._render_all()

    async def _follow_log(self) -> None:
        """Subscribe to the log of the selected run (or `[run] log`) when it changed.

        Serialised by a lock, never cancelled half-way, so the agent's subscription and
        `_log_path` always agree; chunks of the previous log still in flight carry the
        old subscription name and are dropped by the reducer."""
        async with self._follow_lock:
            path = self._wanted_log()
            if path is None or path == self._log_path:
                return
            old = self.state.log.sub
            self._log_subs += 1
            sub = f"log{self._log_subs}"
            self.state = replace(self.state, log=LogTail(path=path, sub=sub))
            self._log_pane.show(self.state.log)
            if old is not None:
                await self._request("unsubscribe", sub=old)
            ok = await self._request("subscribe", sub=sub, path=path, offset=-TAIL_BYTES, inode=None)
            self._log_path = path if ok is not None else None

    def _wanted_log(self) -> str | None:
        """The selected run's own log (an absolute path from its manifest), else `[run] log`."""
        run = self._run()
        if run is not None and run.log:
            return run.log
        return self.cfg.run.log

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
        visible = self._visible_runs()
        runs_table.show(visible, self._run_notes())
        hidden = len(st.runs) - len(visible)
        set_title(
            self.query_one("#runs-box"),
            f"Runs ({len(visible)}; a: all {len(st.runs)})" if hidden else f"Runs ({len(visible)})",
        )
        if self.selected_run and runs_table.selected_run_id() != self.selected_run:
            runs_table.select(self.selected_run)
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
        label = f"run {run.run_id} ({run.state})" if run else "no run"
        self._progress.show(self.state, self._phase(run), label)

    def _phase(self, run: Run | None) -> str | None:
        a = self.state.log.analysis
        phase = getattr(a, "phase", None)
        if run is not None and run.state == "killed":
            return "killed"
        w = self.state.watch
        if run is not None and w is not None and w.run_id == run.run_id and w.condition in ("stalled", "hung"):
            return w.condition
        return phase

    def _terminal_write(self, seq: str) -> None:
        """Bell and desktop-notification escapes, through Textual's own writer."""
        if not self.is_headless and self._driver is not None:
            self._driver.write(seq)

    def _render_banner(self) -> None:
        banner = self._banner
        kill = self.state.kill
        text, kind = None, ""
        if kill is not None:
            if kill.report is not None:
                text = "  ·  ".join(services.describe_kill(kill.report))
                kind = "ok" if kill.report.get("ok") and kill.report.get("gpus_free") is not False else "error"
            elif kill.error:
                text, kind = f"kill {kill.run_id} failed: {kill.error}", "error"
            else:
                mems: list[int | None] = [g.get("run_mem") for g in kill.gpus]
                held = None if not mems or None in mems else sum(m or 0 for m in mems)
                text = (
                    f"Killing run {kill.run_id}: {kill.stage} · {len(kill.alive)} process(es) left"
                    f" · GPU memory held {size(held)} · {kill.elapsed:.1f} s"
                )
        elif self.state.link.state in ("reconnecting", "failed"):
            link = self.state.link
            age = time.time() - link.last_data if link.last_data else None
            text = (
                f"reconnecting (attempt {link.attempt}), data {age:.0f} s old" if link.state == "reconnecting" and age is not None
                else f"link {link.state}: {link.error or ''}"
            )
            kind = "error" if link.state == "failed" else ""
        elif (adv := self._advice()) is not None:
            text, kind = f"⚠ {adv.text}  — press k to kill", "error"
        elif (w := self.state.watch) is not None and (what := w.describe(time.time())) is not None:
            text, kind = f"⚠ run {w.run_id} {w.condition}: {what}", "error"
        banner.set_class(text is not None, "shown")
        banner.set_class(kind == "error", "error")
        banner.set_class(kind == "ok", "ok")
        set_content(banner, text or "")

    def _tick(self) -> None:
        self._status.show(self.state)
        if self.state.kill is not None and time.monotonic() - self._kill_done_at > KILL_BANNER_S:
            self.state = replace(self.state, kill=None)  # the kill's result has been read
            self._render_banner()
        if self.state.link.state != "connected":
            self._render_banner()

    def _run_notes(self) -> dict[str, str]:
        """The runs table's FAILURE / NOTE column: root causes, and live runs made stale
        by a newer patch version applied since they were launched."""
        notes = {  # a killed run's KeyboardInterrupt traceback is not its failure
            rid: s.failure_title
            for rid, s in self._summaries.items()
            if s.failure_title and s.outcome != "killed"
        }
        a = self.state.log.analysis
        run = self._run()
        root = getattr(a, "root_cause", None)
        if run is not None and root is not None:
            notes[run.run_id] = root.title
        for r in self.state.runs:
            if r.error:
                notes[r.run_id] = f"did not start: {r.error}"
        w = self.state.watch
        if w is not None and w.run_id is not None and (what := w.describe(time.time())) is not None:
            notes[w.run_id] = f"{w.condition.upper()}: {what}"
        order = ["pristine", *self._version_order]
        if self._applied_patch in order:
            for r in self.state.live_runs():
                _, version = advisor.patch_key(r.patch_state)
                if version in order and order.index(version) < order.index(self._applied_patch):
                    notes[r.run_id] = f"STALE: launched with {version}, {self._applied_patch} applied now"
        return notes

    # ---- selection ----------------------------------------------------------------
    def _run(self) -> Run | None:
        """The run actions apply to: the selected row, else the config's newest run."""
        st = self.state
        chosen = st.run(self.selected_run)
        if chosen is not None:
            return chosen
        mine = [r for r in self._visible_runs() if r.name == self.cfg.run.name or r.external]
        pool = [r for r in mine if r.alive] or mine
        return pool[0] if pool else None

    def _visible_runs(self) -> tuple[Run, ...]:
        """The ledger as shown: the config's runs and adopted (external) ones, or every
        run on the host after `a`."""
        if self.show_all_runs or not self.cfg.run.name:
            return self.state.runs
        return tuple(r for r in self.state.runs if r.name == self.cfg.run.name or r.external)

    def action_all_runs(self) -> None:
        self.show_all_runs = not self.show_all_runs
        self._render_all()
        self.notify("showing every run on the host" if self.show_all_runs else f"showing runs of {self.cfg.run.name!r}")

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if isinstance(event.data_table, RunsTable) and event.row_key is not None:
            if event.row_key.value != event.data_table.selected_run_id():
                return  # a stale highlight from a table rebuild, not the user's choice
            self.selected_run = event.row_key.value
            self._render_progress()
            self.run_worker(self._follow_log(), group="follow")

    # ---- actions --------------------------------------------------------------------
    DASHBOARD_ACTIONS = ("kill", "relaunch", "launch", "patches", "open_log", "all_runs")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """True: enabled; None: shown dimmed (does not apply now); False: hidden."""
        if action in self.DASHBOARD_ACTIONS and len(self.screen_stack) > 1:
            return False  # another screen is on top: its keys, never the dashboard's
        run = self._run()
        if action == "kill":
            return True if run and run.alive and self._busy is None else None
        if action == "relaunch":
            ok = (run is not None or bool(self.cfg.run.command)) and self._busy is None
            return True if ok else None
        if action == "launch":
            return True if self.cfg.run.command and self._busy is None else None
        if action == "patches":
            return True if self.cfg.patches.set else None
        if action == "open_log":
            return True if self.state.log.path is not None else None
        return True

    def _run_pids(self, run: Run) -> list[int]:
        pids = [pr.pid for pr in self.state.processes if pr.run_id == run.run_id]
        if run.pid is not None and run.pid not in pids:
            pids.insert(0, run.pid)
        return pids

    def _kill_lines(self, run: Run) -> list[str]:
        pids = self._run_pids(run)
        per_gpu = []
        for g in self.state.gpus:
            mine = [gp.mem for gp in g.processes if gp.pid in pids]
            if mine:
                held = None if None in mine else sum(mine)  # type: ignore[arg-type]
                per_gpu.append(f"GPU{g.index} {gib(held)} GiB")
        return [
            f"host:   {self.state.hostname or self.state.target}",
            f"run:    {run.run_id}  {run.name}" + ("  (external, no manifest)" if run.external else ""),
            f"argv:   {_clip(' '.join(run.argv), 70)}",
            f"PIDs:   {', '.join(map(str, pids[:16]))}" + (" …" if len(pids) > 16 else ""),
            "GPU memory at stake: " + (", ".join(per_gpu) if per_gpu else "none seen"),
            f"Signals: SIGINT, then SIGTERM after {self.cfg.run.graces[0]:.0f} s,"
            f" then SIGKILL after {self.cfg.run.graces[1]:.0f} s more.",
        ]

    def _refuse_if_busy(self) -> bool:
        """Actions also come from the command palette, which skips check_action."""
        if self._busy is not None:
            self.notify(f"wait: {self._busy} in progress", severity="warning")
            return True
        return False

    def action_kill(self) -> None:
        if self._refuse_if_busy():
            return
        run = self._run()
        if run is None or not run.alive:
            self.notify("no live run to kill", severity="warning")
            return

        def decided(yes: bool | None) -> None:
            if yes:
                self._kill_worker(run.run_id, None)

        self.push_screen(ConfirmScreen(f"Kill run {run.run_id}?", self._kill_lines(run)), decided)

    def action_relaunch(self) -> None:
        if self._refuse_if_busy():
            return
        run = self._run()
        argv, cwd = (run.argv, run.cwd) if run is not None and not run.external else (self.cfg.run.command, self.cfg.run.cwd)
        what = [f"launches: {_clip(' '.join(argv), 70)}", f"in:       {cwd}"]
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

    def action_patches(self) -> None:
        """Open the patch screen for `[patches] set`; relaunch when it asks to."""
        from tui.screens.patches import RELAUNCH, PatchScreen

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
            self.notify("no log to open", severity="warning")
            return
        self.push_screen(
            LogViewerScreen(client=self.client, path=log.path, root_cause=RootCause.from_log(log), follow=True)
        )

    def action_help(self) -> None:
        keys = [(b.key_display or b.key, b.description) for b in self.BINDINGS if isinstance(b, Binding)]
        self.push_screen(HelpScreen(keys + [("ctrl+p", "Command palette")]))

    @work(group="action")
    async def _kill_worker(self, run_id: str, relaunch: Run | None) -> None:
        self._busy = "kill"
        self._refresh_bindings()
        try:
            report = await services.kill(self.client, self.cfg, run_id)
            self.state = self._with_kill(report=report)
            self._kill_done_at = time.monotonic()
        except (AgentRequestError, TransportError) as exc:
            self.state = self._with_kill(error=str(exc), run_id=run_id)
        finally:
            self._busy = None
            self._refresh_bindings()
            self._render_banner()
        kill = self.state.kill
        if relaunch is not None and kill is not None and kill.report and kill.report.get("ok"):
            await self._launch(relaunch if not relaunch.external else None)

    def _with_kill(self, **changes: Any) -> AppState:
        kill = self.state.kill or KillView(run_id=changes.get("run_id", "?"), stage="", alive=(), gpus=(), elapsed=0.0)
        changes.pop("run_id", None)
        if "report" in changes:
            kill = replace(kill, run_id=changes["report"].get("run_id", kill.run_id), stage="done")
        return replace(self.state, kill=replace(kill, **changes))

    @work(group="action")
    async def _launch_worker(self, run: Run | None) -> None:
        await self._launch(run)

    async def _launch(self, run: Run | None) -> None:
        self._busy = "launch"
        self._refresh_bindings()
        try:
            ps = await services.patch_state(self.client, self.cfg)
            if run is None:
                record = await services.launch(self.client, self.cfg, ps)
            else:
                record = await services.relaunch(self.client, self.cfg, _run_dict(run), ps)
        except (AgentRequestError, TransportError, ValueError) as exc:
            self.notify(str(exc), title="launch refused", severity="error", timeout=10)
            return
        finally:
            self._busy = None
            self._refresh_bindings()
        self.selected_run = record.get("run_id")
        self.state = replace(self.state, kill=None)  # a new run: the old kill report is history
        self.notify(f"launched run {record.get('run_id')} (pid {record.get('pid')})")
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


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _run_dict(run: Run) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "name": run.name,
        "state": run.state,
        "argv": list(run.argv),
        "cwd": run.cwd,
        "env": dict(run.env),
        "external": run.external,
        "pid": run.pid,
    }


def make_app(client: AgentClient, cfg: Config, target: str, launch: bool = False) -> EagleApp:
    """Build the dashboard around an injected client (local, SSH, or a test's);
    `launch` starts the config's run once connected (the demo)."""
    return EagleApp(client, cfg, target, launch)
