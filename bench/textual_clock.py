"""The floor peer of bench_client.py: the least a dashboard does each second, one
text that changes (a clock), in a bare Textual app with eagle3-tui's driver (so
Textual's input loop does not wake ten times a second: tui/views/driver.py).

    python bench/textual_clock.py

An idle dashboard's screen changes once a second too (a young run's DURATION), so its
idle CPU is read against this app's, measured in the same window at the same time."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from textual.app import App, ComposeResult  # noqa: E402
from textual.driver import Driver  # noqa: E402
from textual.widgets import Static  # noqa: E402

from tui.views.driver import remembering  # noqa: E402


class Clock(App[None]):
    def compose(self) -> ComposeResult:
        yield Static(id="clock")

    def get_driver_class(self) -> type[Driver]:
        return remembering(super().get_driver_class())

    def on_mount(self) -> None:
        self.set_interval(1.0, self.tick)
        self.tick()

    def tick(self) -> None:
        self.query_one(Static).update(time.strftime("%H:%M:%S"), layout=False)


if __name__ == "__main__":
    Clock().run()
