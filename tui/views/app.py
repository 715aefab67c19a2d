"""The Textual app: a thin shell around the screens.

`connect HOST` shows one host's `DashboardScreen` as the only screen, exactly as the
dashboard always was; `connect h1 h2 …` (or `hosts` in eagle3.toml, or
`--hosts-file`) shows the `FleetScreen`, and `enter` pushes a host's dashboard over
it. The app holds the keys every screen shares (`q`, `?`), the layout (app.tcss) and
the command palette; the dashboard's state and keys live in the dashboard.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any, Iterable

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.driver import Driver
from textual.notifications import SeverityLevel
from textual.screen import Screen

from tui.protocol.hosttext import clean
from tui.services.config import Config
from tui.services.hostfeed import HostFeed
from tui.transport import AgentClient
from tui.views.driver import remembering
from tui.views.screens.dashboard import DashboardScreen
from tui.views.screens.dashboard_actions import ACTION_KEYS
from tui.views.screens.help import HelpScreen
from tui.views.served import SessionsScreen, follow_sessions, served

FREEZE_AFTER_S = 2.0  # after the first frames, the heap that lives as long as the app


class EagleApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "eagle3-tui"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("S", "sessions", "Browser sessions", show=False),  # served only (tui/views/served.py)
    ]
    # Screen classes for app.tcss: below 120 columns the GPU cards narrow; at 80 and below
    # (a phone, a split terminal) the dashboard keeps the essentials, stacked; below 30
    # rows the Processes panel gives its rows to the runs, the phase and the log.
    HORIZONTAL_BREAKPOINTS = [(0, "-phone"), (81, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]

    terminal: Driver | None = None  # the driver Textual built for this terminal (terminal_write)

    def __init__(self, first: Screen[Any], read_only: bool = False) -> None:
        super().__init__()
        self._first = first
        self.read_only = read_only  # no kill, relaunch, launch, patch push (tui/views/readonly.py)
        self.fatal_error: str | None = None  # a failed connect of `connect HOST`: its one line

    def get_driver_class(self) -> type[Driver]:
        return remembering(super().get_driver_class())

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Every toast is plain text, whoever asks (`Screen.notify` passes markup=True by
        default): its words often carry host text (a run's failure, an agent's error), and
        markup in host text would raise `MarkupError` and end the app. The words are built
        from many sources (exceptions too), so they pass the sanitizer on their way out."""
        super().notify(clean(message), title=clean(title, newline=False), severity=severity, timeout=timeout,
                       markup=False)

    def feeds(self) -> list[HostFeed]:
        """Every host's feed: the fleet's, or the one dashboard's."""
        first = self._first
        feeds = getattr(first, "feeds", None) or {"": getattr(first, "feed", None)}
        return [feed for feed in feeds.values() if feed is not None]

    def close_hooks(self, grace: float = 2.0) -> None:
        """After the app: the `[notify] command` hooks still running get `grace` seconds,
        then their process groups are killed (nothing outlives `connect`)."""
        for feed in self.feeds():
            feed.close_hooks(grace)

    async def on_unmount(self) -> None:
        """The app's end, whichever way it ends (q, a failed connect, the terminal gone):
        every host's agent is stopped and its link (its SSH connection) closed, all at once.
        The process going on after the app (`demo` asks the host for the run's outcome
        next; the tests run many apps in one process) keeps no agent alive on the host."""
        await asyncio.gather(*(feed.close() for feed in self.feeds()), return_exceptions=True)

    def get_default_screen(self) -> Screen[Any]:
        return self._first

    def on_mount(self) -> None:
        self.set_timer(FREEZE_AFTER_S, self._freeze_heap)
        follow_sessions(self)  # served to a browser: who else is connected

    def _freeze_heap(self) -> None:
        """Keep the start-up heap (Textual, its CSS, the widgets: ~100k objects) out of
        the garbage collector's full passes: during a 2,000 lines/s burst each pass over it
        held the loop 140-220 ms, a key press waiting behind it."""
        gc.collect()
        gc.freeze()

    @property
    def dashboard(self) -> DashboardScreen:
        """The dashboard on top (the only one for `connect HOST`)."""
        for screen in reversed(self.screen_stack):
            if isinstance(screen, DashboardScreen):
                return screen
        if isinstance(self._first, DashboardScreen):
            return self._first
        raise LookupError("no host's dashboard is open")

    def track_push(self, goal: str) -> Any:
        return self.dashboard.track_push(goal)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "sessions":
            return served()
        if action in DashboardScreen.DASHBOARD_ACTIONS:
            try:
                return self.dashboard.check_action(action, parameters)
            except LookupError:
                return False
        return super().check_action(action, parameters)

    def action_help(self) -> None:
        """The help of the screen `?` was pressed on (each screen declares its keys). Each
        distinct help is built once and kept installed: a press during a burst pushes a
        screen that is already composed and styled."""
        help_ = HelpScreen.for_screen(self.screen, self)
        name = f"help-{hash(help_.contents)}"
        if not self.is_screen_installed(name):
            self.install_screen(help_, name)
        self.push_screen(name)

    def action_sessions(self) -> None:
        """Who is connected to this `serve` (each browser session: address, since, mode)."""
        if not isinstance(self.screen, SessionsScreen):
            self.push_screen(SessionsScreen())

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if served():
            yield SystemCommand("Browser sessions", "Who is connected to this eagle3-tui serve", self.action_sessions)
        if not isinstance(screen, DashboardScreen):
            return
        for key in ACTION_KEYS:  # the dashboard's keys, as declared (dashboard_actions.py)
            yield SystemCommand(key.description, key.tooltip, getattr(screen, f"action_{key.action}"))


def make_app(client: AgentClient, cfg: Config, target: str, launch: bool = False,
             read_only: bool = False) -> EagleApp:
    """Build the dashboard around an injected client (local, SSH, or a test's);
    `launch` starts the config's run once connected (the demo)."""
    return EagleApp(DashboardScreen(HostFeed(client, cfg, target), launch=launch), read_only)


def make_fleet_app(clients: dict[str, AgentClient], cfg: Config, limit: int,
                   read_only: bool = False) -> EagleApp:
    """The fleet screen over one client per host, at most `limit` connecting at once."""
    from dataclasses import replace

    from tui.state import fleet
    from tui.views.screens.fleet import FLEET_TAIL_BYTES, FleetScreen

    # each host's snapshots at the fleet's pace ([fleet] interval, else by its size)
    interval = cfg.fleet.interval or fleet.snapshot_interval(len(clients), cfg.host.interval)
    fleet_cfg = replace(cfg, host=replace(cfg.host, interval=interval))
    feeds = {host: HostFeed(c, fleet_cfg, host, tail_bytes=FLEET_TAIL_BYTES) for host, c in clients.items()}
    return EagleApp(FleetScreen(feeds, limit, host_interval=cfg.host.interval), read_only)
