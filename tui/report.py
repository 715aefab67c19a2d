"""Plain-text renderings of snapshots and runs for the CLI. Pure, no Textual."""

from __future__ import annotations

from typing import Any

from tui.format import duration, num, size


def format_status(snap: dict[str, Any]) -> str:
    host = snap.get("host") or {}
    load = host.get("load")
    lines = [
        f"host {host.get('hostname', '?')}  load {' '.join(f'{x:.2f}' for x in load) if load else 'N/A'}"
        f"  mem {size(host.get('mem_available'))} free of {size(host.get('mem_total'))}",
    ]
    gpus = snap.get("gpus") or []
    if not gpus:
        lines.append(f"GPUs: none ({snap.get('gpu_error') or 'no GPU source'})")
    for g in gpus:
        lines.append(
            f"GPU {g.get('index')} {g.get('name') or 'N/A'}: {size(g.get('mem_used'))}/"
            f"{size(g.get('mem_total'))}  util {num(g.get('util'), '{}%')}  "
            f"{num(g.get('temp'), '{}°C')}  {num(g.get('power'), '{:.0f} W')}"
            f"  procs {len(g.get('processes') or [])}"
        )
    procs = snap.get("processes") or []
    lines.append(f"processes: {len(procs)}")
    for pr in procs:
        cmd = " ".join(pr.get("cmdline") or [])
        lines.append(f"  {pr.get('pid'):>7} {','.join(pr.get('why') or []):<10} {cmd[:100]}")
    runs = snap.get("runs") or []
    if runs:
        lines.append(format_runs(runs))
    return "\n".join(lines)


def _state(run: dict[str, Any]) -> str:
    """As the dashboard shows it: an exit with a non-zero code is a failure."""
    state = str(run.get("state", "?"))
    return "failed" if state == "exited" and run.get("exit_code") not in (0, None) else state


def format_runs(runs: list[dict[str, Any]]) -> str:
    if not runs:
        return "no runs"
    rows = [f"{'RUN':<24} {'STATE':<9} {'PID':>7} {'DURATION':>9} {'EXIT':>6}  PATCH  NAME"]
    for r in runs:
        dur = duration(r.get("duration"))  # the agent's: a lost run's does not keep growing
        exit_ = r.get("exit_code") if r.get("exit_code") is not None else (r.get("signal") or "")
        ps = r.get("patch_state")
        patch = (ps.get("version") or ps.get("state") or "-") if isinstance(ps, dict) else "-"
        rows.append(
            f"{r.get('run_id', '?'):<24} {_state(r):<9} {num(r.get('pid')):>7} {dur:>9} "
            f"{exit_!s:>6}  {patch:<5}  {r.get('name') or ''}"
        )
    return "\n".join(rows)
