"""`eagle3-tui patch status|push|rollback|capture`: versioned patch sets on a host.

The work is `tui.services.patches` (the same code the TUI's patch screen runs); this
module parses arguments, asks before writing, and turns every expected failure into
one line on stderr with the CLI's exit codes (0 ok, 1 refused/failed, 2 usage/config,
3 cannot reach the host).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

import click

from tui.cli.common import EXIT_USAGE, Ctx, fail, print_json, run_on_host
from tui.protocol.hosttext import clean, clean_tree
from tui.services import patches as S
from tui.services.config import ConfigError
from tui.state import patches as P
from tui.state.patchtext import STATE_WORDS, describe_state, plan_lines

if TYPE_CHECKING:
    from tui.transport import AgentClient

def _fail(message: str, code: int) -> NoReturn:
    fail(message, code)
    raise AssertionError("unreachable")


def _run(obj: Ctx, target: str | None, body: Any) -> Any:
    async def said_first(client: AgentClient) -> Any:
        # The agent rolled back a push another agent left unfinished before it said
        # hello: say so, and name each file someone else changed since (left as it is).
        for line in client.hello.patch_recovery if client.hello else ():
            click.echo(line, err=True)
        return await body(client)

    return run_on_host(obj, target, said_first)


def _print_json(obj: Any) -> None:
    print_json(obj)


def _load_set(obj: Ctx, set_name: str | None) -> P.PatchSet:
    """The patch set to use (`--set`, else `[patches] set`), loaded; exits 2 when the
    config is bad or no loadable set is named."""
    try:
        cfg = obj.cfg  # loaded (and checked) even when --set is given: bad config is exit 2
    except ConfigError as exc:
        _fail(str(exc), EXIT_USAGE)
    name = set_name or cfg.patches.set
    if not name:
        _fail("no patch set: pass --set NAME or set [patches] set in eagle3.toml", EXIT_USAGE)
    try:
        return P.load_set(name)
    except P.PatchError as exc:
        _fail(str(exc), EXIT_USAGE)


def _host(client: AgentClient, fallback: str) -> str:
    """The host as the confirmation names it: the target is the user's text, cleaned."""
    hello = client.hello
    target = clean(fallback, newline=False)
    return f"{hello.hostname} ({target})" if hello and hello.hostname else target


def _print_status(st: dict[str, Any]) -> None:
    st = clean_tree(st)
    click.echo(describe_state(st))
    click.echo(f"  set      {st['set']} (for {st['target']}; host has "
               f"{st.get('distribution_version') or 'unknown version'})")
    click.echo(f"  package  {st['package_dir']}")
    for rel, f in st["files"].items():
        sha = (f.get("sha256") or "-")[:12]
        backup = "  backup" if f.get("backup") else ""
        click.echo(f"  {rel}  {f.get('state')}  sha256 {sha}{backup}")


def _print_done(st: dict[str, Any]) -> None:
    st = clean_tree(st)  # the host's paths, as the terminal may show them
    was = STATE_WORDS.get(st.get("previous_state", ""), st.get("previous_state"))
    click.echo(f"{describe_state(st)} (was {was})" + ("  [forced over hand edits]" if st.get("forced") else ""))
    for rel, f in st["files"].items():
        mark = "written  " if rel in st.get("written", ()) else "unchanged"
        click.echo(f"  {mark}  sha256 {f.get('sha256')}  {f.get('abs_path')}")


@contextmanager
def _one_line() -> Iterator[None]:
    """Turn a refused or failed patch action into the ValueError `run_on_host` prints as
    one line (exit 1); a refusal's diff, if any, goes to stderr first."""
    try:
        yield
    except S.PatchServiceError as exc:
        if exc.detail:
            click.echo(exc.detail, err=True, nl=not exc.detail.endswith("\n"))
        raise ValueError(str(exc)) from None
    except P.PatchError as exc:
        raise ValueError(str(exc)) from None


def _transition(obj: Ctx, target: str | None, pset: P.PatchSet, goal: str, yes: bool,
                force: bool, as_json: bool) -> None:
    """Move the host's files to `goal` (a version name or `pristine`), asking first."""
    python = obj.cfg.host.python
    title = "" if goal == P.PRISTINE else P.get_version(pset, goal).title
    host_name = obj.target(target)

    async def body(client: AgentClient) -> dict[str, Any]:
        with _one_line():
            st = await S.status(client, pset.name, python)
            if st["state"] == P.MISSING or (st["state"] == P.UNKNOWN and not force):
                refused = await S.would_refuse(client, pset.name, goal, python, force=force)
                if refused is None:  # changed under us between the two reads
                    raise S.PatchServiceError("the host files changed while checking them; try again")
                raise refused
            if st["state"] != goal and not yes:
                prompt = "\n".join(plan_lines(st, goal, title, _host(client, host_name))) + "\nProceed?"
                if not await asyncio.to_thread(click.confirm, prompt, default=False, err=True):
                    raise ValueError("cancelled")
            if goal == P.PRISTINE:
                return await S.rollback(client, pset.name, python, force=force)
            return await S.push(client, pset.name, goal, python, force=force)

    report = _run(obj, target, body)
    if as_json:
        _print_json(report)
    else:
        _print_done(report)


