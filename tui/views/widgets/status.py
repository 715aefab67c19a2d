"""The top line: target, host, connection state and how old the data is."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import Static

from tui.state.format import duration, gib
from tui.state.model import AppState
from tui.state.view import link_text
from tui.views.widgets.render import set_content


class StatusBar(Static):
    DEFAULT_CSS = """
    StatusBar { height: 1; background: $boost; padding: 0 1; }
    """

    def show(self, state: AppState, now: float | None = None) -> None:
        now = time.time() if now is None else now
        link = state.link
        age = None if link.last_data is None else max(0.0, now - link.last_data)
        text = Text.assemble(("eagle3-tui ", "bold"), ("▸ ", "dim"), (state.target, "bold cyan"))
        if state.hostname:
            text.append(f"  host {state.hostname}")
        live, kind = link_text(state, now)  # the view model's verdict: connected, stale, lost
        dot = {
            "connected": (f"● {live}", "green" if kind == "ok" else "bold yellow"),
            "connecting": ("◌ connecting…", "yellow"),
            "reconnecting": (f"◌ reconnecting (attempt {link.attempt})", "yellow"),
            "failed": ("✖ failed", "red"),
            "closed": ("○ closed", "dim"),
        }.get(link.state, (link.state, "yellow"))
        text.append("  ")
        text.append(*dot)
        if age is not None and link.state != "connected":
            text.append(f", data {duration(round(age))} old", style="yellow")
        if link.error and link.state != "connected":
            text.append(f"  {link.error}", style="red")
        host = state.host
        if host.load:
            text.append(f"  load {host.load[0]:.2f}")
        if host.mem_total:
            used = host.mem_total - (host.mem_available or 0) if host.mem_available is not None else None
            text.append(f"  mem {gib(used, 0)}/{gib(host.mem_total, 0)} GiB")
        if state.hostname:  # where the GPU readings come from: NVML, else nvidia-smi (two processes a look)
            text.append(f"  GPUs: {state.gpu_source or 'none'}")
        if state.agent:
            text.append(f"  {state.agent}", style="dim")
        set_content(self, text, layout=False)  # one line, fixed height: no layout; unchanged: no repaint
