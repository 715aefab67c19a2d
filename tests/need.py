"""What a test needs that may be missing, and what happens then.

Under CI (`CI` set) and in ./tests/run (`EAGLE3_TESTS_STRICT=1`, its default) a missing
dependency or tool is a FAILURE with one line naming what to install: a green run never
hides a test that did not run. Anywhere else (a developer's partial venv) it is a skip
with that same line. Hardware is another matter: no GPU, no python3.9 on the machine are
skips everywhere, written as `pytest.mark.skipif(..., reason=...)` at the test, and
./tests/run lists every skip with its reason (-rs).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest


def strict() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("EAGLE3_TESTS_STRICT", "") not in ("", "0")


def missing(why: str) -> NoReturn:
    """Fail (strict) or skip with ``why``: one line saying what is missing and how to get it."""
    if strict():
        pytest.fail(why, pytrace=False)
    pytest.skip(why, allow_module_level=True)


def module(name: str, install: str = "pip install 'eagle3-tui[test,demo]'") -> ModuleType:
    """``import name``, or `missing` naming the install command."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(f"needs {name} ({exc}): {install}")
