"""The domain layers (protocol, transport, state, services) never import Textual or Rich."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import checkout

DOMAIN = [
    "tui.protocol",
    "tui.services.config",
    "tui.transport",
    "tui.state.model",
    "tui.state.reducer",
    "tui.state.view",
    "tui.state.loganalysis.fold",
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
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=checkout.env())
    assert proc.returncode == 0, f"{module} pulled in: {proc.stdout.strip()} {proc.stderr[-500:]}"


ROOT = Path(__file__).resolve().parents[1]
PURE_FOLDERS = ("tui/protocol", "tui/state", "tui/transport", "tui/services")


def _modules_under(*folders: str) -> list[str]:
    """Every module of these folders, found on disk, so a new module is checked too."""
    names = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _ui_modules_after_import(module: str) -> tuple[int, str, str]:
    code = (
        "import sys, importlib; importlib.import_module(%r); "
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich'))))"
        % module
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=checkout.env())
    return proc.returncode, proc.stdout.strip(), proc.stderr[-500:]


@pytest.mark.parametrize("module", _modules_under(*PURE_FOLDERS))
def test_every_pure_module_imports_without_textual_or_rich(module: str) -> None:
    # A fresh interpreter per module: one module's import cannot hide another's.
    code, loaded, err = _ui_modules_after_import(module)
    assert code == 0, f"{module} does not import: {err}"
    assert loaded == "", f"{module} pulled in: {loaded}"


def test_the_hygiene_check_sees_textual() -> None:
    # The check above can fail: a views module does bring Textual in.
    code, loaded, err = _ui_modules_after_import("tui.views.widgets.gpus")
    assert code == 0, err
    assert "textual" in loaded.split(",")
