"""The GPU panel: one card per GPU with memory bar, utilisation, temperature, power
and a sparkline of recent history. Reads well with 0, 1, 2 or 8 cards."""

from __future__ import annotations

import textwrap
from typing import Any

from rich.text import Text
from textual.widget import Widget
from textual.widgets import Static

from tui.state.format import gib, num
from tui.state.model import AppState, Gpu
from tui.views.widgets.render import bar, sparkline


class GpuPanel(Static):
    DEFAULT_CSS = """
    GpuPanel { height: auto; text-wrap: nowrap; text-overflow: clip; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._state: AppState | None = None
        self._shown: tuple[Any, ...] | None = None

    def show(self, state: AppState) -> None:
        """Repaint when a reading or the history changed; lay out again only when the
        number of cards did (the panel's height follows it)."""
        shown = (state.gpus, state.gpu_source, state.gpu_error, state.gpu_history)
        if shown == self._shown:
            return
        relayout = self._shown is None or len(self._shown[0]) != len(state.gpus)
        self._state, self._shown = state, shown
        self.refresh(layout=relayout)

    def render(self) -> Text:
        state = self._state
        if state is None:
            return Text("waiting for the first snapshot…", style="dim")
        if not state.gpus:  # say why, one reason a line, and what would fill the panel
            if not state.gpu_source:
                head, reasons = "no GPU source:", (state.gpu_error or "the host reported no GPUs").split("; ")
            elif state.gpu_error:  # the source is there but its reading failed: its own words
                head, reasons = f"GPU reading failed ({state.gpu_source}):", [state.gpu_error]
            else:
                head = f"GPUs ({state.gpu_source}):"
                reasons = ["the host reported no GPUs" if state.snapshot_time is not None
                           else "waiting for the first reading"]
            fit = max((self.size.width or 60) - 1, 20)
            out = Text(head, style="bold yellow")
            for line in [w for r in reasons for w in textwrap.wrap(r, fit)]:
                out.append("\n" + line, style="yellow")
            hint = ("On a host with the NVIDIA driver each GPU shows here: memory, load, "
                    "temperature, power and the processes holding it.")
            out.append("\n\n" + "\n".join(textwrap.wrap(hint, fit)), style="dim")
            return out
        width = self.size.width or 80
        # Two lines per card when there is room, one otherwise (100x30 with 8 cards, or
        # a narrow panel).
        room = self.parent.size.height if isinstance(self.parent, Widget) else 0
        compact = 0 < room < 2 * len(state.gpus) or width < 50
        out = Text(no_wrap=True, overflow="crop")  # a narrow panel cuts lines, never wraps them
        for i, gpu in enumerate(state.gpus):
            if i:
                out.append("\n")
            hist = state.gpu_history.get(gpu.index, ())
            out.append_text(self._card(gpu, hist, width, bool(compact)))
        return out

    @staticmethod
    def _card(gpu: Gpu, hist: tuple, width: int, compact: bool) -> Text:
        name = (gpu.name or "N/A").replace("NVIDIA ", "")
        wide = width >= 60
        name_w = 14 if wide else 5
        head = Text.assemble((f"{gpu.index:>2} ", "bold"), (f"{name[:name_w]:<{name_w}} ", ""))
        power = num(gpu.power, "{:.0f}")
        if gpu.power_limit is not None and gpu.power is not None:
            power += f"/{gpu.power_limit:.0f}"
        # Readings in the order they are given up when the panel is narrow (last first).
        parts = [
            f" {gib(gpu.mem_used)}/{gib(gpu.mem_total, 0)} GiB".rjust(15 if wide else 0),
            f" {num(gpu.util, '{:.0f}%'):>4}",
            f" {num(gpu.temp, '{:.0f}°C'):>5}",
            f" {power + ' W' if gpu.power is not None else 'N/A W':>9}",
            f" {len(gpu.processes)}p",
        ]
        min_bar = 6
        spark_w = max(min(20, (width - len(head) - sum(map(len, parts)) - min_bar) // 3), 0) if compact else 0
        while len(parts) > 2 and len(head) + sum(map(len, parts)) + min_bar + spark_w + 1 > width:
            parts.pop()
        stats = "".join(parts) + " "
        bar_w = max(width - len(head) - len(stats) - (spark_w + 1 if spark_w else 0), min_bar)
        line = head + bar(gpu.mem_fraction, bar_w) + Text(stats)
        line.no_wrap, line.overflow = True, "crop"
        if compact:
            if spark_w:
                line.append_text(sparkline((u for _, u in hist), spark_w, top=100.0))
            return line
        half = max((width - 18) // 2, 4)
        spark = Text("   mem ", style="dim")
        spark.append_text(sparkline((m for m, _ in hist), half))
        spark.append(" util ", style="dim")
        spark.append_text(sparkline((u for _, u in hist), half, top=100.0))
        return line + Text("\n") + spark
