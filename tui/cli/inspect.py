"""`eagle3-tui inspect LOGFILE`: the post-mortem of a log file on this machine."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from tui.cli.common import (
    EXIT_USAGE,
    fail,
    print_json,
)


@click.command()
@click.argument("logfile")
@click.option("--json", "as_json", is_flag=True)
def inspect(logfile: str, as_json: bool) -> None:
    """Post-mortem of a log file on this machine (`-` reads stdin)."""
    from tui.services.inspect import format_report, inspect_log

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
    from tui.state.loganalysis.fold import signature_errors

    for err in signature_errors():  # a broken user signature file is skipped, not silent
        click.echo(f"eagle3-tui: warning: {err}", err=True)
    if as_json:
        print_json(result)
    else:
        click.echo(format_report(result))
