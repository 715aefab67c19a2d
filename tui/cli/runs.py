"""The run commands: `status`, `runs` (list, prune), `launch`, `relaunch`, `kill`."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import click

from tui.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    OUTCOME_WAIT,
    RUN_ID,
    Ctx,
    confirm,
    fail,
    print_json,
    run_on_host,
    target_arg,
)
from tui.cli.fleet import fleet_hosts, hosts_file_opt, runs_many, status_many, targets_arg
from tui.protocol import KillProgress
from tui.protocol.ops import KillReport, LaunchReply
from tui.protocol.records import RunRecord
from tui.services import actions as services
from tui.services.config import Config
from tui.state import view
from tui.state import watch as watcher
from tui.state.events import ActionStarted, ActionUnconfirmed
from tui.state.model import Action, AppState
from tui.state.reducer import apply
from tui.transport import AgentClient, AgentRequestError


@click.command()
@targets_arg
@hosts_file_opt
@click.option("--json", "as_json", is_flag=True, help="Print the snapshot as JSON.")
@click.pass_obj
def status(obj: Ctx, targets: tuple[str, ...], hosts_file: str | None, as_json: bool) -> None:
    """Print one snapshot of the host and exit.

    With several hosts: one row per host (--json: a list of one object per host,
    {"host", "ok": true, "snapshot", "summary"} or {"host", "ok": false, "error",
    "exit"}); exit 0 when every host answered, 3 when any was unreachable."""
    hosts = fleet_hosts(obj, targets, hosts_file)
    if len(hosts) > 1:
        status_many(obj, hosts, as_json)
        return
    target = hosts[0] if hosts else None
    snap = run_on_host(obj, target, lambda c: services.snapshot(c, obj.cfg))
    if as_json:
        print_json(watcher.annotate(snap, obj.cfg.watch, time.time()))  # stalled? host's pace
        return
    from tui.cli.report import format_status

    click.echo(format_status(services.state_of(obj.cfg, snap.runs, snap)))


class _ListByDefault(click.Group):
    """`runs [TARGET]` lists (`runs list`); `runs prune …` prunes."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["list", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_ListByDefault)
def runs() -> None:
    """The runs on the host: list them (the default), show or compare them from their
    timelines, or prune ended ones."""


@runs.command("list")
@targets_arg
@hosts_file_opt
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def runs_list(obj: Ctx, targets: tuple[str, ...], hosts_file: str | None, as_json: bool) -> None:
    """List the runs on the host (the run ledger); with several hosts, every host's
    runs with a HOST column (exit 3 when any host was unreachable)."""
    hosts = fleet_hosts(obj, targets, hosts_file)
    if len(hosts) > 1:
        runs_many(obj, hosts, as_json)
        return
    target = hosts[0] if hosts else None
    warnings: list[str] = []
    result = run_on_host(obj, target, lambda c: services.list_runs(c, obj.cfg, warnings))
    for line in warnings:  # a run dir the agent refused is never left out silently
        click.echo(f"warning: {line}", err=True)
    if as_json:
        print_json({"runs": [r.wire for r in result], "warnings": warnings})
        return
    from tui.cli.report import demo_pointer, format_runs, no_runs

    where = target or obj.cfg.host.target or "local"
    if not result:
        click.echo(no_runs(obj.cfg.host.runs_dir, where, Path.cwd()))
        return
    click.echo(format_runs(services.state_of(obj.cfg, result)))
    pointer = demo_pointer(obj.cfg.host.runs_dir, where, Path.cwd())
    if pointer:  # the demo's runs are elsewhere: said under the list too
        click.echo(pointer)


@runs.command("show")
@target_arg
@click.argument("run_id", required=False)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def runs_show(obj: Ctx, target: str | None, run_id: str | None, as_json: bool) -> None:
    """A run's summary from its timeline on the host (default: the config's latest run):
    load time, time to first output, duration, throughput per phase, GPU-hours,
    attempts, patch version, outcome and phases."""
    if run_id is None and target is not None and RUN_ID.fullmatch(target):
        target, run_id = None, target  # `runs show RUN_ID`: the target comes from the config

    async def body(client: AgentClient) -> dict[str, Any]:
        return (await _shown(client, obj, await services.list_runs(client, obj.cfg), run_id))[0]

    result = run_on_host(obj, target, body)
    if as_json:
        print_json(result)
        return
    from tui.cli.report import format_show

    click.echo(format_show(result))


async def _shown(client: AgentClient, obj: Ctx, found: Sequence[RunRecord], run_id: str | None
                 ) -> tuple[dict[str, Any], RunRecord]:
    """(summary, run record) of one run for `runs show` and `runs compare`."""
    from tui.protocol import hostjson
    from tui.services import timeline

    run = services.choose_run(obj.cfg, found, run_id)
    if run is None or (run_id and run.run_id != run_id):
        raise ValueError(f"no run {run_id} on this host" if run_id else
                         f"no run of {obj.cfg.run.name!r} on this host (runs lists them all)")
    # host numbers: one not finite or beyond 1e15 is left out (None in the record), and said
    rec, bad = run, hostjson.checked(run.wire)[1]
    dropped = f"{bad} number(s) of the run record left out (not finite, or beyond 1e15)" if bad else None
    tl = None if run.external else await timeline.fetch(client, obj.cfg.host.runs_dir, run.run_id)
    if tl is None or not tl.header:
        note = "no timeline: the run has no shim record of its own (adopted, or older)"
        return dict(timeline.summary(timeline.Timeline(), rec), timeline_points=0,
                    note="; ".join(filter(None, [note, dropped]))), rec
    shown = timeline.summary(tl, rec)
    return (dict(shown, note=dropped) if dropped else shown), rec


