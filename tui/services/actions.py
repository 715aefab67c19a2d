"""Actions on a host, shared by the CLI subcommands and the TUI keys.

Each function takes a started `AgentClient` and the config, so `eagle3-tui kill`
and the `k` key run exactly the same code.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import replace
from typing import Any, Awaitable, Callable, Sequence, TypeVar, Union

from tui import protocol as p
from tui.protocol.ops import (
    ActionReply,
    KillReport,
    LaunchReply,
    LaunchRequest,
    Outcome,
    PruneReport,
)
from tui.protocol.records import HostReading, RunRecord
from tui.services.config import Config, ConfigError, load_config
from tui.state import view
from tui.state.events import ActionEnded, ActionUnconfirmed, ConfigRead
from tui.state.model import AppState, Settings
from tui.state.reducer import apply
from tui.state.watch import WatchState
from tui.transport import (
    AgentApi,
    AgentClient,
    AgentRequestError,
    LinkLost,
    TransportError,
    make_link,
)

ActionEvent = Union[ActionUnconfirmed, ActionEnded]


def resolve_target(target: str | None, cfg: Config) -> str:
    """TARGET argument, else `[host] target`, else local."""
    return target or cfg.host.target or "local"


def new_client(
    target: str,
    cfg: Config,
    *,
    ssh_config: str | None = None,
    accept_new_host_key: bool = False,
    reconnect: bool = True,
) -> AgentClient:
    link = make_link(
        target,
        ssh_config=ssh_config,
        accept_new_host_key=accept_new_host_key,
        python=cfg.host.python,
        runs_dir=cfg.host.runs_dir,
        connect_timeout=cfg.host.connect_timeout,
        keepalive_interval=cfg.host.keepalive,
    )
    return AgentClient(link, reconnect=reconnect)


async def configure(client: AgentApi, cfg: Config) -> None:
    """The config's snapshot interval, `match` and runs dir; a snapshot comes at once."""
    await client.configure(cfg.host.interval, cfg.run.match, cfg.host.runs_dir)


async def snapshot(client: AgentApi, cfg: Config) -> p.Snapshot:
    """One snapshot with the config's `match` applied."""
    await configure(client, cfg)
    return await client.snapshot()


async def list_runs(client: AgentApi, cfg: Config,
                    warnings: list[str] | None = None) -> tuple[RunRecord, ...]:
    """Every run on the host, with processes matching `[run] match` adopted as external runs.
    The agent's one-line warnings (run dirs it refused: not ours alone) go to `warnings`."""
    await configure(client, cfg)
    result = await client.runs()
    if warnings is not None:
        warnings.extend(result.warnings)
    return result.runs


def scheduler_args(cfg: Config) -> dict[str, Any]:
    """`scheduler` of a launch request: Slurm's options under `[run] scheduler = "slurm"`,
    nothing for a local launch (so an older agent sees the request it knows)."""
    run = cfg.run
    if run.scheduler != "slurm":
        return {}
    return {"scheduler": {"kind": "slurm", "partition": run.partition, "gpus": run.gpus,
                          "time": run.time, "sbatch_args": list(run.sbatch_args)}}


def restart_args(cfg: Config) -> dict[str, Any]:
    """`restart` of a launch request: the policy the host's supervisor enforces with no
    client connected (tui/services/restartpolicy.py); nothing when there is none."""
    from tui.services.restartpolicy import compile_policy

    policy = compile_policy(cfg)
    return {"restart": policy} if policy is not None else {}


