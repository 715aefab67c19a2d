"""`eagle3-tui connect` (the live dashboard) and `eagle3-tui demo` (the embedded tiny run)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from tui.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    Ctx,
    fail,
    need_terminal,
    run_app,
    run_on_host,
)
from tui.cli.fleet import fleet_hosts, hosts_file_opt, targets_arg
from tui.protocol.records import RunRecord
from tui.services import actions as services
from tui.services.config import Config, ConfigError, load_config
from tui.transport import AgentClient, TransportError

read_only_opt = click.option(
    "--read-only", is_flag=True,
    help="Watch only: kill, relaunch, launch, patch push and rollback are off.")


@click.command()
@targets_arg
@hosts_file_opt
@read_only_opt
@click.pass_obj
def connect(obj: Ctx, targets: tuple[str, ...], hosts_file: str | None, read_only: bool) -> None:
    """Open the live dashboard; with several hosts, the fleet (enter opens a host)."""
    need_terminal("connect")
    try:
        cfg = obj.cfg
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    hosts = fleet_hosts(obj, targets, hosts_file)
    if len(hosts) > 1:
        try:
            clients = {h: obj.client(h, reconnect=True) for h in hosts}
        except TransportError as exc:  # a malformed target or SSH config
            fail(str(exc), EXIT_USAGE)
        def make_fleet() -> Any:
            from tui.views.app import make_fleet_app

            return make_fleet_app(clients, cfg, cfg.fleet.connect_limit, read_only)

        run_app(make_fleet)  # the fleet screen paces its own connects
        return
    name = obj.target(hosts[0] if hosts else None)
    try:
        client = obj.client(name, reconnect=True)
    except TransportError as exc:  # a malformed target or SSH config
        fail(str(exc), EXIT_USAGE)

    def make() -> Any:
        from tui.views.app import make_app  # Textual is imported only for the dashboard

        return make_app(client, cfg, name, read_only=read_only)

    run_app(make, client)


@click.command()
@click.option(
    "--dir", "demo_dir", default="eagle3-demo", show_default=True, metavar="DIR",
    help="Where to build the demo model, dataset, outputs and eagle3.toml.",
)
@click.option("--headless", is_flag=True,
              help="No dashboard: print progress and the outcome; exit 0 only if the run finished.")
@click.option("--timeout", type=float, metavar="SECONDS", help="With --headless: give up after this long.")
@click.option("--train", is_flag=True,
              help="Then train a drafter on the outputs with speculators' own trainer (CPU, its own venv).")
@click.pass_obj
def demo(obj: Ctx, demo_dir: str, headless: bool, timeout: float | None, train: bool) -> None:
    """The embedded default: a real (tiny) extraction run on this machine, in the dashboard.

    Builds a random Llama-style model as 64 safetensors shards and a token dataset (no
    downloads), launches remote/extract.py through the normal launch path on `local`,
    and opens the dashboard on it (or, with --headless, follows it to its end).
    Exits non-zero whenever the demo run did not finish.
    """
    from tui.services.demo import DemoError, build_demo, check_job, demo_intro, torch_of
    from tui.services.statefile import remember_demo

    if not headless:
        need_terminal("demo")
    # the first line: which torch the job runs on (its venv sees this interpreter's)
    click.echo(f"the demo's job runs on {torch_of(sys.executable)}", err=True)
    text, finished = demo_intro(Path(demo_dir))
    click.echo(text, err=True)
    try:
        paths = build_demo(Path(demo_dir), clear_out=finished)
        check_job(paths)
        cfg = load_config(paths.config)
    except (DemoError, ConfigError) as exc:
        fail(str(exc), EXIT_USAGE)
    except OSError as exc:  # --dir a file, or a place this user cannot write
        fail(f"cannot build the demo in {demo_dir}: {exc.strerror or exc}", EXIT_USAGE)
    remember_demo(paths.config.parent)  # `runs` points here from any directory
    if paths.patches_note:
        click.echo(f"patch demo unavailable: {paths.patches_note}", err=True)
    if paths.busy:
        click.echo("a demo run is still going: attaching to it", err=True)
    run: RunRecord | None
    if headless or train:  # with --train the extraction is the first stage: followed, not shown
        run = run_on_host(obj, "local", lambda c: _demo_headless(c, cfg, paths.busy, timeout), cfg=cfg)
    else:
        client = services.new_client("local", cfg, reconnect=True)

        def make() -> Any:
            from tui.views.app import make_app

            return make_app(client, cfg, "local", launch=not paths.busy)

        run_app(make, client)
        runs = run_on_host(obj, "local", lambda c: services.list_runs(c, cfg), cfg=cfg)
        run = newest_run(runs, cfg.run.name)
    _say_end("demo run", run, paths.config,
             f"demo outputs: {paths.out}/ (data_config.json describes them); config: {paths.config}")
    if train:
        _demo_train(obj, paths, headless, timeout)


def _demo_train(obj: Ctx, paths: Any, headless: bool, timeout: float | None) -> None:
    """The second stage (tui/services/demo_train.py): speculators' Trainer on the outputs."""
    from tui.services.demo import DemoError
    from tui.services.demo_train import build_train

    click.echo("preparing the training stage (the first time installs transformers 4.x and "
               "speculators into train-venv/, ~1 min)…", err=True)
    try:
        tp = build_train(paths, sys.executable)
        cfg = load_config(tp.config)
    except (DemoError, ConfigError) as exc:
        fail(f"training stage unavailable: {exc}", EXIT_FAILED)
    run: RunRecord | None
    if headless:
        run = run_on_host(obj, "local", lambda c: _demo_headless(c, cfg, False, timeout), cfg=cfg)
    else:
        client = services.new_client("local", cfg, reconnect=True)

        def make() -> Any:
            from tui.views.app import make_app

            return make_app(client, cfg, "local", launch=True)

        run_app(make, client)
        runs = run_on_host(obj, "local", lambda c: services.list_runs(c, cfg), cfg=cfg)
        run = newest_run(runs, cfg.run.name)
    _say_end("training run", run, tp.config, f"drafter checkpoints: {tp.save}/; config: {tp.config}")


