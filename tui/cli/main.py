"""The `eagle3-tui` click group: global options, and every command group registered.

Every TUI key has a non-interactive twin here. User mistakes (unreachable host, auth
failure, bad config, bad log file) print one line to stderr and exit non-zero;
tracebacks are for bugs only. One module per command group sits beside this one.
"""

from __future__ import annotations

import click

from tui import __version__
from tui.cli.common import Ctx, add_host_options
from tui.cli.connect import connect, demo
from tui.cli.init import init
from tui.cli.inspect import inspect
from tui.cli.patch import patch
from tui.cli.replay import replay
from tui.cli.runs import kill, launch, relaunch, runs, status
from tui.cli.serve import serve
from tui.cli.watch import watch


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


for _cmd in (init, connect, serve, demo, status, runs, launch, relaunch, kill, inspect, patch, watch, replay):
    main.add_command(_cmd)

for _cmd in [*main.commands.values(), *patch.commands.values(), *runs.commands.values()]:
    if not isinstance(_cmd, click.Group) and _cmd is not init:  # init reads no host
        add_host_options(_cmd)

if __name__ == "__main__":  # pragma: no cover
    main()
