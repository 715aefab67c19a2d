"""The words and lines a patch set's status is shown in: its state in one word, and the
plan of a push/rollback for the confirmation prompt (the CLI's and the TUI's). Pure."""

from __future__ import annotations

import textwrap
from typing import Any

from tui.state import patches as P

STATE_WORDS = {P.UNKNOWN: "unknown (edited by hand)", P.MISSING: "missing"}


def describe_state(st: dict[str, Any]) -> str:
    """The one-word (or short) state of a status dict: `pristine`, `v3`, `unknown (...)`."""
    state = str(st.get("state"))
    return STATE_WORDS.get(state, state)


def changing_files(st: dict[str, Any], target: str) -> list[str]:
    """Absolute paths of the files a move to `target` rewrites, from a status dict."""
    return [f["abs_path"] for f in st["files"].values()
            if target not in str(f.get("state", "")).split(",")]


def shorten_left(path: str, width: int) -> str:
    """`path` if it fits in `width` columns, else `…` and its end, cut just before a `/`
    when that still keeps the whole file name (`…/data_generation/worker.py`)."""
    if len(path) <= width:
        return path
    tail = path[len(path) - max(width - 1, 1):]
    slash = tail.find("/")
    if 0 <= slash < tail.rfind("/") + 1 and slash < len(tail) - 1:
        tail = tail[slash:]
    return "…" + tail


LABEL = 9  # width of "files:   ", the column the values of plan_lines start at


def plan_lines(st: dict[str, Any], target: str, title: str, host: str,
               width: int | None = None) -> list[str]:
    """What a push/rollback will do, for the confirmation prompt (CLI and TUI).

    With `width` (the dialog's text width) no line is longer: long values wrap under
    their value column and each file path, on its own line, is shortened from the left.
    Without it (the CLI) paths stay whole, so they can be copied.
    """
    files = changing_files(st, target)
    have = st.get("distribution_version") or "unknown version"
    head = [f"host:    {host}",
            f"set:     {st.get('set')} ({st.get('target')}, host has {have})",
            f"state:   {describe_state(st)} → {target}" + (f"  {title}" if title else ""),
            "files:   " + (f"{len(files)} to rewrite" if files else "none (already there)")]
    if width is not None:
        head = [wrapped for line in head
                for wrapped in textwrap.wrap(line, width, subsequent_indent=" " * LABEL,
                                             break_on_hyphens=False)]
    return head + ["  " + (f if width is None else shorten_left(f, width - 2)) for f in files]