def launch_request(cfg: Config, patch_state: Any = None, run: RunRecord | None = None) -> LaunchRequest:
    """What a launch starts: the config's [run], or again the argv, cwd and env of `run`
    as the host sent them (`Run.spec`, not the sanitized text the screen shows). Either
    way with the config's scheduler (a Slurm run is resubmitted) and restart policy."""
    common: dict[str, Any] = {"patch_state": patch_state, "log": cfg.run.log,
                              "scheduler": scheduler_args(cfg).get("scheduler"),
                              "restart": restart_args(cfg).get("restart")}
    if run is None or run.external:
        return LaunchRequest(name=cfg.run.name, argv=list(cfg.require_command()), cwd=cfg.run.cwd,
                             env=dict(cfg.run.env), **common)
    spec = run.spec or {"argv": list(run.argv), "cwd": run.cwd, "env": dict(run.env)}
    return LaunchRequest(name=run.name or cfg.run.name, argv=list(spec.get("argv") or cfg.run.command),
                         cwd=spec.get("cwd") or cfg.run.cwd, env=dict(spec.get("env") or {}), **common)


async def launch(
    client: AgentApi, cfg: Config, patch_state: Any = None, action: str | None = None
) -> LaunchReply:
    """Start the config's run through the host's supervisor shim."""
    return await client.launch(launch_request(cfg, patch_state), action)


async def relaunch(
    client: AgentApi, cfg: Config, run: RunRecord | None, patch_state: Any = None,
    action: str | None = None,
) -> LaunchReply:
    """Start again with the argv, cwd and env of `run` (or the config's run when there is
    none, or it was adopted: it has no manifest)."""
    if run is not None and run.state in ("running", "pending"):
        raise ValueError(f"run {run.run_id} is still {run.state} ({view.whose(run)}): kill it first")
    return await client.launch(launch_request(cfg, patch_state, run), action)


def settings_of(cfg: Config, error: str | None = None) -> Settings:
    """What the state needs of the config (the selection rule, the log, liveness)."""
    return Settings(
        name=cfg.run.name or None, log=cfg.run.log, has_command=bool(cfg.run.command),
        interval=cfg.host.interval, error=error, config=cfg.source,
    )


def reread_config(cfg: Config) -> tuple[Config, str | None]:
    """eagle3.toml again (on launch and relaunch): its [run] and [patches] with this
    session's [host] (the connection is made already). (cfg, None), or the old cfg and
    the error's one line when the file is broken now. A config built in memory (no
    path) stays as it is."""
    path = cfg.path or (cfg.looked_for if cfg.looked_for is not None and cfg.looked_for.exists() else None)
    if path is None:  # (a ./eagle3.toml written since the start is read now)
        return cfg, None
    try:
        new = load_config(path)
    except (ConfigError, OSError) as exc:
        return cfg, str(exc)
    return replace(new, host=cfg.host), None


def state_of(cfg: Config, runs: Sequence[RunRecord], snap: p.Snapshot | None = None,
             now: float | None = None) -> AppState:
    """The AppState a one-shot CLI command sees: the same reducer, the same rule, over
    `runs` (and the rest of `snap`, when there is one) as of `now` (default: the
    snapshot's time, else this machine's clock)."""
    # the config's [watch] thresholds: a live run's note says "STALLED" from its host pace
    state = apply(AppState(watch=WatchState(config=cfg.watch)), ConfigRead(settings_of(cfg)), time.time())
    if snap is None:
        snap = p.Snapshot(seq=0, time=time.time(), host=HostReading(), gpus=(), processes=(), runs=())
    return apply(state, replace(snap, runs=tuple(runs), time=snap.time if now is None else now), time.time())


def choose_run(cfg: Config, runs: Sequence[RunRecord], run_id: str | None = None,
               now: float | None = None) -> RunRecord | None:
    """The run `eagle3-tui kill` / `relaunch` apply to: the dashboard's rule
    (`view.select_run`) over the host's runs, at `now` (default: this machine's clock;
    a run launched more than `view.FUTURE_SKEW_S` after it never wins by default)."""
    return view.select_run(state_of(cfg, runs, now=now), run_id)


def new_action_id() -> str:
    return secrets.token_hex(6)


