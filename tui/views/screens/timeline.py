"""The timeline screen (`t` on the dashboard): a run's whole life from its timeline on the
host (tui/services/timeline.py), not the dashboard's last 5 minutes. A training run's
loss first (with its lowest, highest and last value), per card a row of Textual's own
`Sparkline` for memory and one for utilisation, the progress rate, and under them an
axis with the phase boundaries and events marked where they fell.

Sparkline, Textual's own widget: it draws a series in one row of block characters,
scales to its width, and needs no plotting dependency; the curves here are shapes over
hours (when memory grew, where throughput dropped), which is what it shows. Every series
is binned on the same time axis first, so a column means the same moment in every row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Sparkline, Static

from tui.protocol.records import RunRecord
from tui.services import timeline as tls

BINS = 240  # time bins per series (the Sparkline folds them to its width)
LETTERS = {"starting": "S", "loading": "L", "loaded": "D", "extracting": "E", "training": "T",
           "evaluating": "V", "serving": "R", "finished": "F"}


def letter(phase: str) -> str:
    return LETTERS.get(phase) or (phase[:1] or "?").upper()


def _bin(points: Sequence[tuple[float, float | None]], end: float, bins: int = BINS,
         before: float = 0.0) -> list[float]:
    """`points` (t, value) on `bins` equal slices of [0, end]: each slice its last value
    (carried forward), `before` before the first."""
    out, i, last = [], 0, before
    pts = sorted((t, v) for t, v in points if v is not None)
    for b in range(bins):
        edge = end * (b + 1) / bins
        while i < len(pts) and pts[i][0] <= edge:
            last = float(pts[i][1])
            i += 1
        out.append(last)
    return out


def _rate(tl: tls.Timeline) -> list[tuple[float, float | None]]:
    """Progress steps per second between consecutive marks of the same kind."""
    out: list[tuple[float, float | None]] = []
    prev: tuple[float, Any] | None = None
    for ln in tl.lines:
        m = ln.get("m")
        if not (isinstance(m, list) and len(m) >= 2 and isinstance(m[1], int)):
            continue
        if prev is not None and prev[1][0] == m[0] and ln["t"] > prev[0]:
            out.append((ln["t"], max(0.0, (m[1] - prev[1][1]) / (ln["t"] - prev[0]))))
        prev = (ln["t"], m)
    return out


class Axis(Static):
    """The time axis under the curves: a phase's letter where it began (`LETTERS`; `^`
    an event), its full name in the legend line."""

    def __init__(self, marks: list[tuple[float, str]], end: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.marks, self.end = marks, end

    def render(self) -> Text:
        width = max(1, self.size.width)
        row = [" "] * width
        for t, ch in self.marks:
            col = min(width - 1, int(width * t / self.end)) if self.end > 0 else 0
            row[col] = ch
        return Text("".join(row), style="bold")


class TimelineScreen(Screen[None]):
    """One run's timeline; escape goes back."""

    BINDINGS = [Binding("escape,q,t", "back", "Back")]
    DEFAULT_CSS = """
    TimelineScreen .row { height: 1; }
    TimelineScreen .label { width: 14; }
    TimelineScreen Sparkline { width: 1fr; }
    TimelineScreen Axis { width: 1fr; }
    TimelineScreen .range { width: 1fr; }
    TimelineScreen #head { height: auto; }
    """

    def __init__(self, run_id: str, tl: tls.Timeline | None, run: RunRecord | None = None) -> None:
        super().__init__()
        self.run_id, self.tl, self.run = run_id, tl, run

    def compose(self) -> ComposeResult:
        tl = self.tl
        if tl is None or not tl.header:
            yield Static(Text(f"run {self.run_id}: no timeline on the host (an adopted run, or one "
                              "launched before timelines)"), id="head")
            yield Footer()
            return
        s = tls.summary(tl, self.run)
        end = max(1.0, tls.end_time(tl) or 1.0)
        yield Static(self._head(s, end), id="head")
        with VerticalScroll():
            yield from self._loss_rows(tl, end)
            series = tls.gpu_series(tl)
            for idx in sorted(series):
                for name, k in (("mem GiB", 0), ("util %", 1)):
                    with Horizontal(classes="row"):
                        yield Static(Text(f"GPU{idx} {name}"), classes="label")
                        yield Sparkline(_bin([(t, v[k]) for t, v in series[idx]], end), summary_function=max)
            with Horizontal(classes="row"):
                yield Static(Text("progress/s"), classes="label")
                yield Sparkline(_bin(_rate(tl), end), summary_function=max)
            with Horizontal(classes="row"):
                yield Static(Text("phases"), classes="label")
                yield Axis(self._marks(tl), end)
            yield Static(self._legend(s), id="legend")
        yield Footer()

    @staticmethod
    def _loss_rows(tl: tls.Timeline, end: float) -> ComposeResult:
        """A training run's loss on the same axis (first, so it shows on a small terminal),
        and under it its lowest, highest and last value; nothing for a run without one."""
        losses = tls.loss_series(tl)
        finite = [(t, v) for t, v, _ in losses if math.isfinite(v)]
        if not losses:
            return
        lo, hi = (min(v for _, v in finite), max(v for _, v in finite)) if finite else (0.0, 0.0)
        with Horizontal(classes="row"):
            yield Static(Text("train loss"), classes="label")
            yield Sparkline(_bin(finite, end, before=lo), summary_function=max)
        _, last, step = losses[-1]
        text = (f"min {lo:.4g}  max {hi:.4g}  " if finite else "") + f"last {last:.4g}" + (
            f" (step {step})" if step is not None else "")
        bad = len(losses) - len(finite)
        with Horizontal(classes="row"):
            yield Static(Text(""), classes="label")
            yield Static(Text(text + (f"  {bad} non-finite" if bad else "")), classes="range")

    @staticmethod
    def _head(s: dict[str, Any], end: float) -> Text:
        def secs(v: Any) -> str:
            return f"{v:.0f}s" if isinstance(v, (int, float)) else "-"

        gh = s.get("gpu_hours")
        return Text(f"run {s.get('run_id')}  {s.get('outcome') or '?'}  load {secs(s.get('load_s'))}  "
                    f"first output {secs(s.get('first_output_s'))}  duration {secs(s.get('duration_s'))}  "
                    f"GPU-h {gh if gh is not None else '-'}  attempts {s.get('attempts')}  "
                    f"(axis 0 → {end:.0f}s; memory and utilisation per card)")

    @staticmethod
    def _marks(tl: tls.Timeline) -> list[tuple[float, str]]:
        marks = []
        for ln in tl.lines:
            if ln.get("e") == "phase":
                marks.append((ln["t"], letter(str(ln.get("phase")))))
            elif ln.get("e") in ("idle", "attempts", "exit"):
                marks.append((ln["t"], "^"))
        return marks

    @staticmethod
    def _legend(s: dict[str, Any]) -> Text:
        parts = [f"{letter(str(p['phase']))}={p['phase']}@{p['after_s']}s" for p in s.get("phases") or []]
        events = [f"^={e.get('e')}@{e.get('t')}s" for e in s.get("events") or []]
        return Text("  ".join(parts + events))

    def action_back(self) -> None:
        self.app.pop_screen()
