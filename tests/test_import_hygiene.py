"""The domain layers (protocol, transport, state, services) never import Textual or Rich."""

from __future__ import annotations

import subprocess
import sys

import pytest

DOMAIN = [
    "tui.protocol",
    "tui.services.config",
    "tui.transport",
    "tui.state.model",
    "tui.state.reducer",
    "tui.state.view",
    "tui.state.logparse",
    "tui.services.actions",
    "tui.services.inspect",
    "tui.state.advice",
    "tui.state.patches",
    "tui.services.ledger",
    "tui.state.watch",
    "tui.services.notify",
    "tui.cli.watch",
]


@pytest.mark.parametrize("module", DOMAIN)
def test_domain_module_imports_without_textual(module: str) -> None:
    code = (
        "import sys, importlib; importlib.import_module(%r); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich')); "
        "print(','.join(bad)); sys.exit(1 if bad else 0)" % module
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, f"{module} pulled in: {proc.stdout.strip()} {proc.stderr[-500:]}"
