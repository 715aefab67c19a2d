"""The run's phase: shard loading (n/N, rate, ETA; one bar per worker that shows one),
then extraction progress, then the outcome with the failure's root cause."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from tui.state.format import duration, num
from tui.state.model import AppState
from tui.views.widgets.render import bar, set_content

PHASE_STYLE = {
    "starting": "yellow",
    "loading": "cyan",
    "loaded": "cyan",
    "extracting": "green",
    "finished": "bold green",
    "failed": "bold red",
    "stalled": "bold yellow",
    "killed": "yellow",
}


def _rate(rate_it_s: float | None) -> str:
    if not rate_it_s:
        return "N/A s/shard"
    return f"{1 / rate_it_s:.1f} s/shard" if rate_it_s < 1 else f"{rate_it_s:.2f} shards/s"


def shard_line(sp: Any, width: int, stopped: bool = False) -> Text:
    """One worker's shard bar; on a narrow panel elapsed, then the rate, then the ETA
    give way (the bar and n/N stay). ``stopped``: the run is stalled or hung, so the
    bar's last ETA no longer means anything (an unfinished bar shows none)."""
    label = f"{sp.worker or 'load'}"
    eta = None if stopped and sp.done < sp.total else sp.remaining_s
    parts = [
        f" {sp.done}/{sp.total} {sp.percent:3.0f}%", f"  {_rate(sp.rate_it_s)}",
        f"  elapsed {duration(sp.elapsed_s)}", f"  ETA {duration(eta)}",
    ]
    for drop in (2, 1, 1):
        if max(len(label), 5) + 1 + 5 + sum(map(len, parts)) <= width:
            break
        parts.pop(drop)
    tail = "".join(parts)
    bar_w = max(width - max(len(label), 5) - 1 - len(tail), 5)
    return Text.assemble((f"{label:<5}", "bold"), " ", bar(sp.done / sp.total if sp.total else None, bar_w, "cyan"), tail)


class RunProgress(Static):
    DEFAULT_CSS = """
    RunProgress { height: auto; min-height: 3; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def show(self, state: AppState, phase: str | None, run_label: str) -> None:
        a = state.log.analysis
        width = max(self.content_region.width, 20)
        out = Text.assemble(("Phase ", "dim"), (phase or "waiting for log", PHASE_STYLE.get(phase or "", "dim")))
        out.append(f"   {run_label}", style="dim")
        if run_label == "no run" and phase is None:  # an empty host: what would fill this, and how
            out = Text("No run yet. l launches the [run] command\nof eagle3.toml (or: eagle3-tui launch);\n"
                       "a shows all runs. A run's shard loading\nand extraction show here.", style="dim")
        stopped = phase in ("stalled", "hung")
        if a is not None:
            shards = list(getattr(a, "shards", {}).values()) if isinstance(getattr(a, "shards", None), dict) else []
            for sp in shards[:8]:
                out.append("\n")
                out.append_text(shard_line(sp, width, stopped))
            ex = getattr(a, "extract", None)
            if ex is not None and ex.batches:
                out.append("\n")
                frac = (ex.tokens / ex.tokens_total) if ex.tokens and ex.tokens_total else (ex.batch or 0) / ex.batches
                tail = (
                    f" batch {num(ex.batch)}/{num(ex.batches)}  seqs {num(ex.seqs)}/{num(ex.seqs_total)}"
                    f"  {num(ex.tok_s, '{:.0f}')} tok/s  ETA {duration(None if stopped else getattr(ex, 'eta_s', None))}"
                )
                out.append_text(Text.assemble(("extract ", "bold"), bar(frac, max(width - len(tail) - 9, 5), "green"), tail))
            root = getattr(a, "root_cause", None)
            if root is not None:
                out.append("\n")
                out.append(f"✖ {root.title}", style="bold red")
                out.append(f"  (line {root.line_no} of the tail shown; L opens the log)", style="dim")
                fix = getattr(root, "fix", None)
                if fix:
                    out.append(f"\n  fix: {fix}", style="yellow")
        out.no_wrap, out.overflow = True, "ellipsis"  # a narrow panel cuts lines, never wraps them
        set_content(self, out)
