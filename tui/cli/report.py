"""Plain-text renderings of snapshots and runs for the CLI. Pure, no Textual.

Run rows, states and the marked run come from the view model (`tui.state.view`),
the same functions the dashboard's Runs table uses."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from tui.protocol.hosttext import clean
from tui.services.statefile import remembered_demo
from tui.state import view
from tui.state.format import num, size
from tui.state.history import basis
from tui.state.model import AppState


def format_status(state: AppState) -> str:
    """One snapshot as lines: host, GPUs, processes, runs. From the state (whose texts the
    model sanitized), never from the host's raw dicts."""
    host = state.host
    lines = [
        f"host {host.hostname or '?'}  load {' '.join(f'{x:.2f}' for x in host.load) if host.load else 'N/A'}"
        f"  mem {size(host.mem_available)} free of {size(host.mem_total)}",
    ]
    if not state.gpus:
        lines.append(f"GPUs: none ({state.gpu_error or 'no GPU source'})")
    for g in state.gpus:
        lines.append(
            f"{g.node + ' ' if g.node else ''}GPU {g.index} {g.name or 'N/A'}: {size(g.mem_used)}/"
            f"{size(g.mem_total)}  util {num(g.util, '{}%')}  "
            f"{num(g.temp, '{}°C')}  {num(g.power, '{:.0f} W')}"
            f"  procs {len(g.processes)}"
        )
    for node in state.job_nodes:
        if node.error is not None:  # a followed Slurm job's node that is not shown, and why
            lines.append(f"{node.node}: not shown: {node.error}")
    lines.append(f"processes: {len(state.processes)}")
    for pr in state.processes:
        cmd = " ".join(pr.cmdline)
        where = f"{pr.node}:" if pr.node else ""
        lines.append(f"  {where + str(pr.pid):>7} {','.join(pr.why):<10} {cmd[:100]}")
    if state.runs:
        lines.append(format_runs(state))
    return "\n".join(lines)


def format_runs(state: AppState) -> str:
    """Every run on the host, newest first; `*` marks the run `kill` and `relaunch`
    apply to without a RUN_ID (the dashboard selects the same one)."""
    if not state.runs:
        return "no runs"
    chosen = view.select_run(state)
    found = view.run_rows(state, time.time(), state.runs)
    pw = max([len("PATCH")] + [len(r.patch) for r in found])  # "pristine", "v3" …: NAME stays in line
    rows = [f"  {'RUN':<24} {'STATE':<9} {'PID':>7} {'DURATION':>9} {'EXIT':>6}  {'PATCH':<{pw}}  NAME"]
    for r in found:
        mark = "*" if chosen is not None and r.run_id == chosen.run_id else " "
        line = (f"{mark} {r.run_id:<24} {r.state:<9} {r.pid:>7} {r.duration:>9} "
                f"{r.exit:>6}  {r.patch:<{pw}}  {r.name}")
        rows.append(line + (f"  {r.note}" if r.note else ""))
    return "\n".join(rows)


def no_runs(runs_dir: str | None, where: str, cwd: Path) -> str:
    """`runs` with nothing to list: which runs dir was read, how to read another, and
    where the demo's runs are."""
    lines = [f"no runs in {runs_dir or '~/.cache/eagle3-tui/runs'} on {clean(where, newline=False)}"
             + ("" if runs_dir else " (the default runs dir)"),
             "another runs dir: [host] runs_dir in eagle3.toml, or --config FILE for another config"]
    pointer = demo_pointer(runs_dir, where, cwd)
    return "\n".join(lines + ([pointer] if pointer else []))


def demo_pointer(runs_dir: str | None, where: str, cwd: Path) -> str | None:
    """Where the demo's runs are, unless they are the ones read: the demo in this
    directory, else the one `eagle3-tui demo` last built (tui/services/statefile.py)."""
    if where != "local":
        return None
    here = cwd / "eagle3-demo"
    demo = here if (here / "eagle3.toml").is_file() else remembered_demo()
    if demo is None or runs_dir is not None and Path(runs_dir).expanduser().resolve() == (demo / "runs").resolve():
        return None
    config = os.path.relpath(demo / "eagle3.toml", cwd)
    if config.startswith(".."):
        config = str(demo / "eagle3.toml")
    return f"the demo's runs are in {demo / 'runs'}: eagle3-tui --config {config} runs"


