"""What every `eagle3-tui` command shares: the context object (config, SSH options),
running one coroutine against a host with every expected failure mapped to one line and
an exit code, and the global options accepted after a subcommand too."""


from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
import sys
from typing import Any, Awaitable, Callable, NoReturn, TypeVar

import click

from tui import trace
from tui.protocol.hosttext import clean
from tui.services import actions as services
from tui.services.config import Config, ConfigError, load_config
from tui.transport import AgentClient, AgentRequestError, TransportError
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


def fail(message: str, code: int) -> NoReturn:
    """One line on stderr and exit `code`. The message often quotes the host (an agent's
    error, a path): it passes the sanitizer on its way out, whatever it was built from."""
    click.echo(f"eagle3-tui: {clean(message)}", err=True)
    sys.exit(code)


class NotConfirmed(Exception):
    """A confirmation that cannot be asked (no terminal) and `--yes` was not given: a
    usage mistake (exit 2), said in one line, before anything is done."""


async def confirm(prompt: str, yes: bool, command: str) -> None:
    """Ask `prompt` (y/N) unless `yes`; raise ValueError("cancelled") on no. Without a
    terminal on stdin nothing can be asked: `NotConfirmed`, never a silent yes."""
    if yes:
        return
    if sys.stdin is None or not sys.stdin.isatty():
        raise NotConfirmed(f"{command} asks before it acts and stdin is not a terminal: "
                           f"pass --yes to {command} without asking")
    if not await asyncio.to_thread(click.confirm, prompt, default=False):
        raise ValueError("cancelled")


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
    except (ConfigError, TargetError, NotConfirmed) as exc:
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
    """Refuse at once, before Textual starts, when there is no terminal to draw on.
    A session of `eagle3-tui serve` draws in a browser: Textual's web driver, no terminal."""
    if os.environ.get("TEXTUAL_DRIVER", "").endswith("web_driver:WebDriver"):
        return
    for name, stream in (("stdin", sys.stdin), ("stdout", sys.stdout), ("stderr", sys.stderr)):
        if stream is None or not stream.isatty():
            fail(f"{command} needs a terminal ({name} is not one); without a screen use "
                 "`eagle3-tui status --json`, `eagle3-tui runs`, `eagle3-tui demo --headless`",
                 EXIT_USAGE)


def run_app(make: Callable[[], Any], client: AgentClient | None = None) -> None:
    """Run the app `make()` builds; a fatal error ends it with its one line and exit
    code. `client` (one host's dashboard) starts connecting while Textual is imported
    (in a thread), so the agent's hello is often there before the first frame (the
    dashboard reports a failure of this early start as its own)."""

    async def main() -> Any:
        trace.mark("cli ready")
        if client is not None:
            early = asyncio.ensure_future(client.start())
            early.add_done_callback(lambda f: f.cancelled() or f.exception())  # reported by the app
        await asyncio.to_thread(importlib.import_module, "tui.views.app")
        trace.mark("textual imported")
        app = make()
        try:
            await app.run_async()
        finally:
            await asyncio.to_thread(app.close_hooks)
        return app

    app = asyncio.run(main())
    if app.fatal_error:
        fail(app.fatal_error, app.return_code or EXIT_CONNECT)
    if app.return_code:  # the terminal hung up (129): nobody is there to read a line
        raise SystemExit(app.return_code)


def print_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))


target_arg = click.argument("target", required=False)


def _setter(attr: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def set_on_ctx(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value not in (None, False):
            setattr(ctx.ensure_object(Ctx), attr, value)

    return set_on_ctx


def add_host_options(cmd: click.Command) -> None:
    """Accept the global options after the subcommand too (`connect local --config F`)."""
    cmd.params += [
        click.Option(["--config"], metavar="FILE", expose_value=False, callback=_setter("config_path"),
                     help="eagle3.toml to use (default ./eagle3.toml)."),
        click.Option(["-F"], metavar="FILE", expose_value=False, callback=_setter("ssh_config"),
                     help="SSH config file, as with ssh -F."),
        click.Option(["--accept-new-host-key"], is_flag=True, expose_value=False,
                     callback=_setter("accept_new"), help="Trust an unknown host key on first use."),
    ]
