"""The `eagle3-tui` command. Every TUI key has a non-interactive twin here.

User mistakes (unreachable host, auth failure, bad config, bad log file) print one
line to stderr and exit non-zero; tracebacks are for bugs only.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

import click

from tui import __version__, services
from tui.config import Config, ConfigError, load_config
from tui.state import view
from tui.state.model import Action, AppState
from tui.state.reducer import ActionEnded, ActionStarted, apply
from tui.transport import AgentClient, AgentRequestError, LinkLost, TransportError
from tui.transport import ConfigError as TargetError

T = TypeVar("T")
RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{4}|ext-\d+-\d+")  # what runner.py names runs

# Exit codes: 0 ok, 1 the action failed (e.g. GPUs not freed), 2 usage/config error,
# 3 cannot reach or start the agent on the host.
EXIT_FAILED, EXIT_USAGE, EXIT_CONNECT = 1, 2, 3
OUTCOME_WAIT = 120.0  # seconds `kill` waits for the link to come back to learn its outcome


class Ctx:
    def __init__(self, config: str | None, ssh_config: str | None, accept_new: bool) -> None:
        self.config_path = config
        self.ssh_config = ssh_config
        self.accept_new = accept_new
        self._cfg: Config | None = None

    @property
    def cfg(self) -> Config:
        if self._cfg is None:
            self._cfg = load_config(self.config_path)
            for warning in self._cfg.warnings:
                click.echo(f"eagle3-tui: warning: {warning}", err=True)
        return self._cfg

    def target(self, target: str | None) -> str:
        return services.resolve_target(target, self.cfg)

    def client(self, target: str, reconnect: bool = False) -> AgentClient:
        return services.new_client(
            target,
            self.cfg,
            ssh_config=self.ssh_config,
            accept_new_host_key=self.accept_new,
            reconnect=reconnect,
        )


def fail(message: str, code: int) -> None:
    click.echo(f"eagle3-tui: {message}", err=True)
    sys.exit(code)


def run_on_host(
    ctx: Ctx, target: str | None, body: Callable[[AgentClient], Awaitable[T]],
    reconnect: bool = False, cfg: Config | None = None,
) -> T:
    """Connect, run `body(client)`, close; map every expected failure to one line.
    `reconnect`: a dropped link is re-established (kill asks for its outcome then).
    `cfg`: use this config (and its target) instead of the command line's."""

    async def main() -> T:
        client = (services.new_client(target or "local", cfg, reconnect=reconnect) if cfg
                  else ctx.client(ctx.target(target), reconnect=reconnect))
        try:
            await client.start()
            return await body(client)
        finally:
            await client.close()

    try:
        return asyncio.run(main())
    except (ConfigError, TargetError) as exc:
        fail(str(exc), EXIT_USAGE)
    except TransportError as exc:
        fail(str(exc), EXIT_CONNECT)
    except (AgentRequestError, ValueError, TimeoutError) as exc:
        fail(str(exc), EXIT_FAILED)
    except OSError as exc:
        fail(f"{exc.strerror or exc}", EXIT_CONNECT)
    except KeyboardInterrupt:
        fail("interrupted", 130)
    raise AssertionError("unreachable")


def need_terminal(command: str) -> None:
    """Refuse at once, before Textual starts, when there is no terminal to draw on."""
    for name, stream in (("stdin", sys.stdin), ("stdout", sys.stdout), ("stderr", sys.stderr)):
        if stream is None or not stream.isatty():
            fail(f"{command} needs a terminal ({name} is not one); without a screen use "
                 "`eagle3-tui status --json`, `eagle3-tui runs`, `eagle3-tui demo --headless`",
                 EXIT_USAGE)


def run_app(make: Callable[[], Any], client: AgentClient) -> None:
    """Run the dashboard `make()` builds; a fatal error ends it with its one line and
    exit code. The client starts connecting while Textual is imported (in a thread), so
    the agent's hello is often there before the first frame (the dashboard reports a
    failure of this early start as its own)."""

    async def main() -> Any:
        early = asyncio.ensure_future(client.start())
        early.add_done_callback(lambda f: f.cancelled() or f.exception())  # reported by the app
        await asyncio.to_thread(importlib.import_module, "tui.app")
        app = make()
        await app.run_async()
        return app

    app = asyncio.run(main())
    if app.fatal_error:
        fail(app.fatal_error, app.return_code or EXIT_CONNECT)


def print_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))


