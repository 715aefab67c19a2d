"""One host's live feed: its agent client, its `AppState`, and the loop that folds the
agent's events into that state through the reducer.

The dashboard of one host and the fleet's row for it read the same feed: the fleet
starts every host's feed (bounded by a semaphore) and keeps them running; `enter`
shows a host's dashboard over the feed that is already there, and `esc` leaves it
running. Whoever shows the state registers a listener (`listen`), called with each
event after the state changed. Nothing here imports Textual.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace
from typing import Awaitable, Callable, TypeVar

from tui import protocol as p
from tui import trace
from tui.protocol.hosttext import clean
from tui.services import actions as services
from tui.services import ledger, notify
from tui.services.config import Config
from tui.state import view
from tui.state.events import (
    AnalyseLog,
    ConfigRead,
    Event,
    LedgerRead,
    LogFollowed,
    LogOlder,
    Notice,
    TailSize,
)
from tui.state.model import AppState
from tui.state.reducer import apply
from tui.state.watch import WatchState
from tui.transport import AgentClient, AgentRequestError, TransportError

_T = TypeVar("_T")

TAIL_BYTES = 4 * 1024 * 1024  # how far back from the end of a log its analysis starts
FIRST_TAIL = 256 * 1024  # the subscription starts here; the rest of TAIL_BYTES comes after the first frame
LEDGER_EVERY = 30.0  # seconds between refreshes of past runs' summaries and the patch probe
RETRY_S = (5.0, 10.0, 20.0, 30.0, 60.0)  # a host whose first connect failed is tried again

Listener = Callable[[Event], None]


class HostFeed:
    """The state of one host, kept current by `run()`."""

    def __init__(self, client: AgentClient, cfg: Config, target: str, *,
                 tail_bytes: int = TAIL_BYTES) -> None:
        self.client = client
        self.cfg = cfg  # this session's config; [run] is re-read from its file on l and r
        self.target = target
        self.tail_bytes = tail_bytes
        # the target is the user's text, shown on the top line: sanitized here, once
        self.state = apply(AppState(target=clean(target, newline=False), watch=WatchState(config=cfg.watch)),
                           ConfigRead(services.settings_of(cfg)), time.time())
        self.error: str | None = None  # why the first connect failed (one line)
        self.error_exc: BaseException | None = None
        self.retry_at: float | None = None  # time.time() of the next try after a failed connect
        self.started = False
        self._listeners: list[Listener] = []
        self._log_subs = 0  # each followed log gets a fresh subscription name
        self._follow_lock = asyncio.Lock()
        self._node_run: tuple[str, str] | None = None  # the run (and how) follow_job last asked for
        self._ledger_at = float("-inf")
        self._ledger_task: asyncio.Task[None] | None = None
        self._notifier: notify.Notifier | None = None
        self._analysing = False  # an AnalyseLog is scheduled on the loop
        self._older_task: asyncio.Task[None] | None = None
        # True: the log is not followed, nor past runs' summaries read, yet (the fleet holds
        # them until each row has its first snapshot); `release_log` lets them come.
        self.log_held = False

    def notifier(self, write: Callable[[str], None] | None) -> notify.Notifier:
        """The feed's one notifier: the fleet and the host's dashboard both hand it the
        watch's events, and each is told once (bell, desktop, hook) whichever comes first."""
        if self._notifier is None:
            self._notifier = notify.Notifier(self.cfg.notify.command, host=self.target, write=write)
        return self._notifier

    def close_hooks(self, grace: float) -> None:
        """The notifier's hooks still running: `grace` seconds, then killed (on exit)."""
        if self._notifier is not None:
            self._notifier.close(grace)

    # ---- the one route ------------------------------------------------------------
    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(event)` after each event; returns the function that stops it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def apply(self, event: Event) -> None:
        """The reducer, then every listener."""
        self.state = apply(self.state, event, time.time())
        if isinstance(event, (p.Snapshot, p.LogData)):
            trace.mark(f"first {type(event).__name__} reduced")
        for listener in list(self._listeners):
            listener(event)
        log = self.state.log
        if log.backlog and not log.older and not self._analysing:  # older bytes first: none spins
            self._analyse_soon()

    def _analyse_soon(self) -> None:
        """Fold the log's backlog into its analysis a slice per turn of the loop, so keys,
        repaints and new events are served in between (one `AnalyseLog` each)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a test driving the feed by hand): all of it now
            while self.state.log.backlog and not self.state.log.older:
                self.apply(AnalyseLog(self.state.log.sub, sum(len(c[2]) for c in self.state.log.backlog)))
            return
        self._analysing = True

        def step() -> None:
            self._analysing = False
            self.apply(AnalyseLog(self.state.log.sub))

        loop.call_soon(step)

    # ---- the agent stream ---------------------------------------------------------
    async def connect(self, gate: asyncio.Semaphore | None = None) -> None:
        """Start the agent (holding a slot of `gate`) and configure it; raises the
        transport's or the agent's error (also kept in `error`)."""
        try:
            async with gate if gate is not None else contextlib.nullcontext():
                hello = await self.client.start()
            self.apply(hello)
            await services.configure(self.client, self.cfg)
            trace.mark("configured")
        except (TransportError, AgentRequestError, OSError) as exc:
            self.error, self.error_exc = str(exc) or type(exc).__name__, exc
            raise
        self.error = self.error_exc = None
        self.started = True

    async def follow(self, on_ready: Callable[[], Awaitable[None] | None] | None = None) -> None:
        """After `connect`: follow the selected run's log, then fold the events in until
        the client ends. `on_ready` runs once the first log subscription is made."""
        for warning in self.cfg.warnings:
            self.apply(Notice("warning", warning))
        notice = getattr(getattr(self.client, "link", None), "notice", None)
        if notice:  # said once, e.g. that the host has no SFTP and the agent came over exec
            self.apply(Notice("information", notice))
        await self.follow_log()
        if on_ready is not None:
            ready = on_ready()
            if ready is not None:
                await ready
        async for event in self.client.events():
            self.apply(event)
            if isinstance(event, p.Hello):  # a fresh agent follows no job yet
                self._node_run = None
            if isinstance(event, p.Snapshot):
                await self.follow_log()
                if not self.log_held and time.monotonic() - self._ledger_at > LEDGER_EVERY:
                    self._ledger_at = time.monotonic()
                    self.refresh_ledger()

    async def run(self, gate: asyncio.Semaphore | None = None, retry: tuple[float, ...] = ()) -> None:
        """`connect` then `follow`. A failed connect is kept in `error`; with `retry`
        (seconds to wait, the last repeating) a host that may come back (refused, timed
        out, unresolvable: not a bad key or a refused login) is tried again with a fresh
        client until it answers, and the row says so meanwhile."""
        attempt = 0
        while True:
            try:
                await self.connect(gate)
                break
            except (TransportError, AgentRequestError, OSError) as exc:
                # Closed: a try that got as far as the hello (the link lost at the configure)
                # reconnects on its own otherwise, an agent of its own on the host, over
                # the link the next try's client shares (each open stops the other's agent).
                await self.client.close()
                if not retry or getattr(exc, "permanent", True):
                    return
                wait = retry[min(attempt, len(retry) - 1)]
                attempt += 1
                self.retry_at = time.time() + wait
                await asyncio.sleep(wait)
                self.retry_at = None
                self.client = self.client.fresh()
        await self.follow()

    async def set_interval(self, interval: float) -> None:
        """Snapshots every `interval` seconds from now on (the fleet's pace, or the
        dashboard's for the host on screen); liveness follows the same interval."""
        if interval == self.cfg.host.interval:
            return
        self.cfg = replace(self.cfg, host=replace(self.cfg.host, interval=interval))
        self.apply(ConfigRead(services.settings_of(self.cfg)))
        if self.started:
            with contextlib.suppress(TransportError, AgentRequestError):
                await services.configure(self.client, self.cfg)

    def reread_ledger_soon(self) -> None:
        """Re-read past runs' summaries and the applied patch on the next snapshot."""
        self._ledger_at = float("-inf")

    def refresh_ledger(self) -> None:
        if self._ledger_task is None or self._ledger_task.done():
            self._ledger_task = asyncio.create_task(self._refresh_ledger())

    async def _refresh_ledger(self) -> None:
        """Summaries of ended runs (cached; one read each) and the host's applied patch."""
        try:
            summaries = await ledger.fetch_summaries(self.client, self.state.runs)
        except (TransportError, AgentRequestError, ledger.LedgerError):
            return
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
        self.apply(LedgerRead(summaries, applied, tuple(order)))

    async def follow_node(self) -> None:
        """Follow the selected run's Slurm job to its node (the agent's `follow_job`, README
        "Runs through Slurm"): while the job runs, the agent's snapshots carry that node's
        GPUs and the job's processes. Asked only when the wanted run changes."""
        run, how = view.select_run(self.state), self.cfg.run.node_agent
        want = (run.run_id, how) if run is not None and run.job_id and run.state == "running" and how != "off" else None
        if want != self._node_run:
            self._node_run = want
            try:
                await self.client.follow_job(want[0] if want else None, want[1] if want else "srun")
            except (AgentRequestError, TransportError) as exc:
                self.apply(Notice("error", f"following the job to its node: {exc}"))

    async def follow_log(self) -> None:
        """Subscribe to the selected run's log (`view.wanted_log`) when it changed, and
        follow its Slurm job to its node (`follow_node`).

        Serialised by a lock, never cancelled half-way, so the agent's subscription and
        `state.log` always agree; chunks of the previous log still in flight carry the
        old subscription name and are dropped by the reducer."""
        await self.follow_node()
        if self.log_held:
            return
        async with self._follow_lock:
            path, note = view.wanted_log(self.state)
            log = self.state.log
            if path == log.path and (path is None or log.sub is not None) and (path is not None or log.note == note):
                return
            old = log.sub
            if path is None:
                self.apply(LogFollowed(None, None, note))
                if old is not None:
                    await self._quietly("unsubscribe", self.client.unsubscribe(old))
                return
            self._log_subs += 1
            sub = f"log{self._log_subs}"
            first = min(self.tail_bytes, FIRST_TAIL)
            self.apply(LogFollowed(path, sub, defer=True, older=self.tail_bytes > first))
            if old is not None:
                await self._quietly("unsubscribe", self.client.unsubscribe(old))
            ok = await self._quietly("subscribe", self.client.subscribe(sub, path, -first))
            trace.mark("log subscribed")
            if ok is not None and ok.size is not None:
                self.apply(TailSize(sub, ok.size))
            if ok is not None and self.tail_bytes > first:
                start, inode = ok.offset, ok.inode
                if start > 0 and inode is not None:
                    self._older_task = asyncio.create_task(self._read_older(sub, path, inode, start))
                else:
                    self.apply(LogOlder(sub, b""))  # the first tail is the whole file
            if ok is None and self.state.log.sub == sub:
                self.apply(LogFollowed(path, None, f"cannot follow {path}", defer=True))  # tried again next snapshot

    async def release_log(self) -> None:
        """Follow the log from now on (`log_held` off), at once if the agent is up."""
        self.log_held = False
        if self.started:
            await self.follow_log()

    async def _read_older(self, sub: str, path: str, inode: int, start: int) -> None:
        """The bytes of `path` before `start` (up to `tail_bytes` from the end), in
        read_range chunks, for the analysis; nothing if the file was replaced meanwhile."""
        begin = max(0, start - (self.tail_bytes - FIRST_TAIL))
        try:
            data = await ledger.read_span(self.client, path, begin, start, inode)
        except (AgentRequestError, TransportError, ledger.LedgerError, p.ProtocolError):
            data = b""
        if len(data) < start - begin:  # truncated meanwhile: none of it, as for a replaced file
            data = b""
        self.apply(LogOlder(sub, data, cut=begin > 0))

    async def _quietly(self, what: str, call: Awaitable[_T]) -> _T | None:
        """A request whose failure is a notice on screen (`what: error`), not an error."""
        try:
            return await call
        except (AgentRequestError, TransportError, p.ProtocolError) as exc:
            self.apply(Notice("error", f"{what}: {exc}"))
            return None

    async def close(self) -> None:
        for task in (self._ledger_task, self._older_task):
            if task is not None:
                task.cancel()
        await self.client.close()