async def prune(client: AgentApi, cfg: Config, *, older_than: float | None,
                keep: int | None, demo: bool, dry_run: bool) -> PruneReport:
    """Remove ended runs (directory and record together) from the host's runs dir."""
    from tui.services.demo import DEMO_ENV

    await configure(client, cfg)
    return await client.prune(older_than, keep, dry_run, {DEMO_ENV: "1"} if demo else None)


async def kill(
    client: AgentApi,
    cfg: Config,
    run_id: str,
    on_progress: Callable[[p.KillProgress], object] | None = None,
    action: str | None = None,
) -> KillReport:
    """Kill a run: SIGINT -> SIGTERM -> SIGKILL, then wait for its GPU memory to be freed.

    With `action`, the agent keeps the outcome under that id (see `outcome`)."""
    return await client.kill(run_id, cfg.run.graces, cfg.run.gpu_wait, action, on_progress)


NEVER_ARRIVED = "the request never reached the host; nothing was done"


async def outcome(
    client: AgentClient, action: str, runs_dir: str | None = None, poll: float = 0.5,
    timeout: float | None = None,
) -> Outcome:
    """The outcome of an action whose reply was lost: wait for the link to come back,
    ask the agent, and ask again while it is still running. Returns the agent's record
    (done: `ok` with its raw `result`, or its `error`), or a failure saying the request
    never arrived when the host has no record of it (asked three times, so a request
    still in a dying link's buffers has had its chance to arrive)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    missing = 0
    while True:
        if deadline is not None and time.monotonic() > deadline:
            raise LinkLost(f"no outcome of action {action} within {timeout:g} s")
        if client.connected:
            try:
                found: dict[str, Outcome] | None = await client.outcomes([action], runs_dir)
            except TransportError:
                found = None
            if found is not None:
                rec = found.get(action)
                if rec is not None and rec.state == "done":
                    return rec
                missing = missing + 1 if rec is None else 0
                if missing >= 3:
                    return Outcome("done", False, None, NEVER_ARRIVED)
        await asyncio.sleep(poll)


_R = TypeVar("_R", bound=ActionReply)  # the reply of any op declared `action`


async def settle(client: AgentClient, runs_dir: str | None, action_id: str, call: Awaitable[_R],
                 parse: Callable[[Any], _R], record: Callable[[ActionEvent], None],
                 timeout: float | None = None) -> _R | None:
    """Await an action's request (started under `action_id`); its outcome goes to
    `record` as the reducer's events. When the link drops before the reply, the outcome
    is asked of the host after the reconnect (within `timeout`), so a kill that
    succeeded never ends shown as failed, nor the reverse. The `k` key and `eagle3-tui
    kill` (and launch, relaunch) settle their actions here. Returns the reply, or None
    when the action failed."""
    try:
        result = await call
    except LinkLost as exc:
        record(ActionUnconfirmed(action_id, str(exc)))
        rec = await outcome(client, action_id, runs_dir, timeout=timeout)
        found = parse(rec.result) if rec.ok and rec.result is not None else None
        record(ActionEnded(action_id, rec.ok, found, rec.error, confirmed_after_reconnect=True))
        return found
    except (AgentRequestError, TransportError, ValueError) as exc:
        record(ActionEnded(action_id, False, None, str(exc)))
        return None
    record(ActionEnded(action_id, True, result))
    return result


describe_kill = view.describe_kill  # CLI output and the banner share the lines


async def patch_state(client: AgentApi, cfg: Config) -> Any:
    """The patch state a run is launched with (None when no patch set is configured)."""
    if not cfg.patches.set:
        return None
    from tui.services import patches as patch_service

    try:
        st = await patch_service.status(client, cfg.patches.set, cfg.host.python)
    except Exception as exc:  # noqa: BLE001 - a launch must not fail on a patch probe
        return {"set": cfg.patches.set, "state": "error", "error": str(exc)}
    return {"set": cfg.patches.set, "state": st.get("state"), "version": st.get("version")}