target_arg = click.argument("target", required=False)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="eagle3-tui")
@click.option("--config", "config", metavar="FILE", help="eagle3.toml to use (default ./eagle3.toml).")
@click.option("-F", "ssh_config", metavar="FILE", help="SSH config file, as with ssh -F.")
@click.option(
    "--accept-new-host-key",
    is_flag=True,
    help="Trust an unknown host key on first use and add it to known_hosts.",
)
@click.pass_context
def main(ctx: click.Context, config: str | None, ssh_config: str | None, accept_new_host_key: bool) -> None:
    """Supervise long-running GPU runs on a remote host over SSH.

    TARGET is `local`, [user@]host[:port], or a Host alias from the SSH config;
    without it, `[host] target` from eagle3.toml, else local.
    """
    ctx.obj = Ctx(config, ssh_config, accept_new_host_key)


@main.command()
@target_arg
@click.pass_obj
def connect(obj: Ctx, target: str | None) -> None:
    """Open the live dashboard."""
    need_terminal("connect")
    try:
        cfg = obj.cfg
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    name = obj.target(target)
    try:
        client = obj.client(name, reconnect=True)
    except TransportError as exc:  # a malformed target or SSH config
        fail(str(exc), EXIT_USAGE)
    def make() -> Any:
        from tui.app import make_app  # Textual is imported only for the dashboard

        return make_app(client, cfg, name)

    run_app(make, client)


@main.command()
@click.option(
    "--dir", "demo_dir", default="eagle3-demo", show_default=True, metavar="DIR",
    help="Where to build the demo model, dataset, outputs and eagle3.toml.",
)
@click.option("--headless", is_flag=True,
              help="No dashboard: print progress and the outcome; exit 0 only if the run finished.")
@click.option("--timeout", type=float, metavar="SECONDS", help="With --headless: give up after this long.")
@click.pass_obj
def demo(obj: Ctx, demo_dir: str, headless: bool, timeout: float | None) -> None:
    """The embedded default: a real (tiny) extraction run on this machine, in the dashboard.

    Builds a random Llama-style model as 64 safetensors shards and a token dataset (no
    downloads), launches remote/extract.py through the normal launch path on `local`,
    and opens the dashboard on it (or, with --headless, follows it to its end).
    Exits non-zero whenever the demo run did not finish.
    """
    from tui.demo import DemoError, build_demo, check_job

    if not headless:
        need_terminal("demo")
    click.echo(f"preparing the demo in {demo_dir}/ (the first time takes ~10 s)…", err=True)
    try:
        paths = build_demo(Path(demo_dir), clear_out=True)
        check_job(paths)
        cfg = load_config(paths.config)
    except (DemoError, ConfigError) as exc:
        fail(str(exc), EXIT_USAGE)
    if paths.patches_note:
        click.echo(f"patch demo unavailable: {paths.patches_note}", err=True)
    if paths.busy:
        click.echo("a demo run is still going: attaching to it", err=True)
    if headless:
        run = run_on_host(obj, "local", lambda c: _demo_headless(c, cfg, paths.busy, timeout), cfg=cfg)
    else:
        client = services.new_client("local", cfg, reconnect=True)

        def make() -> Any:
            from tui.app import make_app

            return make_app(client, cfg, "local", launch=not paths.busy)

        run_app(make, client)
        runs = run_on_host(obj, "local", lambda c: services.list_runs(c, cfg), cfg=cfg)
        run = next((r for r in runs if r.get("name") == cfg.run.name and not r.get("external")), None)
    from tui.headless import describe_end, succeeded

    where = f"demo outputs: {paths.out}/ (data_config.json describes them); config: {paths.config}"
    if run is None:
        fail(f"the demo run was never launched; {where}", EXIT_FAILED)
    elif run.get("state") == "running":
        fail(f"demo run {run['run_id']} is still running (watch it: eagle3-tui --config "
             f"{paths.config} connect); {where}", EXIT_FAILED)
    elif not succeeded(run):
        fail(f"demo run {run['run_id']} did not finish: {describe_end(run)} "
             f"(log: {run.get('log')}); {where}", EXIT_FAILED)
    click.echo(f"demo run {run['run_id']} finished; {where}")


async def _demo_headless(client: AgentClient, cfg: Config, attach: bool,
                         timeout: float | None) -> dict[str, Any]:
    from tui.headless import follow

    if attach:
        runs = await services.list_runs(client, cfg)
        record = next(r for r in runs if r.get("state") == "running" and r.get("name") == cfg.run.name)
    else:
        record = await services.launch(client, cfg, await services.patch_state(client, cfg))
    click.echo(f"launched demo run {record['run_id']} (pid {record.get('pid')}), log {record.get('log')}")
    return await follow(client, record["run_id"], click.echo, timeout)