def _wasted(w: Any, secs: Any) -> list[str]:
    """ "  wasted       0.42 GPU-hours after divergence (at 812.0 s: …)"."""
    if not isinstance(w, dict):
        return []
    why = f": {w['why']}" if w.get("why") else ""
    return [f"  wasted       {w.get('gpu_hours')} GPU-hours after {w.get('after')}"
            f" (from {secs(w.get('after_s'))}{why})"]


def _stopped(st: Any) -> list[str]:
    """ "  stopped      by the host: …; GPUs free (proved)"."""
    if not isinstance(st, dict):
        return []
    free = {True: "GPUs free (proved)", False: "GPUs NOT free", None: "GPU-free proof not read"}.get(
        st.get("gpus_free"), "?")
    note = f" ({st['note']})" if st.get("note") else ""
    return [f"  stopped      by the host: {st.get('detail') or st.get('why')}; {free}{note}"]


def format_show(s: dict[str, Any]) -> str:
    """`runs show`: the run's summary, one fact a line (the values are cleaned host text)."""

    def secs(v: object) -> str:
        return "-" if not isinstance(v, (int, float)) else f"{v:.1f} s"

    lines = [f"run {s.get('run_id')}  {s.get('outcome') or s.get('state') or '?'}",
             f"  load         {secs(s.get('load_s'))}",
             *_expected(s, secs),
             f"  first output {secs(s.get('first_output_s'))}",
             f"  duration     {secs(s.get('duration_s'))}",
             f"  GPU-hours    {s.get('gpu_hours') if s.get('gpu_hours') is not None else '-'}",
             *_wasted(s.get("wasted"), secs),
             *_stopped(s.get("stopped")),
             *_loss(s.get("loss"), secs),
             f"  attempts     {s.get('attempts')} ({s.get('restarts') or 0} restart(s))",
             f"  patch        {s.get('patch_version') or '-'}"]
    for t in s.get("throughput") or []:
        rate = t.get("per_s")
        lines.append(f"  {t['phase']:<12} {t['steps']} {t['unit']} in {secs(t['seconds'])}"
                     + (f" ({rate:.2f}/s)" if isinstance(rate, (int, float)) else ""))
    for p in s.get("phases") or []:
        lines.append(f"  + {secs(p.get('after_s')):>8}  {p.get('phase')}")
    lines.append(f"  timeline     {s.get('timeline_points')} point(s)"
                 + (f", {s['timeline_bad_lines']} unreadable line(s) skipped" if s.get("timeline_bad_lines") else ""))
    if s.get("note"):
        lines.append(f"  note         {s['note']}")
    return "\n".join(lines)


def _loss(loss: Any, secs: Any) -> list[str]:
    """The training loss the timeline kept: the last one and the lowest (none: no line)."""
    if not isinstance(loss, dict):
        return []

    def at(step: Any, after: Any) -> str:
        return f"(step {step}, +{secs(after)})" if step is not None else f"(+{secs(after)})"

    low = loss.get("min")
    return [f"  loss         last {loss.get('last')} {at(loss.get('last_step'), loss.get('last_after_s'))}"
            + (f", lowest {low} {at(loss.get('min_step'), loss.get('min_after_s'))}" if low is not None else "")]


def _expected(s: dict[str, Any], secs: Any) -> list[str]:
    """The load history says to expect (a live run always; an ended one when known)."""
    exp, n = s.get("expected_load_s"), len(s.get("expected_load_runs") or [])
    if exp is None:
        return ["  expected     - (no earlier load of this command on this host)"] \
            if s.get("state") in ("running", "pending") else []
    return [f"  expected     {secs(exp)} ({basis(n)}: the median of this command's last loads here)"
            if n > 1 else f"  expected     {secs(exp)} ({basis(n)} of this command here)"]


def format_compare(c: dict[str, Any]) -> str:
    """`runs compare`: one row a measure, the two runs in columns."""

    def row(name: str, pair: list[Any]) -> list[str]:
        return [name, *("-" if v is None else str(v) for v in pair)]

    rows = [row("", list(c["runs"]))]
    rows += [row(k, pair) for k, pair in c["fields"].items()]
    rows += [row(f"{ph} /s", pair) for ph, pair in c["throughput"].items()]
    rows += [row(f"GPU{card} peak GiB", pair) for card, pair in c["peak_mem_gib"].items()]
    if c.get("argv"):
        rows.append(row("argv", [" ".join(x) for x in c["argv"]]))
    rows += [row(f"env {k}", pair) for k, pair in c["env"].items()]
    w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    return "\n".join(f"{r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]}" for r in rows)
