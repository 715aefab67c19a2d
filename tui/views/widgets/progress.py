"""The run's phase: shard loading (n/N, rate, ETA; one bar per worker that shows one),
then extraction progress or a training loop's (step bar with rate and ETA, and the loss
as a one-line plot over the whole run), then the outcome with the failure's root cause."""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

from rich.text import Text
from textual.geometry import Region, Size
from textual.selection import Selection
from textual.strip import Strip
from textual.widget import Widget

from tui.state.format import duration, num
from tui.state.model import AppState
from tui.views.widgets.render import BLOCKS, StyleOncePerRepaint, bar

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
    # One span per run of a style, not one per cell: the row is drawn up to twice a second while
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


# Never drawn raw, whatever the source (a signature table's title, a config path): a
# control becomes U+FFFD and a TAB a space, one character for one, so the styles stay put.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _drawable(line: Text) -> Text:
    if _CONTROL.search(line.plain) is None:
        return line
    plain = _CONTROL.sub(lambda m: " " if m.group() == "\t" else "\ufffd", line.plain)
    return Text(plain, style=line.style, spans=line.spans)


class RunProgress(StyleOncePerRepaint, Widget):
    """The panel, one row per line of its text (Textual's line API): a new step, loss or
    batch repaints the rows it changed, not the panel. A `Static` rendered all of its
    rows again with each update, through Textual's content pipeline, at ~4 times a log
    row's cost; a training log changes the panel up to twice a second."""

    DEFAULT_CSS = """
    RunProgress { height: auto; min-height: 3; padding: 0 1; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._text = Text()
        self._lines: list[Text] = []
        self._keys: list[tuple[Any, ...]] = []  # each row's text and styles, as drawn
        self._analysis: Any = None  # what `show` was last given: the analysis, and the rest
        self._inputs: tuple[Any, ...] | None = None

    def render(self) -> Text:
        """The whole panel as text (what is shown, before a narrow panel cuts its rows)."""
        return self._text

    def show(self, state: AppState, phase: str | None, run_label: str, history: str | None = None) -> None:
        """``history``: the load from history (`tui.state.history.load_line`), under the bars."""
        a = state.log.analysis
        width = max(self.content_region.width, 20)
        # Each snapshot asks again (once a second): the text is made only when what it
        # shows came from moved (the analysis is a new object whenever a line changed it).
        inputs = (phase, run_label, history, width, state.settings.config)
        if a is self._analysis and inputs == self._inputs:
            return
        self._analysis, self._inputs = a, inputs
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
        self.put(out)

    def put(self, text: Text) -> None:
        """Show ``text``: repaint the rows that changed; lay the screen out again only
        when the number of rows changes (the panel's height is its rows)."""
        lines = [_drawable(ln) for ln in text.split("\n", allow_blank=True)]
        keys = [(ln.plain, tuple(ln.spans), str(ln.style)) for ln in lines]
        if keys == self._keys:
            return
        changed = [y for y, key in enumerate(keys) if y >= len(self._keys) or self._keys[y] != key]
        layout = len(keys) != len(self._keys)
        self._text, self._lines, self._keys = text, lines, keys
        width = self.size.width
        if layout or not width:
            self.refresh(layout=layout)
        else:
            self.refresh(*(Region(0, y, width, 1) for y in changed))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines)

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return max((ln.cell_len for ln in self._lines), default=0)

    def render_line(self, y: int) -> Strip:
        """Row ``y``, cut to the panel's width with an ellipsis (a narrow panel cuts rows,
        never wraps them); Textual keeps the rows it drew and asks only for changed ones."""
        width, base = self.size.width, self.rich_style
        if y >= len(self._lines):
            return Strip.blank(width, base)
        text = self._lines[y].copy()
        text.end = ""
        text.truncate(width, overflow="ellipsis")
        text.stylize_before(base)
        selection = self.text_selection
        if selection is not None and (span := selection.get_span(y)) is not None:
            start, end = span
            text.stylize(self.screen.get_component_rich_style("screen--selection"), start,
                         len(text) if end == -1 else end)
        return Strip(text.render(self.app.console), text.cell_len).extend_cell_length(width, base).apply_offsets(0, y)

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        return selection.extract(self._text.plain), "\n"