@main.command()
@target_arg
@click.option("--json", "as_json", is_flag=True, help="Print the snapshot as JSON.")
@click.pass_obj
def status(obj: Ctx, target: str | None, as_json: bool) -> None:
    """Print one snapshot of the host and exit."""
    snap = run_on_host(obj, target, lambda c: services.snapshot(c, obj.cfg))
    snap = {k: v for k, v in snap.items() if k != "type"}
    if as_json:
        print_json(snap)
        return
    from tui.report import format_status

    click.echo(format_status(snap, services.state_of(obj.cfg, list(snap.get("runs") or []), snap)))


class _ListByDefault(click.Group):
    """`runs [TARGET]` lists (`runs list`); `runs prune …` prunes."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["list", *args]
        return super().parse_args(ctx, args)


@main.group(cls=_ListByDefault)
def runs() -> None:
    """The runs on the host: list them (the default), or prune ended ones."""


@runs.command("list")
@target_arg
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def runs_list(obj: Ctx, target: str | None, as_json: bool) -> None:
    """List the runs on the host (the run ledger)."""
    result = run_on_host(obj, target, lambda c: services.list_runs(c, obj.cfg))
    if as_json:
        print_json({"runs": result})
        return
    from tui.report import format_runs

    click.echo(format_runs(services.state_of(obj.cfg, result)))


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
        print_json(result)
        return
    verb = "would remove" if dry_run else "removed"
    for r in result["removed"]:
        click.echo(f"{verb} {r['run_id']}  {r.get('name') or ''}  {r.get('state')}")
    click.echo(f"{verb} {len(result['removed'])} run(s); {result['kept']} ended run(s) kept")


@main.command()
@target_arg
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def launch(obj: Ctx, target: str | None, as_json: bool) -> None:
    """Launch the config's [run] on the host."""

    async def body(client: AgentClient) -> dict[str, Any]:
        return await services.launch(client, obj.cfg, await services.patch_state(client, obj.cfg))

    record = run_on_host(obj, target, body)
    if as_json:
        print_json(record)
    else:
        click.echo(f"launched run {record.get('run_id')} (pid {record.get('pid')}), log {record.get('log')}")


