"""Actions on a host, shared by the CLI subcommands and the TUI keys.

Each function takes a started `AgentClient` and the config, so `eagle3-tui kill`
and the `k` key run exactly the same code.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from tui.config import Config
from tui.format import size
from tui.transport import AgentClient, make_link


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


async def list_runs(client: AgentClient, cfg: Config) -> list[dict[str, Any]]:
    """Every run on the host, with processes matching `[run] match` adopted as external runs."""
    await configure(client, cfg)
    return list((await client.request("runs")).get("runs") or [])


def _launch_args(cfg: Config, patch_state: Any) -> dict[str, Any]:
    return {
        "name": cfg.run.name,
        "argv": list(cfg.require_command()),
        "cwd": cfg.run.cwd,
        "env": dict(cfg.run.env),
        "patch_state": patch_state,
        "log": cfg.run.log,
    }


async def launch(client: AgentClient, cfg: Config, patch_state: Any = None) -> dict[str, Any]:
    """Start the config's run through the host's supervisor shim."""
    return await client.request("launch", **_launch_args(cfg, patch_state))


async def relaunch(
    client: AgentClient, cfg: Config, run: dict[str, Any] | None, patch_state: Any = None
) -> dict[str, Any]:
    """Start again with the argv, cwd and env of `run` (or of the config's run)."""
    if run is None:
        return await launch(client, cfg, patch_state)
    if run.get("state") == "running":
        raise ValueError(
            f"run {run.get('run_id')} is still running (pid {run.get('pid')}): kill it first"
        )
    if run.get("external"):
        return await launch(client, cfg, patch_state)
    return await client.request(
        "launch",
        name=run.get("name") or cfg.run.name,
        argv=list(run.get("argv") or cfg.run.command),
        cwd=run.get("cwd") or cfg.run.cwd,
        env=dict(run.get("env") or {}),
        patch_state=patch_state,
        log=cfg.run.log,
    )


def pick_run(runs: list[dict[str, Any]], run_id: str | None, cfg: Config) -> dict[str, Any] | None:
    """The run an action applies to: `run_id`, else the config's live run, else a live
    run adopted through `[run] match` — never another config's run."""
    if run_id:
        return next((r for r in runs if r.get("run_id") == run_id), None)
    live = [r for r in runs if r.get("state") == "running"]
    mine = [r for r in live if r.get("name") == cfg.run.name and not r.get("external")]
    adopted = [r for r in live if r.get("external")]
    pool = mine or adopted
    return pool[0] if pool else None


async def prune(client: AgentClient, cfg: Config, *, older_than: float | None,
                keep: int | None, demo: bool, dry_run: bool) -> dict[str, Any]:
    """Remove ended runs (directory and record together) from the host's runs dir."""
    from tui.demo import DEMO_ENV

    await configure(client, cfg)
    return await client.request("prune", older_than=older_than, keep=keep, dry_run=dry_run,
                                env={DEMO_ENV: "1"} if demo else None)


async def kill(
    client: AgentClient,
    cfg: Config,
    run_id: str,
    on_progress: Callable[[Any], Awaitable[None] | None] | None = None,
) -> dict[str, Any]:
    """Kill a run: SIGINT -> SIGTERM -> SIGKILL, then wait for its GPU memory to be freed."""
    return await client.call_with_progress(
        "kill",
        on_progress,
        run_id=run_id,
        graces=list(cfg.run.graces),
        gpu_wait=cfg.run.gpu_wait,
    )


def describe_kill(report: dict[str, Any]) -> list[str]:
    """Human lines for a kill report (CLI output and the TUI's final banner)."""
    lines = []
    for st in report.get("stages") or []:
        sent = st.get("sent_to") or []
        lines.append(f"{st.get('signal')}: sent to {len(sent)} process(es) {sent}")
    left = report.get("remaining") or []
    lines.append("processes left: " + (", ".join(map(str, left)) if left else "none"))
    for g in report.get("gpus") or []:
        text = f"GPU {g.get('index')}: freed {size(g.get('freed'))}"
        if g.get("run_pids"):
            text += f"; the run still holds {size(g.get('run_mem'))} in pid " + ", ".join(
                str(pid) for pid in g["run_pids"]
            )
        others = g.get("other_pids") or []
        if others:
            text += "; also in use by pid " + ", ".join(
                f"{o.get('pid')} ({size(o.get('mem'))})" if isinstance(o, dict) else str(o) for o in others
            )
        lines.append(text)
    free = report.get("gpus_free")
    took = f"{report.get('elapsed') or 0:.1f} s"
    verdict = {
        True: f"GPUs free after {took}",
        False: f"GPUs NOT free after {took}",
        None: f"done in {took} (no GPU source to check memory)",
    }[free]
    return [f"run {report.get('run_id')} killed: {verdict}"] + lines


async def patch_state(client: AgentClient, cfg: Config) -> Any:
    """The patch state a run is launched with (None when no patch set is configured)."""
    if not cfg.patches.set:
        return None
    from tui import patch_service

    try:
        st = await patch_service.status(client, cfg.patches.set, cfg.host.python)
    except Exception as exc:  # noqa: BLE001 - a launch must not fail on a patch probe
        return {"set": cfg.patches.set, "state": "error", "error": str(exc)}
    return {"set": cfg.patches.set, "state": st.get("state"), "version": st.get("version")}
