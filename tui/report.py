"""Plain-text renderings of snapshots and runs for the CLI. Pure, no Textual."""

from __future__ import annotations

import time
from typing import Any

from tui.services import fmt_bytes


def fmt_duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)) or seconds < 0:
        return "N/A"
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def na(value: Any, fmt: str = "{}") -> str:
    return "N/A" if value is None else fmt.format(value)


def format_status(snap: dict[str, Any]) -> str:
    host = snap.get("host") or {}
    load = host.get("load")
    lines = [
        f"host {host.get('hostname', '?')}  load {' '.join(f'{x:.2f}' for x in load) if load else 'N/A'}"
        f"  mem {fmt_bytes(host.get('mem_available'))} free of {fmt_bytes(host.get('mem_total'))}",
    ]
    gpus = snap.get("gpus") or []
    if not gpus:
        lines.append(f"GPUs: none ({snap.get('gpu_error') or 'no GPU source'})")
    for g in gpus:
        lines.append(
            f"GPU {g.get('index')} {g.get('name') or 'N/A'}: {fmt_bytes(g.get('mem_used'))}/"
            f"{fmt_bytes(g.get('mem_total'))}  util {na(g.get('util'), '{}%')}  "
            f"{na(g.get('temp'), '{}°C')}  {na(g.get('power'), '{:.0f} W')}"
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


def format_runs(runs: list[dict[str, Any]]) -> str:
    if not runs:
        return "no runs"
    now = time.time()
    rows = [f"{'RUN':<24} {'STATE':<9} {'PID':>7} {'DURATION':>9} {'EXIT':>6}  PATCH  NAME"]
    for r in runs:
        start = r.get("launched_at") or r.get("start_time")
        end = r.get("ended_at") or now
        dur = fmt_duration(end - start) if isinstance(start, (int, float)) else "N/A"
        exit_ = r.get("exit_code") if r.get("exit_code") is not None else (r.get("signal") or "")
        ps = r.get("patch_state")
        patch = (ps.get("version") or ps.get("state") or "-") if isinstance(ps, dict) else "-"
        rows.append(
            f"{r.get('run_id', '?'):<24} {r.get('state', '?'):<9} {na(r.get('pid')):>7} {dur:>9} "
            f"{exit_!s:>6}  {patch:<5}  {r.get('name') or ''}"
        )
    return "\n".join(rows)