@main.command()
@target_arg
@click.option("--run", "run_id", metavar="RUN_ID", help="Run to relaunch (default: the config's latest).")
@click.option("--kill", "kill_first", is_flag=True, help="Kill the run first if it is still alive.")
@click.option("--yes", is_flag=True, help="Do not ask before killing.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def relaunch(obj: Ctx, target: str | None, run_id: str | None, kill_first: bool, yes: bool, as_json: bool) -> None:
    """Launch again with the same argv, cwd and env as a previous run."""

    async def body(client: AgentClient) -> dict[str, Any]:
        run = services.choose_run(obj.cfg, await services.list_runs(client, obj.cfg), run_id)
        if run_id and run is None:
            raise ValueError(f"no run {run_id} on this host")
        if run is not None and run.alive:
            if not kill_first:
                raise ValueError(
                    f"run {run.run_id} is still running (pid {run.pid}); use --kill to kill it first"
                )
            if not yes and not click.confirm(f"kill run {run.run_id} first?", default=False):
                raise ValueError("cancelled")
            act = await _kill(client, obj.cfg, run.run_id, None)
            if not act.done or not (act.result or {}).get("ok"):
                raise ValueError("kill did not finish: " + view.action_text(act))
            run = services.state_of(obj.cfg, [dict(services.run_dict(run), state="killed")]).runs[0]
        record = await services.relaunch(
            client, obj.cfg, services.run_dict(run) if run is not None else None,
            await services.patch_state(client, obj.cfg), action=services.new_action_id(),
        )
        return record

    record = run_on_host(obj, target, body)
    if as_json:
        print_json(record)
    else:
        click.echo(f"launched run {record.get('run_id')} (pid {record.get('pid')})")


async def _kill(client: AgentClient, cfg: Config, run_id: str, progress: Any) -> Action:
    """Kill through the same route as the `k` key: an action under an id, its outcome
    through the reducer; a reply lost with the link is asked for after the reconnect."""
    aid = services.new_action_id()
    state = apply(AppState(), ActionStarted(aid, "kill", run_id), time.time())
    try:
        report = await services.kill(client, cfg, run_id, progress, action=aid)
        event = ActionEnded(aid, True, report)
    except LinkLost as exc:
        click.echo(f"  link lost ({exc}); asking the host for the outcome after the reconnect", err=True)
        rec = await services.outcome(client, aid, cfg.host.runs_dir, timeout=OUTCOME_WAIT)
        event = ActionEnded(aid, bool(rec.get("ok")), rec.get("result"), rec.get("error"),
                            confirmed_after_reconnect=True)
    except AgentRequestError as exc:
        event = ActionEnded(aid, False, None, str(exc))
    act = apply(state, event, time.time()).action(aid)
    assert act is not None
    return act


@main.command()
@target_arg
@click.argument("run_id", required=False)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def kill(obj: Ctx, target: str | None, run_id: str | None, yes: bool, as_json: bool) -> None:
    """Kill a run (default: the one the dashboard selects) and wait until its GPUs are free."""

    if run_id is None and target is not None and RUN_ID.fullmatch(target):
        target, run_id = None, target  # `kill RUN_ID`: the target comes from the config

    async def body(client: AgentClient) -> dict[str, Any]:
        run = services.choose_run(obj.cfg, await services.list_runs(client, obj.cfg), run_id)
        if run is None:
            raise ValueError(f"no run {run_id} on this host" if run_id else
                             f"no run of {obj.cfg.run.name!r} on this host (runs lists them all)")
        if not run.alive:
            code = run.exit_code if run.exit_code is not None else run.signal
            return {"run_id": run.run_id, "ok": True, "already": run.state, "exit": code,
                    "message": view.already_ended(run)}
        if not yes:
            prompt = f"kill run {run.run_id} ({' '.join(run.argv)[:60]}, pid {run.pid})?"
            confirmed = await asyncio.to_thread(click.confirm, prompt, default=False)
            if not confirmed:
                raise ValueError("cancelled")

        def progress(ev: Any) -> None:
            if not as_json:
                click.echo(f"  {ev.stage}: {len(ev.alive)} process(es) left, {ev.elapsed:.1f} s", err=True)

        act = await _kill(client, obj.cfg, run.run_id, progress)
        report = dict(act.result or {"run_id": run.run_id, "ok": False, "error": act.error})
        report["confirmed_after_reconnect"] = act.confirmed_after_reconnect
        report["message"] = view.action_text(act)
        return report

    report = run_on_host(obj, target, body, reconnect=True)
    if as_json:
        print_json(report)
    elif report.get("already"):
        click.echo(f"{report['message']}; nothing to kill")
    elif report.get("stages") is not None:
        lines = view.describe_kill(report)
        click.echo("\n".join([report["message"], *lines[1:]]))
    else:
        click.echo(report["message"])
    if not report.get("ok") or report.get("gpus_free") is False:
        sys.exit(EXIT_FAILED)


@main.command()
@click.argument("logfile")
@click.option("--json", "as_json", is_flag=True)
def inspect(logfile: str, as_json: bool) -> None:
    """Post-mortem of a log file on this machine (`-` reads stdin)."""
    from tui.inspect import format_report, inspect_log

    def chunks(f: Any) -> Any:
        while True:
            block = f.read(1 << 20)
            if not block:
                return
            yield block

    try:
        if logfile == "-":
            result = inspect_log(chunks(sys.stdin.buffer))
        else:
            path = Path(logfile)
            if path.is_dir():
                fail(f"{logfile}: is a directory", EXIT_USAGE)
            with path.open("rb") as f:
                if b"\0" in f.read(8192):
                    fail(f"{logfile}: a binary file, not a log", EXIT_USAGE)
                f.seek(0)
                result = inspect_log(chunks(f))
    except OSError as exc:
        fail(f"{logfile}: {exc.strerror or exc}", EXIT_USAGE)
    from tui.state.logparse import signature_errors

    for err in signature_errors():  # a broken user signature file is skipped, not silent
        click.echo(f"eagle3-tui: warning: {err}", err=True)
    if as_json:
        print_json(result)
    else:
        click.echo(format_report(result))


from tui.cli_patch import patch  # noqa: E402 - cli_patch imports tui.cli lazily, so no cycle

main.add_command(patch)
from tui.watch_cmd import watch  # noqa: E402 - `eagle3-tui watch` (issue 15)

main.add_command(watch)


def _setter(attr: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def set_on_ctx(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value not in (None, False):
            setattr(ctx.ensure_object(Ctx), attr, value)

    return set_on_ctx


def _add_host_options(cmd: click.Command) -> None:
    """Accept the global options after the subcommand too (`connect local --config F`)."""
    cmd.params += [
        click.Option(["--config"], metavar="FILE", expose_value=False, callback=_setter("config_path"),
                     help="eagle3.toml to use (default ./eagle3.toml)."),
        click.Option(["-F"], metavar="FILE", expose_value=False, callback=_setter("ssh_config"),
                     help="SSH config file, as with ssh -F."),
        click.Option(["--accept-new-host-key"], is_flag=True, expose_value=False,
                     callback=_setter("accept_new"), help="Trust an unknown host key on first use."),
    ]


for _cmd in [*main.commands.values(), *patch.commands.values(), *runs.commands.values()]:
    if not isinstance(_cmd, click.Group):
        _add_host_options(_cmd)

if __name__ == "__main__":  # pragma: no cover
    main()
