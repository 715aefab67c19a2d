"""Many hosts on the command line: which hosts, and `status` / `runs` over all of them.

Hosts come from the command's TARGETs, then `--hosts-file`, else eagle3.toml's `hosts`
(`hosts = [...]`, or `[fleet] hosts` and `hosts_file`). Every host is asked in
parallel, at most `[fleet] connect_limit` connecting at once; each host's failure is
its own line (stderr, or its object in `--json`). Exit: 0 when every host answered,
3 when any was unreachable, else 2 for a host's config error, 1 for a failed request.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from tui.cli.common import EXIT_CONNECT, EXIT_FAILED, EXIT_USAGE, Ctx, fail, print_json
from tui.protocol import Snapshot
from tui.protocol.hosttext import clean
from tui.protocol.records import RunRecord
from tui.services import actions as services
from tui.services.config import Config, ConfigError
from tui.state import fleet
from tui.state import watch as watcher
from tui.state.model import AppState
from tui.state.watchstate import WatchConfig
from tui.transport import AgentRequestError, TransportError
from tui.transport import ConfigError as TargetError
from tui.transport.fleet import read_hosts_file, unique

targets_arg = click.argument("targets", nargs=-1, metavar="[TARGET]...")
hosts_file_opt = click.option("--hosts-file", metavar="FILE",
                              help="More targets: one per line, # comments.")


def hosts_of(cfg: Config, targets: tuple[str, ...], hosts_file: str | None) -> list[str]:
    """The TARGETs and `--hosts-file`, else the config's `hosts`; each host once."""
    hosts = list(targets)
    if hosts_file:
        hosts += read_hosts_file(hosts_file)
    if not hosts:
        hosts = list(cfg.fleet.hosts)
        if cfg.fleet.hosts_file:
            path = Path(cfg.fleet.hosts_file).expanduser()
            if not path.is_absolute() and cfg.path is not None:
                path = cfg.path.parent / path
            hosts += read_hosts_file(path)
    return unique(hosts)


def fleet_hosts(obj: Ctx, targets: tuple[str, ...], hosts_file: str | None) -> list[str]:
    """`hosts_of` for a command: a broken config or hosts file is one line, exit 2."""
    try:
        return hosts_of(obj.cfg, targets, hosts_file)
    except (ConfigError, TargetError) as exc:
        fail(str(exc), EXIT_USAGE)
    raise AssertionError("unreachable")


def exit_code(codes: list[int]) -> int:
    """3 when any host was unreachable, else the worst other code, else 0."""
    return EXIT_CONNECT if EXIT_CONNECT in codes else max(codes, default=0)


@dataclass(frozen=True)
class Answer:
    """One host's answer: its snapshot or its runs, or why not (and the exit code it means)."""

    host: str
    snapshot: Snapshot | None = None
    runs: tuple[RunRecord, ...] | None = None
    error: str | None = None
    exit: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_json(self, watch: WatchConfig | None, now: float) -> dict[str, Any]:
        """{"host", "ok": true, "snapshot" | "runs"} (as the host sent them, each live
        run with its watch) or {"host", "ok": false, "error", "exit"}."""
        if not self.ok:
            return {"host": self.host, "ok": False, "error": self.error, "exit": self.exit}
        if self.snapshot is not None:
            return {"host": self.host, "ok": True, "snapshot": watcher.annotate(self.snapshot, watch, now)}
        return {"host": self.host, "ok": True, "runs": [r.wire for r in self.runs or ()]}


async def ask_hosts(obj: Ctx, hosts: list[str], what: str) -> list[Answer]:
    """For each host, in order, its answer; at most `[fleet] connect_limit` in flight."""
    cfg = obj.cfg
    gate = asyncio.Semaphore(cfg.fleet.connect_limit)

    def failed(host: str, exc: BaseException, code: int) -> Answer:
        return Answer(host, error=str(exc) or type(exc).__name__, exit=code)

    async def one(host: str) -> Answer:
        try:
            client = obj.client(host)
        except (TransportError, ConfigError) as exc:
            return failed(host, exc, EXIT_USAGE)
        try:
            async with gate:
                await client.start()
            if what == "runs":
                return Answer(host, runs=await services.list_runs(client, cfg))
            return Answer(host, snapshot=await services.snapshot(client, cfg))
        except (TargetError, ConfigError) as exc:  # e.g. the host's Python is too old
            return failed(host, exc, EXIT_USAGE)
        except (TransportError, OSError, asyncio.TimeoutError) as exc:
            return failed(host, exc, EXIT_CONNECT)
        except (AgentRequestError, ValueError) as exc:
            return failed(host, exc, EXIT_FAILED)
        finally:
            await client.close()

    return list(await asyncio.gather(*(one(h) for h in hosts)))


def summarise(cfg: Config, answers: list[Answer]) -> list[fleet.HostRow]:
    """Each answer as the fleet screen's row (the same reducer, view and row)."""
    now = time.time()
    rows = []
    for a in answers:
        if a.snapshot is None:
            rows.append(fleet.host_row(a.host, AppState(), now, error=a.error))
            continue
        state = services.state_of(cfg, a.snapshot.runs, a.snapshot)
        rows.append(replace(fleet.host_row(a.host, state, now), link="ok", link_text="ok",
                            hostname=a.snapshot.host.hostname))
    return rows


def _ask(obj: Ctx, hosts: list[str], what: str) -> list[Answer]:
    try:
        obj.cfg  # noqa: B018 - a broken config is exit 2 before any host is asked
        return asyncio.run(ask_hosts(obj, hosts, what))
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        fail("interrupted", 130)
    raise AssertionError("unreachable")


def _end(answers: list[Answer], as_json: bool) -> None:
    if not as_json:
        for a in answers:
            if not a.ok:
                click.echo(clean(f"eagle3-tui: {a.host}: {a.error}"), err=True)
    code = exit_code([a.exit for a in answers])
    if code:
        sys.exit(code)


def status_many(obj: Ctx, hosts: list[str], as_json: bool) -> None:
    """`status h1 h2 …`: the fleet table, or one JSON object per host with its row."""
    answers = _ask(obj, hosts, "status")
    rows = summarise(obj.cfg, answers)
    if as_json:
        now = time.time()  # each run's watch, as `status --json` gives it for one host
        print_json([dict(a.as_json(obj.cfg.watch, now), summary=r.as_dict()) for a, r in zip(answers, rows)])
    else:
        click.echo(fleet.format_table(rows))
    _end(answers, as_json)


def runs_many(obj: Ctx, hosts: list[str], as_json: bool) -> None:
    """`runs h1 h2 …`: every host's runs with a HOST column, or one object per host."""
    answers = _ask(obj, hosts, "runs")
    if as_json:
        print_json([a.as_json(obj.cfg.watch, time.time()) for a in answers])
    else:
        states = {a.host: services.state_of(obj.cfg, a.runs) for a in answers if a.runs is not None}
        click.echo(fleet.format_runs(states, time.time()))
    _end(answers, as_json)