def newest_run(runs: Sequence[RunRecord], name: str) -> RunRecord | None:
    """The stage's run: the newest of its name (the agent lists runs newest first), so a
    second `demo --train` in the same directory reports its own run, not the first one."""
    return next((r for r in runs if r.name == name and not r.external), None)


def _say_end(what: str, run: RunRecord | None, config: Any, where: str) -> None:
    """A demo stage's outcome in one line: finished (exit 0 follows), else why not (exit 1)."""
    from tui.services.headless import describe_end, succeeded

    if run is None:
        fail(f"the {what} was never launched; {where}", EXIT_FAILED)
    elif run.state == "running":
        fail(f"{what} {run.run_id} is still running (watch it: eagle3-tui --config "
             f"{config} connect); {where}", EXIT_FAILED)
    elif not succeeded(run):
        fail(f"{what} {run.run_id} did not finish: {describe_end(run)} "
             f"(log: {run.log}); {where}", EXIT_FAILED)
    click.echo(f"{what} {run.run_id} finished; {where}")


async def _demo_headless(client: AgentClient, cfg: Config, attach: bool,
                         timeout: float | None) -> RunRecord:
    from tui.services.headless import follow

    if attach:
        runs = await services.list_runs(client, cfg)
        record = next(r for r in runs if r.state == "running" and r.name == cfg.run.name)
    else:
        record = ((await services.launch(client, cfg, await services.patch_state(client, cfg))).run
                  or RunRecord.parse({}))
    click.echo(f"launched demo run {record.run_id} (pid {record.pid}), log {record.log}")
    return await follow(client, record.run_id, click.echo, timeout)
