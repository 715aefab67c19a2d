"""`eagle3-tui init`: a commented `eagle3.toml` to start from, written where the other
commands read it (./eagle3.toml, or --config FILE). It never overwrites a file: an
existing one is one line and exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import click

from tui.cli.common import EXIT_USAGE, Ctx, fail
from tui.services.config import DEFAULT_NAME

# Every setting commented out: as written, the file changes nothing (the defaults). A
# line "# key = value" or "# [table]" becomes a setting when its "# " is removed.
STARTER = """\
# eagle3.toml: what eagle3-tui supervises. Read from the current directory (or
# --config FILE). Remove a leading "# " to set a key; every key is in the README's
# "Configuration" section. Check it with: eagle3-tui status

# [host]
# target = "user@gpu-box"           # where runs live (default: this machine, "local")
# python = "/opt/venv/bin/python"   # the agent's interpreter there (default: python3)
# runs_dir = "/data/eagle3-runs"    # default ~/.cache/eagle3-tui/runs on the host

# [run]                             # what `l` (or eagle3-tui launch) starts
# name = "my-extract"
# command = ["python", "extract.py", "--tp", "8"]   # an argv list, never a shell line
# cwd = "/srv/extract"
# log = "/srv/extract/extract.log"  # a log to follow (default: the run's own log)
# restart = "on-failure"            # default "never"
# max_restarts = 3

# [watch]                           # when a run counts as stalled or hung
# stall_loading_s = 120.0
# hang_s = 600.0

# [notify]                          # told of failed, finished, stalled … (JSON on stdin)
# command = ["curl", "-s", "-d", "@-", "https://ntfy.sh/my-runs"]
"""


@click.command()
@click.pass_obj
def init(obj: Ctx) -> None:
    """Write a commented eagle3.toml to start from (here, or at --config FILE); never
    overwrites an existing file."""
    path = Path(obj.config_path or DEFAULT_NAME)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        fail(f"{path.resolve()} exists: not overwritten (edit it, or move it away first)", EXIT_USAGE)
    except OSError as exc:
        fail(f"cannot write {path.resolve()}: {exc.strerror or exc}", EXIT_USAGE)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(STARTER)
    click.echo(f"wrote {path.resolve()}: set [run] command in it, then eagle3-tui connect (l launches it)")