@runs.command("df")
@target_arg
@click.option("--path", metavar="PATH", help="Where on the host (default: the run's cwd, else the runs dir).")
@click.pass_obj
def runs_df(obj: Ctx, target: str | None, path: str | None) -> None:
    """Free space where the config's run writes (the `D` key's twin): its cwd, else the
    runs dir; a line that ends in "low" when a checkpoint may not fit."""

    async def body(client: AgentClient) -> str:
        run = None if path else services.choose_run(obj.cfg, await services.list_runs(client, obj.cfg))
        return (await client.disk_usage(
            path or (run.cwd if run is not None and run.cwd else obj.cfg.host.runs_dir))).summary()

    click.echo(run_on_host(obj, target, body))


@runs.command("compare")
@click.argument("args", nargs=-1, required=True, metavar="[TARGET] RUN_A RUN_B")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def runs_compare(obj: Ctx, args: tuple[str, ...], as_json: bool) -> None:
    """Two runs side by side from their timelines: load, first output, duration,
    throughput per phase, GPU-hours, peak memory per card, outcome, patch version,
    and where their argv and env differ."""
    from tui.services import timeline

    if len(args) not in (2, 3):
        fail("runs compare needs two run ids (and an optional TARGET first)", EXIT_USAGE)
    target, (a_id, b_id) = (args[0] if len(args) == 3 else None), args[-2:]

    async def body(client: AgentClient) -> dict[str, Any]:
        found = await services.list_runs(client, obj.cfg)
        (a, ra), (b, rb) = await _shown(client, obj, found, a_id), await _shown(client, obj, found, b_id)
        return timeline.compare(a, b, ra, rb)

    result = run_on_host(obj, target, body)
    if as_json:
        print_json(result)
        return
    from tui.cli.report import format_compare

    click.echo(format_compare(result))


DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    m = DURATION.fullmatch(value.strip())
    if not m:
        raise click.BadParameter(f"{value!r} is not a duration like 90s, 30m, 12h, 7d or 2w")
    return float(m.group(1)) * UNITS[m.group(2)]


@runs.command("prune")
@target_arg
@click.option("--older-than", callback=_duration, metavar="AGE",
              help="Only runs that ended more than AGE ago (90s, 30m, 12h, 7d, 2w).")
@click.option("--keep", type=click.IntRange(min=0), metavar="N",
              help="Keep the N newest ended runs (of those selected).")
@click.option("--demo", is_flag=True, help="Only the runs `eagle3-tui demo` launched.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def runs_prune(obj: Ctx, target: str | None, older_than: float | None, keep: int | None,
               demo: bool, dry_run: bool, as_json: bool) -> None:
    """Remove ended runs: their directory (record, log) on the host. Never a live run."""
    if older_than is None and keep is None and not demo:
        fail("runs prune needs --older-than AGE, --keep N or --demo (all ended runs: --keep 0)",
             EXIT_USAGE)
    result = run_on_host(obj, target, lambda c: services.prune(
        c, obj.cfg, older_than=older_than, keep=keep, demo=demo, dry_run=dry_run))
    if as_json:
        print_json(result.record)
        return
    verb = "would remove" if dry_run else "removed"
    for r in result.removed:
        click.echo(f"{verb} {r.run_id}  {r.name or ''}  {r.state}")
    skipped = result.skipped
    for r in skipped:  # the same decision in a dry run as in the real one, with its reason
        click.echo(f"{'would keep' if dry_run else 'kept'} {r.run_id}: {r.reason}")
    click.echo(f"{verb} {len(result.removed)} run(s); {result.kept} ended run(s) kept"
               + (f" ({len(skipped)} of them for the reason given)" if skipped else ""))


@click.command()
@target_arg
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def launch(obj: Ctx, target: str | None, as_json: bool) -> None:
    """Launch the config's [run] on the host."""

    async def body(client: AgentClient) -> LaunchReply:
        return await services.launch(client, obj.cfg, await services.patch_state(client, obj.cfg))

    record = run_on_host(obj, target, body)
    if as_json:
        print_json(record.record)
    else:
        click.echo(view.launched_text(record))


