"""The run's phase: shard loading (n/N, rate, ETA; one bar per worker that shows one),
then extraction progress or a training loop's (step bar with rate and ETA, and the loss
as a one-line plot over the whole run), then the outcome with the failure's root cause."""

from __future__ import annotations

import itertools
import math
from typing import Any

from rich.text import Text
from textual.widgets import Static

from tui.state.format import duration, num
from tui.state.model import AppState
from tui.views.widgets.render import BLOCKS, bar, set_content

PHASE_STYLE = {
    "starting": "yellow",
    "loading": "cyan",
    "loaded": "cyan",
    "extracting": "green",
    "training": "green",
    "evaluating": "cyan",
    "saving": "cyan",
    "finished": "bold green",
    "failed": "bold red",
    "stalled": "bold yellow",
    "killed": "yellow",
}


def _rate(rate_it_s: float | None) -> str:
    if not rate_it_s:
        return "N/A s/shard"
    return f"{1 / rate_it_s:.1f} s/shard" if rate_it_s < 1 else f"{rate_it_s:.2f} shards/s"


def shard_line(sp: Any, width: int, stopped: bool = False, eta: bool = True) -> Text:
    """One worker's shard bar; on a narrow panel elapsed, then the rate, then the ETA
    give way (the bar and n/N stay). ``stopped``: the run is stalled or hung, so the
    bar's last ETA no longer means anything (an unfinished bar shows none). ``eta``
    False: the load's ETA is said elsewhere (the history line), so none here."""
    label = f"{sp.worker or 'load'}"
    left = None if stopped and sp.done < sp.total else sp.remaining_s
    parts = [
        f" {sp.done}/{sp.total} {sp.percent:3.0f}%", f"  {_rate(sp.rate_it_s)}",
        f"  elapsed {duration(sp.elapsed_s)}", *([f"  ETA {duration(left)}"] if eta else []),
    ]
    for drop in (2, 1, 1):
        if drop >= len(parts):
            break
        if max(len(label), 5) + 1 + 5 + sum(map(len, parts)) <= width:
            break
        parts.pop(drop)
    tail = "".join(parts)
    bar_w = max(width - max(len(label), 5) - 1 - len(tail), 5)
    return Text.assemble((f"{label:<5}", "bold"), " ",
                         bar(sp.done / sp.total if sp.total else None, bar_w, "cyan"), tail)


def _g(x: float | None) -> str:
    return "N/A" if x is None else ("nan" if math.isnan(x) else f"{x:.4g}")


def train_line(tr: Any, width: int, stopped: bool = False) -> Text:
    """The training loop's bar: step n/N (or just n when the total is unknown), rate,
    epoch and ETA; the tail gives way from the right on a narrow panel."""
    frac = tr.step / tr.total if tr.step is not None and tr.total else None
    step = "?" if tr.step is None else str(tr.step)
    parts = [f" step {step}" + (f"/{tr.total} {100 * frac:3.0f}%" if frac is not None else "")]
    if tr.rate:
        unit = tr.rate_unit or "it"
        parts.append(f"  {tr.rate:.3g} {unit}/s" if tr.rate >= 1 else f"  {1 / tr.rate:.3g} s/{unit}")
    if tr.epoch is not None:
        parts.append(f"  epoch {tr.epoch:g}" + (f"/{tr.epochs}" if tr.epochs else ""))
    eta = tr.eta_s
    if eta is None and tr.rate and frac is not None:
        eta = (tr.total - tr.step) / tr.rate
    if frac is not None and frac < 1:
        parts.append(f"  ETA {duration(None if stopped else eta)}")
    while len(parts) > 1 and 6 + 5 + sum(map(len, parts)) > width:
        parts.pop()
    tail = "".join(parts)
    return Text.assemble(("train ", "bold"), bar(frac, max(width - 6 - len(tail), 5), "green"), tail)


