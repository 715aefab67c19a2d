"""`eagle3-tui replay RUN`: a recorded run played through the dashboard."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from tui.cli.common import EXIT_USAGE, RUN_ID, Ctx, fail, need_terminal, run_app
from tui.services.config import ConfigError


@click.command()
@click.argument("run", metavar="RUN")
@click.option("--speed", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Recorded seconds played per second (60: an hour a minute).")
@click.option("--from", "start_s", type=click.FloatRange(min=0), default=0.0, metavar="SECONDS",
              help="Start this many recorded seconds after the launch.")
@click.pass_obj
def replay(obj: Ctx, run: str, speed: float, start_s: float) -> None:
    """Play a recorded run through the dashboard: its timeline (GPUs, phases, state) and
    its log, as the live link would have shown them. RUN is a run dir (copied from a
    host: timeline.jsonl, manifest.json, output.log) or a run id in the local runs dir.
    A replay changes nothing: keys that act on a host are off."""
    from tui.services import replay as replaying

    path = Path(run).expanduser()
    if not path.is_dir() and RUN_ID.fullmatch(run):  # a run id: the local runs dir's
        try:
            runs_dir = obj.cfg.host.runs_dir
        except ConfigError as exc:
            fail(str(exc), EXIT_USAGE)
        path = Path(runs_dir or "~/.cache/eagle3-tui/runs").expanduser() / run
    try:
        rec = replaying.load(path)
    except replaying.ReplayError as exc:
        fail(str(exc), EXIT_USAGE)
    if rec.tl.bad_lines or rec.dropped:  # left out, never fatal: say so once
        click.echo(f"warning: {rec.tl.bad_lines} line(s) of the timeline and {rec.dropped} number(s) of the "
                   "run record left out (unreadable, or a number not finite or beyond 1e15)", err=True)
    need_terminal("replay")
    client = replaying.ReplayClient(rec, speed=speed, start_s=start_s)

    def make() -> Any:
        from tui.services.config import Config
        from tui.views.app import make_app

        cfg = Config()
        cfg = replace(cfg, run=replace(cfg.run, name=str(rec.record.get("name") or "run")))
        return make_app(client, cfg, f"replay {rec.record['run_id']}", read_only=True)  # type: ignore[arg-type]

    run_app(make)
