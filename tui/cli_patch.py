"""`eagle3-tui patch status|push|rollback|capture`: versioned patch sets on a host.

The work is `tui.patch_service` (the same code the TUI's patch screen runs); this
module parses arguments, asks before writing, and turns every expected failure into
one line on stderr with the CLI's exit codes (0 ok, 1 refused/failed, 2 usage/config,
3 cannot reach the host).
"""

from __future__ import annotations

import asyncio
import re
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

import click

from tui import patch_service as S
from tui.config import ConfigError
from tui.state import patches as P

if TYPE_CHECKING:
    from tui.cli import Ctx
    from tui.transport import AgentClient

# tui.cli registers this group, so tui.cli is imported lazily here: a module-level
# import would be circular when tui.cli runs as __main__ (`python -m tui.cli`).
EXIT_USAGE = 2

STATE_WORDS = {P.UNKNOWN: "unknown (edited by hand)", P.MISSING: "missing"}


def describe_state(st: dict[str, Any]) -> str:
    """The one-word (or short) state of a status dict: `pristine`, `v3`, `unknown (...)`."""
    state = str(st.get("state"))
    return STATE_WORDS.get(state, state)


def changing_files(st: dict[str, Any], target: str) -> list[str]:
    """Absolute paths of the files a move to `target` rewrites, from a status dict."""
    return [f["abs_path"] for f in st["files"].values()
            if target not in str(f.get("state", "")).split(",")]


def shorten_left(path: str, width: int) -> str:
    """`path` if it fits in `width` columns, else `…` and its end, cut just before a `/`
    when that still keeps the whole file name (`…/data_generation/worker.py`)."""
    if len(path) <= width:
        return path
    tail = path[len(path) - max(width - 1, 1):]
    slash = tail.find("/")
    if 0 <= slash < tail.rfind("/") + 1 and slash < len(tail) - 1:
        tail = tail[slash:]
    return "…" + tail


LABEL = 9  # width of "files:   ", the column the values of plan_lines start at


def plan_lines(st: dict[str, Any], target: str, title: str, host: str,
               width: int | None = None) -> list[str]:
    """What a push/rollback will do, for the confirmation prompt (CLI and TUI).

    With `width` (the dialog's text width) no line is longer: long values wrap under
    their value column and each file path, on its own line, is shortened from the left.
    Without it (the CLI) paths stay whole, so they can be copied.
    """
    files = changing_files(st, target)
    have = st.get("distribution_version") or "unknown version"
    head = [f"host:    {host}",
            f"set:     {st.get('set')} ({st.get('target')}, host has {have})",
            f"state:   {describe_state(st)} → {target}" + (f"  {title}" if title else ""),
            "files:   " + (f"{len(files)} to rewrite" if files else "none (already there)")]
    if width is not None:
        head = [wrapped for line in head
                for wrapped in textwrap.wrap(line, width, subsequent_indent=" " * LABEL,
                                             break_on_hyphens=False)]
    return head + ["  " + (f if width is None else shorten_left(f, width - 2)) for f in files]


def _fail(message: str, code: int) -> NoReturn:
    from tui.cli import fail

    fail(message, code)
    raise AssertionError("unreachable")


def _run(obj: Ctx, target: str | None, body: Any) -> Any:
    from tui.cli import run_on_host

    return run_on_host(obj, target, body)


def _print_json(obj: Any) -> None:
    from tui.cli import print_json

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
    hello = client.hello
    return f"{hello.hostname} ({fallback})" if hello and hello.hostname else fallback


def _print_status(st: dict[str, Any]) -> None:
    click.echo(describe_state(st))
    click.echo(f"  set      {st['set']} (for {st['target']}; host has "
               f"{st.get('distribution_version') or 'unknown version'})")
    click.echo(f"  package  {st['package_dir']}")
    for rel, f in st["files"].items():
        sha = (f.get("sha256") or "-")[:12]
        backup = "  backup" if f.get("backup") else ""
        click.echo(f"  {rel}  {f.get('state')}  sha256 {sha}{backup}")


def _print_done(st: dict[str, Any]) -> None:
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
            from tui.cli import Ctx

            obj = ctx.ensure_object(Ctx)
        # ctx.obj rather than ensure_object(Ctx) first: under `python -m tui.cli` the lazily
        # imported tui.cli is a second module, and its Ctx is not the class of ctx.obj.
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


__all__ = ["changing_files", "describe_state", "patch", "plan_lines", "shorten_left"]
