"""The GPU panel: one card per GPU with memory bar, utilisation, temperature, power
and a sparkline of recent history. Reads well with 0, 1, 2 or 8 cards, and a Slurm
job's several nodes as a block each (a line each where the cards do not fit)."""

from __future__ import annotations

import textwrap
from typing import Any

from rich.text import Text
from textual.widget import Widget
from textual.widgets import Static

from tui.protocol.records import GpuReading
from tui.state.format import gib, num
from tui.state.model import AppState
from tui.views.widgets.render import bar, sparkline

# One card's history, as AppState.gpu_history keeps it: (memory fraction, utilisation %) samples,
# oldest first.
History = tuple[tuple[float | None, float | None], ...]


class GpuPanel(Static):
    DEFAULT_CSS = """
    GpuPanel { height: auto; text-wrap: nowrap; text-overflow: clip; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._state: AppState | None = None
        self._shown: tuple[Any, ...] | None = None
        self._mode = ""  # how a job's several nodes were last drawn (_by_node)

    def show(self, state: AppState) -> None:
        """Repaint when a reading, the history or the first snapshot came; lay out again only when the
        number of cards did (the panel's height follows it)."""
        shown = (state.gpus, state.gpu_source, state.gpu_error, state.gpu_history, state.job_nodes,
                 state.snapshot_time is None)  # the first snapshot ends "waiting" even with no card
        if shown == self._shown:
            return
        relayout = (self._shown is None or len(self._shown[0]) != len(state.gpus)
                    or len(self._shown[4]) != len(state.job_nodes))
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
        room = self.parent.size.height if isinstance(self.parent, Widget) else 0
        if len(state.job_nodes) > 1:
            return self._by_node(state, width, room)
        # Two lines per card when there is room, one otherwise (100x30 with 8 cards, or
        # a narrow panel).
        compact = 0 < room < 2 * len(state.gpus) or width < 50
        out = Text(no_wrap=True, overflow="crop")  # a narrow panel cuts lines, never wraps them
        for i, gpu in enumerate(state.gpus):
            if i:
                out.append("\n")
            hist = state.gpu_history.get(gpu.key, ())
            out.append_text(self._card(gpu, hist, width, bool(compact)))
        return out

    def _by_node(self, state: AppState, width: int, room: int) -> Text:
        """A Slurm job on several nodes: a block per node, its name and where it was read
        above its cards; a node not reached is one line saying why, first. Where every card
        does not fit even at one line each (8 GPUs on 2 nodes at 80x24), each node is one
        line: a glyph per GPU for its memory, then the node's totals."""
        groups = [(node, [g for g in state.gpus if g.node == node.node]) for node in state.job_nodes]
        groups.sort(key=lambda group: bool(group[1]) and group[0].error is None)  # nodes not shown first
        shown = [gpus for node, gpus in groups if node.error is None and gpus]
        down = len(groups) - len(shown)
        n = len(state.gpus)
        # The most that fits: a title line per node above its cards (two lines a card,
        # else one); else one line a card, each naming its node; else one line a node.
        mode = ("cards" if not room or room >= len(shown) + 2 * n + down else
                "compact" if room >= len(shown) + n + down else "tagged" if room >= n + down else "nodes")
        if mode != self._mode:  # the panel's height follows the mode: lay it out again
            self._mode = mode
            self.call_after_refresh(self.refresh, layout=True)
        tag_w = min(max(len(node.node) for node, _ in groups), 12)
        out = Text(no_wrap=True, overflow="crop")
        for node, gpus in groups:
            if node.error is not None or not gpus:
                why = node.error or "no GPU reading from its agent"
                out.append_text(Text.assemble((node.node, "bold yellow"), (f" not shown: {why}\n", "yellow")))
                continue
            if mode == "nodes":
                out.append_text(self._node_line(node.node, gpus, tag_w) + Text("\n"))
                continue
            if mode != "tagged":
                out.append_text(Text.assemble(
                    (node.node, "bold"),
                    (f" · {len(gpus)} GPU{'s' if len(gpus) != 1 else ''} · {node.via or ''}\n", "dim")))
            for gpu in gpus:
                card = self._card(gpu, state.gpu_history.get(gpu.key, ()), width - (tag_w + 1) * (mode == "tagged"),
                                  mode != "cards" or width < 50)
                out.append_text((Text(f"{node.node[-tag_w:]:>{tag_w}} ", style="bold") if mode == "tagged" else Text())
                                + card + Text("\n"))
        out.rstrip()
        return out

    @staticmethod
    def _node_line(name: str, gpus: list[GpuReading], name_w: int) -> Text:
        """A node in one line: its name's tail, a glyph per GPU for its memory, then the
        node's mean load, memory and processes (cut from the right when narrow)."""
        used = sum(g.mem_used or 0 for g in gpus)
        total = sum(g.mem_total or 0 for g in gpus)
        utils = [g.util for g in gpus if g.util is not None]
        util = num(sum(utils) / len(utils) if utils else None, "{:.0f}%")
        line = Text(f"{name[-name_w:]:>{name_w}} ", style="bold")
        line.append_text(sparkline((g.mem_fraction for g in gpus), len(gpus), top=1.0))
        line.append(f" {util:>4} {gib(used, 0)}/{gib(total, 0)} GiB {sum(len(g.processes) for g in gpus)}p")
        return line

    @staticmethod
    def _card(gpu: GpuReading, hist: History, width: int, compact: bool) -> Text:
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
