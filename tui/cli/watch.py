"""`eagle3-tui watch [TARGET]`: the dashboard's detection with no screen.

It follows one run (``--run ID``, else the config's live run, else its newest run)
through the same agent stream, reducer and ``tui.state.watch`` the dashboard uses,
prints one line per event on stdout (``--json``: one JSON object per line), sends
the same notifications (a terminal alert on stderr when it is a terminal, and the
``[notify] command`` hook), and exits when the run ends, with the run's outcome as
its exit code: 0 finished, 1 failed, killed or lost. For tmux, nohup or cron.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import replace
from typing import Any

import click

from tui import protocol as p
from tui.protocol.hosttext import clean
from tui.services import actions as services
from tui.services.notify import Notifier
from tui.state.model import AppState, LogTail
from tui.state.reducer import apply
from tui.state.watch import WatchEvent, WatchState, ending
from tui.transport import AgentClient

__all__ = ["OUTCOME_CODES", "watch"]

TAIL_BYTES = 4 * 1024 * 1024
OUTCOME_CODES = {"finished": 0, "failed": 1, "killed": 1, "lost": 1}


def _line(ev: WatchEvent, as_json: bool) -> str:
    if as_json:
        return json.dumps(ev.to_json(), sort_keys=True, default=str)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ev.at))
    return f"{stamp} run {ev.run_id} {ev.kind}: {ev.message}"


async def follow(client: AgentClient, cfg: Any, run_id: str | None, as_json: bool,
                 notifier: Notifier, out: Any = None) -> int:
    """Watch until the run ends; return the exit code for its outcome."""
    out = out or sys.stdout
    runs = await services.list_runs(client, cfg)
    # The one selection rule (tui.state.view.select_run), the same as the dashboard's and
    # kill's: the id given, else the config's newest live run, else its newest, else an
    # adopted one.
    run = services.choose_run(cfg, runs, run_id)
    if run is None:
        raise ValueError(f"no run {run_id} on this host" if run_id else
                         f"no run of {cfg.run.name!r} to watch (runs lists them all)")
    log_path = run.log or cfg.run.log
    state = AppState(target=cfg.host.target or "", watch=WatchState(config=cfg.watch, run_id=run.run_id),
                     log=LogTail(path=log_path, sub="watch"))
    print(f"watching run {run.run_id} ({run.name}, {run.state}); log {clean(log_path or '(none)', newline=False)}",
          file=sys.stderr, flush=True)
    if log_path:
        await client.subscribe("watch", log_path, -TAIL_BYTES)
    await services.configure(client, cfg)  # snapshots from now on, the first one at once
    events = client.events().__aiter__()
    last = run
    snaps = 0
    said_end = False  # the run's end was one event line already ("run … finished: exit 0 after 00:16")
    while True:
        event = await events.__anext__()
        state = apply(state, event, time.time())
        for ev in notifier.send_new(state.watch):
            print(_line(ev, as_json), file=out, flush=True)
            said_end = said_end or (ev.run_id == run.run_id and ev.kind in ("finished", "killed", "lost"))
        if not isinstance(event, p.Snapshot):
            continue
        snaps += 1
        if snaps < 2:
            continue  # the log's tail is read meanwhile, so an ended run's end can name its cause
        current = state.run(run.run_id)
        if current is None:  # gone from the ledger (pruned): it ended unseen
            current = replace(last, state="lost")
        last = current
        # running, or queued in Slurm
        if current.alive or state.watch is not None and state.watch.condition == "ending":
            continue
        result = ending(current, state.log.analysis)
        code = current.exit_code if current.exit_code is not None else current.signal
        root = getattr(state.log.analysis, "root_cause", None)
        cause = root.title if root is not None and result == "failed" else None
        if as_json:
            print(json.dumps({"event": "ended", "run_id": run.run_id, "outcome": result, "cause": cause,
                              "exit_code": current.exit_code, "signal": current.signal,
                              "restarts": current.restarts}, sort_keys=True),
                  file=out, flush=True)
        elif not said_end:
            again = f", restarted {current.restarts}×" if current.restarts else ""
            print(f"run {run.run_id} ended: {result} (exit {code}{again})" + (f": {cause}" if cause else ""),
                  file=out, flush=True)
        return OUTCOME_CODES[result]


@click.command()
@click.argument("target", required=False)
@click.option("--run", "run_id", metavar="RUN_ID",
              help="Run to watch (default: the config's live run, else its newest).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event.")
@click.option("--alert/--no-alert", default=None,
              help="Bell and desktop notification on stderr (default: when stderr is a terminal).")
@click.pass_obj
def watch(obj: Any, target: str | None, run_id: str | None, as_json: bool, alert: bool | None) -> None:
    """Watch a run with no screen: one line per event, exit when it ends.

    Events: failed, stalled, hung, resumed, finished, killed. Exit code: 0 finished,
    1 failed, killed or lost (2 usage, 3 host unreachable).
    """
    from tui.cli.common import EXIT_CONNECT, EXIT_FAILED, EXIT_USAGE, fail
    from tui.transport import AgentRequestError, TransportError
    from tui.transport import ConfigError as TargetError

    try:
        cfg = obj.cfg
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    if alert is None:
        alert = sys.stderr.isatty()

    def write(seq: str) -> None:
        sys.stderr.write(seq)
        sys.stderr.flush()

    async def main() -> int:
        client = obj.client(host, reconnect=True)  # a watch lasts hours: ride out link drops
        try:
            await client.start()
            return await follow(client, cfg, run_id, as_json, notifier)
        finally:
            await client.close()

    host = obj.target(target)
    notifier = Notifier(cfg.notify.command, host=host, write=write if alert else None)
    try:
        code = asyncio.run(main())
    except TargetError as exc:
        fail(str(exc), EXIT_USAGE)
    except TransportError as exc:
        fail(str(exc), EXIT_CONNECT)
    except (AgentRequestError, ValueError) as exc:
        fail(str(exc), EXIT_FAILED)
    except KeyboardInterrupt:
        fail("interrupted", 130)
    finally:  # whatever ends the watch: a hook started by the last event may deliver, then what hangs dies
        notifier.close(grace=5.0)
    sys.exit(code)
