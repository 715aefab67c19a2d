"""The `eagle3-tui` command line (click): `main` is the entry point; one module per
command group (connect/demo, runs, patch, watch, inspect); `common` holds what they share.
Nothing outside this package imports it (the import-linter contract in pyproject.toml)."""

from __future__ import annotations

from tui.cli.common import Ctx
from tui.cli.main import main

__all__ = ["Ctx", "main"]
