"""The checkout under test, for every subprocess that imports `tui` or `remote`.

The test venv may hold an editable install of another checkout (./tests/run reuses its
venv), and a subprocess started from a temp directory imports whatever that install
points to. Every test that starts `python -m tui.cli`, a `python -c` importing `tui` or
`remote`, or a script that does, takes its environment from `env()`: this repo's root
first on PYTHONPATH. tests/test_checkout.py proves the subprocess imports this checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pythonpath(*first: str | Path, base: dict[str, str] | None = None) -> str:
    """PYTHONPATH with ``first`` (if any), then this checkout's root, then what ``base``
    (default: this process's environment) had."""
    had = (os.environ if base is None else base).get("PYTHONPATH", "")
    parts = [str(p) for p in first] + [str(ROOT)] + [p for p in had.split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(parts))  # each once, first place kept


def env(base: dict[str, str] | None = None, *, first: tuple[str | Path, ...] = (),
        **extra: str) -> dict[str, str]:
    """``base`` (default: this process's environment) with this checkout on PYTHONPATH
    (after ``first``, e.g. a cached site directory that must win) and ``extra`` set."""
    out = dict(os.environ if base is None else base)
    out.update(extra)
    out["PYTHONPATH"] = pythonpath(*first, base=out)
    return out