@click.command()
@target_arg
@click.option("--run", "run_id", metavar="RUN_ID", help="Run to relaunch (default: the config's latest).")
@click.option("--kill", "kill_first", is_flag=True, help="Kill the run first if it is still alive.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (needed without a terminal).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def relaunch(obj: Ctx, target: str | None, run_id: str | None, kill_first: bool, yes: bool, as_json: bool) -> None:
    """Launch again with the same argv, cwd and env as a previous run."""

    async def body(client: AgentClient) -> LaunchReply:
        run = services.choose_run(obj.cfg, await services.list_runs(client, obj.cfg), run_id)
        if run_id and run is None:
            raise ValueError(f"no run {run_id} on this host")
        if run is not None and run.alive:
            if not kill_first:
                raise ValueError(
                    f"run {run.run_id} is still {run.state} ({view.whose(run)}); use --kill to kill it first"
                )
            await confirm(f"kill run {run.run_id} ({' '.join(run.argv)[:60]}, {view.whose(run)}) first, "
                          "then relaunch it?", yes, "relaunch")
            act = await _kill(client, obj.cfg, run.run_id, None)
            if not act.done or not (isinstance(act.result, KillReport) and act.result.ok):
                raise ValueError("kill did not finish: " + view.action_text(act))
            run = replace(run, state="killed")
        else:  # an ended run (or the config's command): launching is an action too, asked first
            argv = run.argv if run is not None and not run.external else obj.cfg.run.command
            what = f"run {run.run_id}" if run is not None else "the config's run"
            await confirm(f"relaunch {what}: {' '.join(argv)[:60]}?", yes, "relaunch")
        return await services.relaunch(client, obj.cfg, run, await services.patch_state(client, obj.cfg),
                                       action=services.new_action_id())

    record = run_on_host(obj, target, body)
    if as_json:
        print_json(record.record)
    else:
        click.echo(view.launched_text(record))


async def _kill(client: AgentClient, cfg: Config, run_id: str,
                progress: Callable[[KillProgress], object] | None) -> Action:
    """Kill through the same route as the `k` key: an action under an id, settled by
    `services.settle` through the reducer; a reply lost with the link is asked for
    after the reconnect."""
    aid = services.new_action_id()
    state = apply(AppState(), ActionStarted(aid, "kill", run_id), time.time())

    def record(event: services.ActionEvent) -> None:
        nonlocal state
        if isinstance(event, ActionUnconfirmed):
            click.echo(f"  link lost ({event.error}); asking the host for the outcome after the reconnect",
                       err=True)
        state = apply(state, event, time.time())

    await services.settle(client, cfg.host.runs_dir, aid,
                          services.kill(client, cfg, run_id, progress, action=aid),
                          KillReport.parse, record, timeout=OUTCOME_WAIT)
    act = state.action(aid)
    assert act is not None
    return act


@click.command()
@target_arg
@click.argument("run_id", required=False)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (needed without a terminal).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def kill(obj: Ctx, target: str | None, run_id: str | None, yes: bool, as_json: bool) -> None:
    """Kill a run (default: the one the dashboard selects) and wait until its GPUs are free."""

    if run_id is None and target is not None and RUN_ID.fullmatch(target):
        target, run_id = None, target  # `kill RUN_ID`: the target comes from the config

    async def body(client: AgentClient) -> tuple[dict[str, Any], KillReport | None]:
        run = services.choose_run(obj.cfg, await services.list_runs(client, obj.cfg), run_id)
        if run is None:
            raise ValueError(f"no run {run_id} on this host" if run_id else
                             f"no run of {obj.cfg.run.name!r} on this host (runs lists them all)")
        if not run.alive:
            code = run.exit_code if run.exit_code is not None else run.signal
            return {"run_id": run.run_id, "ok": True, "already": run.state, "exit": code,
                    "message": view.already_ended(run)}, None
        await confirm(f"kill run {run.run_id} ({' '.join(run.argv)[:60]}, {view.whose(run)})?", yes, "kill")
        if run.job_id and run.state == "running" and obj.cfg.run.node_agent != "off":
            # the GPU-free proof is read on the job's nodes, by agents inside the job (README
            # "Runs through Slurm"), as the dashboard's kill does; without them the kill
            # still goes ahead and says the proof needs an agent there
            try:
                await client.follow_job(run.run_id, obj.cfg.run.node_agent)
                await client.snapshot()  # the agent starts the job's node agents as it takes one
            except AgentRequestError:
                pass

        def progress(ev: KillProgress) -> None:
            if not as_json:
                click.echo(f"  {ev.stage}: {len(ev.alive)} process(es) left, {ev.elapsed:.1f} s", err=True)

        act = await _kill(client, obj.cfg, run.run_id, progress)
        killed = act.result if isinstance(act.result, KillReport) else None
        report = dict(killed.record if killed is not None else
                      {"run_id": run.run_id, "ok": False, "error": act.error})
        report["confirmed_after_reconnect"] = act.confirmed_after_reconnect
        report["message"] = view.action_text(act)
        return report, killed

    report, killed = run_on_host(obj, target, body, reconnect=True)
    if as_json:
        print_json(report)
    elif report.get("already"):
        click.echo(f"{report['message']}; nothing to kill")
    elif killed is not None and report.get("stages") is not None:
        click.echo("\n".join([report["message"], *view.describe_kill(killed)[1:]]))
    else:
        click.echo(report["message"])
    if not report.get("ok") or report.get("gpus_free") is False:
        sys.exit(EXIT_FAILED)
