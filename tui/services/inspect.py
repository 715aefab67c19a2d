"""Post-mortem of a log file: ``eagle3-tui inspect LOGFILE [--json]``.

``inspect_log`` streams the bytes through the same line assembly and fold the live
screen uses (``tui.state.loganalysis.fold``), so memory stays constant apart from the
bounded lists, whatever the file's size. ``format_report`` renders the result.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tui.state.loganalysis.fold import (
    ExtractProgress,
    LogAnalysis,
    ShardProgress,
    finish_lines,
    split_lines,
    step,
)
from tui.state.loganalysis.signatures import SignatureSet

__all__ = ["format_report", "inspect_log"]


def inspect_log(data: bytes | Iterable[bytes], signatures: SignatureSet | None = None) -> dict[str, Any]:
    """Analyse a whole log given as bytes or as an iterator of byte chunks.

    Returns a JSON-ready dict with keys ``phase``, ``shards``, ``extract``, ``train``
    (step, total, loss — "nan" for NaN —, epoch, lr, …; None when the log shows no
    training), ``failures``, ``root_cause``, ``timeline``, ``lines``.
    """
    chunks: Iterable[bytes] = (data,) if isinstance(data, (bytes, bytearray)) else data
    analysis = LogAnalysis(signatures=signatures)
    partial = b""
    count = 0
    for chunk in chunks:
        lines, partial = split_lines(partial, bytes(chunk))
        for line in lines:
            count += 1
            analysis = step(analysis, line, count)
    for line in finish_lines(partial):
        count += 1
        analysis = step(analysis, line, count)
    return _result(analysis, count)


def _shards(sp: ShardProgress | None) -> dict[str, Any] | None:
    if sp is None:
        return None
    return {
        "desc": sp.desc,
        "done": sp.done,
        "total": sp.total,
        "percent": round(sp.percent, 2),
        "rate_it_s": sp.rate_it_s,
        "eta_s": sp.remaining_s,
        "elapsed_s": sp.elapsed_s,
        "worker": sp.worker,
    }


def _extract(ep: ExtractProgress | None) -> dict[str, Any] | None:
    if ep is None:
        return None
    keys = ("batch", "batches", "seqs", "seqs_total", "tokens", "tokens_total", "tok_s",
            "elapsed_s", "eta_s", "done", "output")
    return {k: getattr(ep, k) for k in keys}


def _result(a: LogAnalysis, count: int) -> dict[str, Any]:
    div = a.train.div.to_dict() if a.train is not None else None
    cause = a.root_cause
    return {
        # a run whose root cause is its divergence (remote/run/diverge.py) is in phase "diverged"
        "phase": "diverged" if div is not None and cause is not None and cause.id == div["id"] else a.phase,
        "diverged": div,
        "stage": a.stage,
        "failed_in": a.failed_in,
        "failed_stage": a.failed_stage,
        "failed_after_s": a.failed_after_s,
        "summary": a.failure_summary(),
        "shards": _shards(a.shard),
        "loads": {k: _shards(v) for k, v in a.loads.items()},
        "extract": _extract(a.extract),
        "train": a.train.to_dict() if a.train is not None and a.train.seen_training else None,
        "failures": [f.to_dict() for f in a.failures],
        "root_cause": a.root_cause.to_dict() if a.root_cause is not None else None,
        "timeline": [{"line_no": n, "label": label} for n, label in a.milestones],
        "loaded_at_line": a.loaded_at_line,
        "lines": count,
    }


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _fix_text(fix: Any) -> str:
    if isinstance(fix, dict):
        parts = []
        if fix.get("patch"):
            ver = f" {fix['version']}" if fix.get("version") else ""
            parts.append(f"push patch {fix['patch']}{ver}")
        if fix.get("action"):
            parts.append(f"action: {fix['action']}")
        if fix.get("text"):
            parts.append(fix["text"])
        return "; ".join(parts)
    return str(fix)


def format_report(result: dict[str, Any]) -> str:
    """A human-readable report of an ``inspect_log`` result."""
    phase = result["phase"]
    if result.get("summary"):
        phase += f" ({result['summary']})"
    elif result.get("stage"):
        phase += f" ({result['stage']})"
    out = [f"phase: {phase}   ({result['lines']} lines)"]
    sh = result.get("shards")
    if sh:
        rate = f"{sh['rate_it_s']:.3g} shards/s" if sh.get("rate_it_s") else "rate ?"
        who = f" [{sh['worker']}]" if sh.get("worker") else ""
        out.append(
            f"shards: {sh['done']}/{sh['total']} ({sh['percent']:.0f}%){who}  {rate}  "
            f"elapsed {_dur(sh['elapsed_s'])}  eta {_dur(sh['eta_s'])}"
        )
    for desc, other in (result.get("loads") or {}).items():
        out.append(f"other loader: {desc} {other['done']}/{other['total']}")
    ex = result.get("extract")
    if ex:
        state = "done" if ex["done"] else f"batch {ex['batch']}/{ex['batches']}"
        rate = f"{ex['tok_s']:.1f} tok/s" if ex.get("tok_s") is not None else "? tok/s"
        out.append(
            f"extract: {state}  seqs {ex['seqs']}/{ex['seqs_total']}  "
            f"tokens {ex['tokens']}/{ex['tokens_total']}  {rate}"
        )
    tr = result.get("train")
    if tr:
        of = f"/{tr['total']}" if tr.get("total") else ""
        parts = [f"train: step {tr['step'] if tr.get('step') is not None else '?'}{of}"]
        if tr.get("epoch") is not None:
            parts.append(f"epoch {tr['epoch']:g}" + (f"/{tr['epochs']}" if tr.get("epochs") else ""))
        if tr.get("loss") is not None:
            parts.append(f"loss {tr['loss']:.4g}" if isinstance(tr["loss"], float) else f"loss {tr['loss']}")
        if tr.get("lr") is not None:
            parts.append(f"lr {tr['lr']:.3g}")
        if tr.get("rate"):
            parts.append(f"{tr['rate']:.3g} {tr.get('rate_unit') or 'it'}/s")
        out.append("  ".join(parts))
    rc = result.get("root_cause")
    if rc:
        where = f" [{rc['worker']}]" if rc.get("worker") else ""
        out += [
            "",
            f"root cause (line {rc['line_no']}{where}): {rc['title']}  [{rc['id']}]",
            f"  {rc['line'].strip()}",
            f"  why: {rc['explanation']}",
            f"  fix: {_fix_text(rc['fix'])}",
        ]
    others = [f for f in result.get("failures", []) if not rc or f["line_no"] != rc["line_no"]]
    if others:
        out += ["", f"other failures ({len(others)}):"]
        for f in others[:20]:
            where = f" [{f['worker']}]" if f.get("worker") else ""
            out.append(f"  line {f['line_no']}{where}: {f['id']}: {f['line'].strip()[:120]}")
        if len(others) > 20:
            out.append(f"  … and {len(others) - 20} more")
    if result.get("timeline"):
        out += ["", "timeline:"]
        out += [f"  line {m['line_no']}: {m['label']}" for m in result["timeline"]]
    return "\n".join(out)
