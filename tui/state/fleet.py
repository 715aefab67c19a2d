"""The fleet screen's rows: one line per host, built from that host's `AppState`.

Pure: no I/O, no Textual. The fleet screen and `eagle3-tui status --json h1 h2 …`
read their per-host summary from here: the link (connecting / ok / stale / lost /
the connection's own one-line error), GPUs busy of total, GPU memory used, the live
runs with the selected run's phase and progress, failures and stalls. `sort_rows`
orders them by one of `SORT_KEYS` (the fleet's `s` key cycles through them), grouped
by `host_state` (failed, unreachable, stalled, running, idle, connecting) unless the
`g` key turns grouping off; `matches` is the `/` filter and `summary` the line above
the table. `snapshot_interval` and `repaint_period` scale the fleet's refresh with its
size (as all-smi does: 6 s between a host's snapshots past 100 hosts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tui.protocol.hosttext import clean
from tui.protocol.records import GpuReading, RunRecord
from tui.state import view
from tui.state.format import duration, gib
from tui.state.model import AppState

BUSY_UTIL = 5.0  # % utilisation above which a GPU with no listed process counts as busy
SORT_KEYS = ("host", "link", "gpus", "free", "memory", "runs", "failures")
# A host's state, in the order grouping shows them: the hosts that need a look first.
STATES = ("failed", "unreachable", "stalled", "running", "idle", "connecting")
# Link kinds in the order a "link" sort puts them: the hosts that need a look first.
_LINK_ORDER = {"error": 0, "lost": 1, "stale": 2, "connecting": 3, "ok": 4}
_FAILED = ("failed", "lost")
SMALL_FLEET, BIG_FLEET = 10, 100  # hosts: the refresh rules' two ends, straight between


def by_size(hosts: int, small: float, big: float) -> float:
    """`small` up to SMALL_FLEET hosts, `big` from BIG_FLEET, a straight line between."""
    share = min(1.0, max(0.0, (hosts - SMALL_FLEET) / (BIG_FLEET - SMALL_FLEET)))
    return round(small + (big - small) * share, 2)


BIG_FLEET_INTERVAL = 6.0  # s between a host's snapshots past BIG_FLEET hosts (all-smi's)


def snapshot_interval(hosts: int, host_interval: float) -> float:
    """Seconds between one host's snapshots on the fleet screen (`[fleet] interval`
    unset): `[host] interval` up to 10 hosts, 6 s past 100 (never faster than
    `[host] interval`). The host opened from the fleet gets `[host] interval` while it
    is on screen. A run that starts and ends within one interval is seen ended: its
    row counts the failure, but it is history to the watch (no bell, no hook)."""
    return max(host_interval, by_size(hosts, host_interval, BIG_FLEET_INTERVAL))


def repaint_period(hosts: int) -> float:
    """Seconds over which the fleet screen gathers hosts' events into one repaint:
    0.1 s up to 10 hosts, 2 s past 100. A repaint that changes any cell redraws every
    visible row (Textual's DataTable drops its whole render cache): at 256 hosts that
    was two thirds of the client's steady CPU."""
    return by_size(hosts, 0.1, 2.0)


@dataclass(frozen=True)
class HostRow:
    """One host of the fleet. `link` is ok | connecting | stale | lost | error;
    `link_text` says it in words (the error's one line when it is `error`)."""

    host: str
    link: str
    link_text: str
    gpus_busy: int | None  # None until the first snapshot
    gpus_total: int | None
    mem_used: int | None  # bytes of GPU memory in use, over all GPUs
    mem_total: int | None
    live: int  # runs alive now
    runs: int  # runs on the host (of this config, as the dashboard shows them)
    run_text: str  # "20261130-…-ab12 extracting 3/16" (the selected run), or ""
    failures: int  # runs that failed (non-zero exit, did not start, lost) or whose log failed
    failure_text: str  # the selected run's root cause, or the newest failure's state
    stalled: str  # "stalled" | "hung" | ""
    hostname: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The row as `status --json` prints it for a host."""
        return {
            "host": self.host, "hostname": self.hostname, "link": self.link, "link_text": self.link_text,
            "gpus_busy": self.gpus_busy, "gpus_total": self.gpus_total, "mem_used": self.mem_used,
            "mem_total": self.mem_total, "live": self.live, "runs": self.runs, "run": self.run_text,
            "failures": self.failures, "failure": self.failure_text, "stalled": self.stalled,
        }


def gpu_busy(gpu: GpuReading) -> bool:
    """A GPU is busy when a process holds memory on it, or it computes (util > 5 %)."""
    return bool(gpu.processes) or (gpu.util is not None and gpu.util > BUSY_UTIL)


def link_of(state: AppState, now: float, error: str | None = None,
            retry_at: float | None = None) -> tuple[str, str]:
    """(kind, text) of the host's connection; `error` is a failed first connect, tried
    again at `retry_at` (the countdown comes first: a long error is clipped)."""
    if error is not None:
        wait = duration(max(0, round(retry_at - now))) if retry_at is not None else None
        return "error", (f"retry in {wait}: {error}" if wait is not None else error)
    link = state.link
    if link.state in ("connecting", "closed") and link.last_data is None:
        return "connecting", "connecting"
    text, kind = view.link_text(state, now)
    if link.state == "connected":
        return ("stale", text) if kind == "warn" else ("ok", "ok")
    if link.state == "failed" and link.last_data is None:
        return "error", link.error or "connect failed"
    return "lost", text


def _failed(run: RunRecord) -> bool:
    return run.state in _FAILED or (run.state == "exited" and run.exit_code not in (0, None))


def progress_text(state: AppState, run: RunRecord | None) -> str:
    """`extracting 3/16`, `loading 37/64`, or the phase alone, for the run followed."""
    if run is None:
        return ""
    a = state.log.analysis if state.log.path is not None and state.log.path == view.wanted_log(state)[0] else None
    ph = view.phase(state, run, 0.0) if a is not None or run.state == "killed" else None
    parts = [run.run_id, ph or run.state]
    ex = getattr(a, "extract", None)
    shard = getattr(a, "shard", None)
    if ph == "extracting" and ex is not None and ex.batch is not None and ex.batches:
        parts.append(f"{ex.batch}/{ex.batches}")
    elif ph == "loading" and shard is not None:
        parts.append(f"{shard.done}/{shard.total}")
    return " ".join(parts)


def host_row(host: str, state: AppState, now: float, error: str | None = None,
             retry_at: float | None = None) -> HostRow:
    """The fleet row of one host. `error`: why its first connect failed (one line),
    `retry_at`: when it is tried again."""
    link, link_text = link_of(state, now, error, retry_at)
    seen = state.seq >= 0
    runs = view.visible_runs(state)
    run = view.select_run(state)
    failed = [r for r in runs if _failed(r)]
    root = getattr(state.log.analysis, "root_cause", None)
    log_failed = run is not None and root is not None and run not in failed
    failure_text = ""
    if log_failed and root is not None:
        failure_text = str(root.title)
    elif failed:
        last = view.newest_first(failed)[0]
        failure_text = f"{view.state_label(last)} {view.exit_label(last)}".rstrip() + f" ({last.run_id[-11:]})"
    w = state.watch
    stalled = w.condition if w is not None and w.condition in ("stalled", "hung") else ""
    return HostRow(
        host=host, link=link, link_text=link_text,
        gpus_busy=sum(1 for g in state.gpus if gpu_busy(g)) if seen else None,
        gpus_total=len(state.gpus) if seen else None,
        mem_used=_sum(g.mem_used for g in state.gpus) if seen else None,
        mem_total=_sum(g.mem_total for g in state.gpus) if seen else None,
        live=sum(1 for r in runs if r.alive), runs=len(runs),
        run_text=progress_text(state, run) if seen else "",
        failures=len(failed) + int(log_failed), failure_text=failure_text,
        stalled=stalled, hostname=state.hostname,
    )


def _sum(values: Any) -> int | None:
    nums = [v for v in values if isinstance(v, (int, float))]
    return int(sum(nums)) if nums else None


def host_state(row: HostRow) -> str:
    """One word of STATES: failed (a failed run or log), unreachable (no connection, or
    lost), stalled (a stalled or hung run), running (a live run or a busy GPU), idle,
    connecting (no first snapshot yet)."""
    if row.failures:
        return "failed"
    if row.link in ("error", "lost"):
        return "unreachable"
    if row.stalled:
        return "stalled"
    if row.gpus_total is None:
        return "connecting"
    return "running" if row.live or row.gpus_busy else "idle"


def free_gpus(row: HostRow) -> int | None:
    """GPUs with no process and no load; None until the first snapshot."""
    return None if row.gpus_total is None else row.gpus_total - (row.gpus_busy or 0)


def matches(row: HostRow, text: str) -> bool:
    """The `/` filter: every word of `text` (any case) is in the host's name, its
    state, its link or its run (id, phase, progress)."""
    hay = " ".join((row.host, host_state(row), row.link, row.link_text, row.run_text)).casefold()
    return all(word in hay for word in text.casefold().split())


def summary(rows: list[HostRow]) -> str:
    """`256 hosts · 1500/2048 GPUs busy · 3 failures · 2 unreachable` (GPUs of the hosts
    seen so far; a host with several failed runs counts each)."""
    total = sum(r.gpus_total or 0 for r in rows)
    busy = sum(r.gpus_busy or 0 for r in rows)
    failures = sum(r.failures for r in rows)
    down = sum(1 for r in rows if r.link in ("error", "lost"))
    parts = [f"{len(rows)} host{'s' if len(rows) != 1 else ''}", f"{busy}/{total} GPUs busy",
             f"{failures} failure{'s' if failures != 1 else ''}", f"{down} unreachable"]
    waiting = sum(1 for r in rows if r.link == "connecting")
    if waiting:
        parts.append(f"{waiting} connecting")
    return " · ".join(parts)


def arrange(rows: list[HostRow], key: str, group: bool = True, text: str = "") -> list[HostRow]:
    """The rows the fleet shows: those that match `text`, sorted by `key`, and with
    `group` the failed hosts first, then unreachable, stalled, running, idle, connecting
    (sorted by `key` within each)."""
    shown = sort_rows([r for r in rows if matches(r, text)] if text.strip() else rows, key)
    if group:
        shown.sort(key=lambda r: STATES.index(host_state(r)))  # stable: `key` within a group
    return shown


def sort_rows(rows: list[HostRow], key: str) -> list[HostRow]:
    """Rows ordered by `key` (one of SORT_KEYS): by name ascending; link problems,
    busy GPUs, free GPUs, memory, live runs and failures largest first (hosts not seen
    yet last for free GPUs); ties by host name."""
    if key == "host":
        return sorted(rows, key=lambda r: r.host)
    if key == "link":
        return sorted(rows, key=lambda r: (_LINK_ORDER.get(r.link, 9), r.host))
    if key == "gpus":
        return sorted(rows, key=lambda r: (-(r.gpus_busy or 0), -(r.gpus_total or 0), r.host))
    if key == "free":
        return sorted(rows, key=lambda r: (free_gpus(r) is None, -(free_gpus(r) or 0), r.host))
    if key == "memory":
        return sorted(rows, key=lambda r: (-(r.mem_used or 0), r.host))
    if key == "runs":
        return sorted(rows, key=lambda r: (-r.live, -r.runs, r.host))
    if key == "failures":
        return sorted(rows, key=lambda r: (-r.failures, -int(bool(r.stalled)), r.host))
    raise ValueError(f"unknown sort key {key!r}: one of {', '.join(SORT_KEYS)}")


def next_sort(key: str) -> str:
    return SORT_KEYS[(SORT_KEYS.index(key) + 1) % len(SORT_KEYS)]


def cells(row: HostRow) -> tuple[str, ...]:
    """The row as the fleet table shows it: HOST, LINK, GPUS, MEM GiB, RUNS, RUN, FAILURES."""
    gpus = "-" if row.gpus_total is None else f"{row.gpus_busy}/{row.gpus_total}"
    mem = "-" if row.mem_used is None else f"{gib(row.mem_used)}/{gib(row.mem_total)}"
    runs = "-" if row.gpus_total is None else f"{row.live} live / {row.runs}"
    fail = row.stalled.upper() if row.stalled else ""
    if row.failures:
        fail = ", ".join(x for x in (fail, f"{row.failures}: {row.failure_text}") if x)
    return (host_text(row.host), view.clip(row.link_text, 40), gpus, mem, runs, view.clip(row.run_text, 40),
            view.clip(fail, 40))


def host_text(host: str) -> str:
    """A target as the HOST column shows it. Targets are the user's text (the command
    line, a hosts file, `[fleet] hosts`), but a user part may hold anything but spaces,
    ESC c and OSC 52 included: shown through the one sanitizer, never raw (the row keeps
    the target itself, which is what is connected to)."""
    return clean(host, newline=False)


COLUMNS = ("HOST", "LINK", "GPUS", "MEM GiB", "RUNS", "RUN", "FAILURES")


def format_table(rows: list[HostRow]) -> str:
    """The fleet as plain text (`eagle3-tui status h1 h2 …`): aligned columns."""
    table = [COLUMNS, *(cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in table)


def format_runs(states: dict[str, AppState], now: float) -> str:
    """Every run of every host, newest first within each host, with a HOST column
    (`eagle3-tui runs h1 h2 …`); `*` marks each host's selected run."""
    head = ("", "HOST", "RUN", "STATE", "PID", "DURATION", "EXIT", "PATCH", "NAME", "NOTE")
    table: list[tuple[str, ...]] = [head]
    for host, state in states.items():
        chosen = view.select_run(state)
        for r in view.run_rows(state, now, state.runs):
            mark = "*" if chosen is not None and r.run_id == chosen.run_id else ""
            table.append((mark, host_text(host), r.run_id, r.state, str(r.pid), r.duration, r.exit, r.patch,
                          r.name, r.note))
    if len(table) == 1:
        return "no runs"
    widths = [max(len(line[i]) for line in table) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in table)