def loss_plot(losses: tuple[float, ...], width: int) -> Text:
    """The loss over the whole run in ``width`` cells (each the mean of its share of the
    points), scaled between the run's lowest and highest finite loss (logarithmically
    when it spans more than a factor of 10); a cell holding a NaN/inf loss is a red ✗."""
    vals = list(losses)
    if not vals or width <= 0:
        return Text("")
    n = min(width, len(vals))
    cells: list[float | None] = []
    for i in range(n):
        chunk = vals[i * len(vals) // n:(i + 1) * len(vals) // n] or [vals[-1]]
        cells.append(sum(chunk) / len(chunk) if all(map(math.isfinite, chunk)) else None)
    finite = [c for c in cells if c is not None]
    if finite and min(finite) > 0 and max(finite) > 10 * min(finite):
        # a loss falling by orders of magnitude: on a log scale, or the tail is all ▁
        cells = [None if c is None else math.log(c) for c in cells]
        finite = [c for c in cells if c is not None]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    top = len(BLOCKS) - 1
    marks = "".join("✗" if c is None else BLOCKS[0 if hi <= lo else min(int((c - lo) / (hi - lo) * len(BLOCKS)), top)]
                    for c in cells)
    # One span per run of a style, not one per cell: the row is drawn twice a second while
    # a training log streams, and each span is a segment all the way to the terminal.
    out = Text()
    for bad, run in itertools.groupby(marks, key="✗".__eq__):
        out.append("".join(run), style="bold red" if bad else "magenta")
    return out


def loss_line(tr: Any, width: int) -> Text:
    """ "loss 0.412  lr 3e-05  gnorm 1.2  ▇▆▅▄▃▂▂▁" — the plot takes the rest of the row."""
    head = Text.assemble(("loss  ", "bold"), (_g(tr.loss), "bold red" if tr.loss is not None
                                                and not math.isfinite(tr.loss) else "bold"))
    if tr.lr is not None:
        head.append(f"  lr {tr.lr:.3g}", style="dim")
    if tr.grad_norm is not None:
        head.append(f"  gnorm {_g(tr.grad_norm)}", style="dim")
    finite = [v for v in tr.losses if math.isfinite(v)]
    if len(tr.losses) >= 2 and width - len(head) > 12:
        rng = f" {min(finite):.3g}…{max(finite):.3g}" if finite else ""
        head.append("  ")
        head.append_text(loss_plot(tr.losses, width - len(head) - len(rng)))
        head.append(rng, style="dim")
    return head


class RunProgress(Static):
    DEFAULT_CSS = """
    RunProgress { height: auto; min-height: 3; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    """
    _rows: int | None = None  # rows of the content shown

    def show(self, state: AppState, phase: str | None, run_label: str, history: str | None = None) -> None:
        """``history``: the load from history (`tui.state.history.load_line`), under the bars."""
        a = state.log.analysis
        width = max(self.content_region.width, 20)
        out = Text.assemble(("Phase ", "dim"), (phase or "waiting for log", PHASE_STYLE.get(phase or "", "dim")))
        out.append(f"   {run_label}", style="dim")
        if run_label == "no run" and phase is None:  # an empty host: what would fill this, and how
            config = state.settings.config  # the file read, or where eagle3.toml was looked for
            said = (f"No run yet, and no config file at\n{config.removeprefix('no config file at ')}\n"
                    "(eagle3-tui init writes a commented one);\n" if config.startswith("no config file at ") else
                    f"No run yet. l launches the [run] command of\n{config}\n(or: eagle3-tui launch);\n")
            out = Text(said + "a shows all runs. A run's shard loading\nand extraction show here.", style="dim")
        stopped = phase in ("stalled", "hung")
        if a is not None:
            shards = list(getattr(a, "shards", {}).values()) if isinstance(getattr(a, "shards", None), dict) else []
            for sp in shards[:8]:  # one ETA at a time: with history's line below, that one
                out.append("\n")
                out.append_text(shard_line(sp, width, stopped, eta=history is None))
        if history is not None:
            out.append("\n")
            out.append_text(Text.assemble(("load  ", "bold"), (history, "italic")))
        if a is not None:
            ex = getattr(a, "extract", None)
            if ex is not None and ex.batches:
                out.append("\n")
                frac = (ex.tokens / ex.tokens_total) if ex.tokens and ex.tokens_total else (ex.batch or 0) / ex.batches
                tail = (
                    f" batch {num(ex.batch)}/{num(ex.batches)}  seqs {num(ex.seqs)}/{num(ex.seqs_total)}"
                    f"  {num(ex.tok_s, '{:.0f}')} tok/s"
                    f"  ETA {duration(None if stopped else getattr(ex, 'eta_s', None))}"
                )
                out.append_text(Text.assemble(("extract ", "bold"),
                                              bar(frac, max(width - len(tail) - 9, 5), "green"), tail))
            tr = getattr(a, "train", None)
            if tr is not None and (tr.step is not None or tr.loss is not None):
                out.append("\n")
                out.append_text(train_line(tr, width, stopped))
                if tr.loss is not None:
                    out.append("\n")
                    out.append_text(loss_line(tr, width))
            root = getattr(a, "root_cause", None)
            if root is not None:
                out.append("\n")
                out.append(f"✖ {root.title}", style="bold red")
                out.append(f"  (line {root.line_no} of the tail shown; L opens the log)", style="dim")
                fix = getattr(root, "fix", None)
                if fix:
                    out.append(f"\n  fix: {fix}", style="yellow")
        out.no_wrap, out.overflow = True, "ellipsis"  # a narrow panel cuts lines, never wraps them
        # Its height is its rows: only a change in their number lays the screen out again
        # (a training loop's step and loss change with every line, the rows seldom).
        rows = len(out.plain.split("\n"))
        if set_content(self, out, layout=rows != self._rows):
            self._rows = rows
