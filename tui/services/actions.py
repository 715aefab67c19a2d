"""Actions on a host, shared by the CLI subcommands and the TUI keys.

Each function takes a started `AgentClient` and the config, so `eagle3-tui kill`
and the `k` key run exactly the same code.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import replace
from typing import Any, Awaitable, Callable

from tui import protocol as p
from tui.protocol.hosttext import clean_tree
from tui.services.config import Config, ConfigError, load_config
from tui.state import view
from tui.state.events import ConfigRead
from tui.state.model import AppState, Run, Settings
from tui.state.reducer import apply
from tui.state.watch import WatchState
from tui.transport import AgentClient, LinkLost, TransportError, make_link


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


async def configure(client: AgentClient, cfg: Config) -> dict[str, Any]:
    return await client.request(
        "configure", interval=cfg.host.interval, match=cfg.run.match, runs_dir=cfg.host.runs_dir
    )


async def snapshot(client: AgentClient, cfg: Config) -> dict[str, Any]:
    """One snapshot with the config's `match` applied."""
    await configure(client, cfg)
    return await client.request("snapshot")


async def list_runs(client: AgentClient, cfg: Config,
                    warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """Every run on the host, with processes matching `[run] match` adopted as external runs.
    The agent's one-line warnings (run dirs it refused: not ours alone) go to `warnings`."""
    await configure(client, cfg)
    result = await client.request("runs")
    if warnings is not None:
        warnings.extend(str(w) for w in result.get("warnings") or [])
    return list(result.get("runs") or [])


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


def _launch_args(cfg: Config, patch_state: Any, action: str | None = None) -> dict[str, Any]:
    return {**({"action": action} if action else {}), **scheduler_args(cfg), **restart_args(cfg),
        "name": cfg.run.name,
        "argv": list(cfg.require_command()),
        "cwd": cfg.run.cwd,
        "env": dict(cfg.run.env),
        "patch_state": patch_state,
        "log": cfg.run.log,
    }


async def launch(
    client: AgentClient, cfg: Config, patch_state: Any = None, action: str | None = None
) -> dict[str, Any]:
    """Start the config's run through the host's supervisor shim."""
    return shown(await client.request("launch", **_launch_args(cfg, patch_state, action)))


async def relaunch(
    client: AgentClient, cfg: Config, run: dict[str, Any] | None, patch_state: Any = None,
    action: str | None = None,
) -> dict[str, Any]:
    """Start again with the argv, cwd and env of `run` (or of the config's run)."""
    if run is None:
        return await launch(client, cfg, patch_state, action)
    if run.get("state") in ("running", "pending"):
        what = f"Slurm job {run.get('job_id')}" if run.get("job_id") else f"pid {run.get('pid')}"
        raise ValueError(f"run {run.get('run_id')} is still {run.get('state')} ({what}): kill it first")
    if run.get("external"):
        return await launch(client, cfg, patch_state, action)
    return shown(await client.request(
        "launch",
        **({"action": action} if action else {}),
        **scheduler_args(cfg),  # a Slurm run is resubmitted
        **restart_args(cfg),
        name=run.get("name") or cfg.run.name,
        argv=list(run.get("argv") or cfg.run.command),
        cwd=run.get("cwd") or cfg.run.cwd,
        env=dict(run.get("env") or {}),
        patch_state=patch_state,
        log=cfg.run.log,
    ))


def settings_of(cfg: Config, error: str | None = None) -> Settings:
    """What the state needs of the config (the selection rule, the log, liveness)."""
    return Settings(
        name=cfg.run.name or None, log=cfg.run.log, has_command=bool(cfg.run.command),
        interval=cfg.host.interval, error=error,
    )


def reread_config(cfg: Config) -> tuple[Config, str | None]:
    """eagle3.toml again (on launch and relaunch): its [run] and [patches] with this
    session's [host] (the connection is made already). (cfg, None), or the old cfg and
    the error's one line when the file is broken now. A config built in memory (no
    path) stays as it is."""
    if cfg.path is None:
        return cfg, None
    try:
        new = load_config(cfg.path)
    except (ConfigError, OSError) as exc:
        return cfg, str(exc)
    return replace(new, host=cfg.host), None


def state_of(cfg: Config, runs: list[dict[str, Any]], snap: dict[str, Any] | None = None) -> AppState:
    """The AppState a one-shot CLI command sees: the same reducer, the same rule."""
    # the config's [watch] thresholds: a live run's note says "STALLED" from its host pace
    state = apply(AppState(watch=WatchState(config=cfg.watch)), ConfigRead(settings_of(cfg)), time.time())
    if snap is None:
        snap = {"seq": 0, "time": time.time(), "host": {}, "gpus": [], "processes": [], "runs": runs}
    # through the protocol's own parser, as the dashboard's snapshots come
    event = p.parse_message({
        "type": "snapshot", "seq": int(snap.get("seq") or 0), "time": float(snap.get("time") or time.time()),
        "host": snap.get("host") or {}, "gpus": list(snap.get("gpus") or []),
        "processes": list(snap.get("processes") or []), "runs": list(runs),
        "gpu_source": snap.get("gpu_source"), "gpu_error": snap.get("gpu_error"),
    })
    assert isinstance(event, p.Snapshot)  # a "snapshot" line parses as one, or raises
    return apply(state, event, time.time())


def choose_run(cfg: Config, runs: list[dict[str, Any]], run_id: str | None = None,
               now: float | None = None) -> Run | None:
    """The run `eagle3-tui kill` / `relaunch` apply to: the dashboard's rule
    (`view.select_run`) over the host's runs, at `now` (default: this machine's clock;
    a run launched more than `view.FUTURE_SKEW_S` after it never wins by default)."""
    snap = None if now is None else {"time": now, "runs": runs}
    return view.select_run(state_of(cfg, runs, snap), run_id)


def new_action_id() -> str:
    return secrets.token_hex(6)


async def prune(client: AgentClient, cfg: Config, *, older_than: float | None,
                keep: int | None, demo: bool, dry_run: bool) -> dict[str, Any]:
    """Remove ended runs (directory and record together) from the host's runs dir."""
    from tui.services.demo import DEMO_ENV

    await configure(client, cfg)
    return shown(await client.request("prune", older_than=older_than, keep=keep, dry_run=dry_run,
                                      env={DEMO_ENV: "1"} if demo else None))


async def kill(
    client: AgentClient,
    cfg: Config,
    run_id: str,
    on_progress: Callable[[Any], Awaitable[None] | None] | None = None,
    action: str | None = None,
) -> dict[str, Any]:
    """Kill a run: SIGINT -> SIGTERM -> SIGKILL, then wait for its GPU memory to be freed.

    With `action`, the agent keeps the outcome under that id (see `outcome`)."""
    extra = {"action": action} if action else {}
    report = await client.call_with_progress(
        "kill",
        on_progress,
        run_id=run_id,
        graces=list(cfg.run.graces),
        gpu_wait=cfg.run.gpu_wait,
        **extra,
    )
    return shown(report)


def shown(result: dict[str, Any]) -> dict[str, Any]:
    """An action's result that is only shown (a kill report, a launch's or prune's record):
    every text of the host in it sanitized (`tui.protocol.hosttext.clean_tree`)."""
    return clean_tree(result)  # type: ignore[no-any-return]


async def outcome(
    client: AgentClient, action: str, runs_dir: str | None = None, poll: float = 0.5,
    timeout: float | None = None,
) -> dict[str, Any]:
    """The outcome of an action whose reply was lost: wait for the link to come back,
    ask the agent, and ask again while it is still running. Returns the agent's record
    ({"ok", "result" | "error"}), or {"ok": False, "never_arrived": True, "error": …}
    when the host has no record of it (asked three times, so a request still in a dying
    link's buffers has had its chance to arrive)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    missing = 0
    while True:
        if deadline is not None and time.monotonic() > deadline:
            raise LinkLost(f"no outcome of action {action} within {timeout:g} s")
        if client.connected:
            try:
                res = await client.request("outcomes", ids=[action], runs_dir=runs_dir)
            except TransportError:
                res = None
            if res is not None:
                rec = (res.get("outcomes") or {}).get(action)
                if rec is not None and rec.get("state") == "done":
                    return shown(rec)
                missing = missing + 1 if rec is None else 0
                if missing >= 3:
                    return {"ok": False, "never_arrived": True,
                            "error": "the request never reached the host; nothing was done"}
        await asyncio.sleep(poll)


describe_kill = view.describe_kill  # CLI output and the banner share the lines


def run_dict(run: Run) -> dict[str, Any]:
    """A run of the state as the relaunch request wants it: its argv, cwd and env as the
    host sent them (`Run.spec`), not the sanitized text the screen shows."""
    spec = run.spec or {"argv": list(run.argv), "cwd": run.cwd, "env": dict(run.env)}
    return {
        "run_id": run.run_id, "name": run.name, "state": run.state, "argv": list(spec["argv"]),
        "cwd": spec["cwd"], "env": dict(spec["env"]), "external": run.external, "pid": run.pid,
    }


async def patch_state(client: AgentClient, cfg: Config) -> Any:
    """The patch state a run is launched with (None when no patch set is configured)."""
    if not cfg.patches.set:
        return None
    from tui.services import patches as patch_service

    try:
        st = await patch_service.status(client, cfg.patches.set, cfg.host.python)
    except Exception as exc:  # noqa: BLE001 - a launch must not fail on a patch probe
        return {"set": cfg.patches.set, "state": "error", "error": str(exc)}
    return {"set": cfg.patches.set, "state": st.get("state"), "version": st.get("version")}