target_arg = click.argument("target", required=False)
set_opt = click.option("--set", "set_name", metavar="NAME", help="Patch set (default: [patches] set in eagle3.toml).")
json_opt = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
yes_opt = click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
force_opt = click.option("--force", is_flag=True, help="Overwrite files edited by hand.")


def _set_on_ctx(attr: str) -> Any:
    """A callback that stores a global option given after `patch` on the shared `Ctx`."""

    def store(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value in (None, False):
            return  # not given here: keep what `eagle3-tui --config …` set
        obj = ctx.obj
        if obj is None:  # the group invoked on its own (tests); `main` normally made it
            obj = ctx.ensure_object(Ctx)
        setattr(obj, attr, value)

    return store


# The global options, accepted after `patch` too (`eagle3-tui patch --config F status`);
# tui.cli adds the same to each patch subcommand, but skips groups.
@click.group()
@click.option("--config", metavar="FILE", expose_value=False, callback=_set_on_ctx("config_path"),
              help="eagle3.toml to use (default ./eagle3.toml).")
@click.option("-F", metavar="FILE", expose_value=False, callback=_set_on_ctx("ssh_config"),
              help="SSH config file, as with ssh -F.")
@click.option("--accept-new-host-key", is_flag=True, expose_value=False,
              callback=_set_on_ctx("accept_new"), help="Trust an unknown host key on first use.")
def patch() -> None:
    """Versioned patch sets for an installed library on the host (see patches/README.md).

    The host's state is recognised by hashing its files: `pristine`, a version name,
    `unknown` (edited by hand) or `missing`.
    """


@patch.command("status")
@target_arg
@set_opt
@json_opt
@click.pass_obj
def status_cmd(obj: Ctx, target: str | None, set_name: str | None, as_json: bool) -> None:
    """Print the host's state (first line), then each file's."""
    pset = _load_set(obj, set_name)

    async def body(client: AgentClient) -> dict[str, Any]:
        with _one_line():
            return await S.status(client, pset.name, obj.cfg.host.python)

    st = _run(obj, target, body)
    if as_json:
        _print_json(st)
    else:
        _print_status(st)


@patch.command("push")
@click.argument("version")
@target_arg
@set_opt
@yes_opt
@force_opt
@json_opt
@click.pass_obj
def push_cmd(obj: Ctx, version: str, target: str | None, set_name: str | None, yes: bool,
             force: bool, as_json: bool) -> None:
    """Make the host's files exactly VERSION (`latest`: the newest)."""
    pset = _load_set(obj, set_name)
    try:
        goal = P.get_version(pset, version).name
    except P.PatchError as exc:
        _fail(str(exc), EXIT_USAGE)
    _transition(obj, target, pset, goal, yes, force, as_json)


@patch.command("rollback")
@click.argument("args", nargs=-1, metavar="[TO] [TARGET]")
@set_opt
@yes_opt
@force_opt
@json_opt
@click.pass_obj
def rollback_cmd(obj: Ctx, args: tuple[str, ...], set_name: str | None, yes: bool, force: bool,
                 as_json: bool) -> None:
    """Put the host's files back to TO: `pristine` (default) or an earlier version.

    With one argument, it is TO when it is `pristine` or looks like a version (v3), else TARGET.
    """
    pset = _load_set(obj, set_name)
    names = {P.PRISTINE, *P.version_order(pset)}
    if len(args) > 2:
        _fail("rollback takes at most two arguments: [TO] [TARGET]", EXIT_USAGE)
    if len(args) == 2:
        to, target = args
    elif len(args) == 1 and (args[0] in names or re.fullmatch(r"v\d+", args[0])):
        to, target = args[0], None  # "v9" is a version typo, not a host alias
    else:
        to, target = P.PRISTINE, (args[0] if args else None)
    if to not in names:
        _fail(f"patch set {pset.name!r} has no version {to!r} (have: pristine, "
             f"{', '.join(P.version_order(pset))})", EXIT_USAGE)
    _transition(obj, target, pset, to, yes, force, as_json)


@patch.command("capture")
@click.argument("name")
@target_arg
@click.option("--title", required=True, help="What the new version fixes, in one line.")
@click.option("--notes", default="", help="Why, for people.")
@click.option("--fixes", multiple=True, metavar="ID", help="A signature id it fixes (repeatable).")
@set_opt
@json_opt
@click.pass_obj
def capture_cmd(obj: Ctx, name: str, target: str | None, title: str, notes: str,
                fixes: tuple[str, ...], set_name: str | None, as_json: bool) -> None:
    """Record the host's hand-edited files as version NAME in your copy of the set."""
    pset = _load_set(obj, set_name)
    if "\n" in title or not title.strip():
        _fail("--title must be one non-empty line", EXIT_USAGE)

    async def body(client: AgentClient) -> dict[str, Any]:
        with _one_line():
            return await S.capture(client, pset.name, obj.cfg.host.python, name, title,
                                   notes=notes, fixes=fixes)

    rep = _run(obj, target, body)
    if as_json:
        _print_json(rep)
    else:
        click.echo(f"captured {rep['version']} in {rep['dir']}")
        click.echo(f"  diff  {rep['diff_file']}")


