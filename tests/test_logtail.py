"""The log pane's colouring stays linear on pathological lines (a 1 MB line of word
characters froze the dashboard for minutes with an unanchored `\\w+Error`)."""

from __future__ import annotations

import time

from tui.views.widgets.logtail import style_line


def test_long_lines_are_coloured_quickly_and_shown_cut() -> None:
    t0 = time.perf_counter()
    for line in ("a" * 1_000_000, "x" * 1_000_000 + " RuntimeError: boom", "é" * 500_000):
        text = style_line(line)
        assert len(text.plain) < 2100 and "chars)" in text.plain
    assert time.perf_counter() - t0 < 0.5


def test_severity_colours() -> None:
    assert style_line("ERROR 11-30 02:00:00 [x.py:1] boom").style == "red"
    assert style_line("RuntimeError: Worker failed with error 'State error'").style == "red"
    assert style_line("WARNING 11-30 02:00:00 [x.py:1] slow").style == "yellow"
    assert style_line("INFO ValueErrors are counted").style == ""
