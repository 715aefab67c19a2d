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



# What the suite uses that a partial venv or a bare machine may lack, and what becomes of
# the tests that need it. tests/run installs all of it; a plain `pytest` says in its
# header which are missing (tests/conftest.py, pytest_report_header).
_PIP = "pip install -e '.[test,demo]'"
_SKIPPED = [  # asked for through `module` / `missing` above: a skip, or a failure when strict
    ("torch", "the demo, extraction, restart and patch-contract tests"),
    ("transformers", "the demo, extraction and patch-contract tests"),
    ("safetensors", "the demo tests"),
    ("tokenizers", "the real-vLLM and patch-contract tests"),
]
_FAILED = [  # imported by test modules or their fixtures: a collection error, never a skip
    ("hypothesis", "the property tests"),
    ("textual_serve", "the serve tests"),
    ("playwright", "the browser tests of serve"),
    ("importlinter", "the architecture checks"),
]
_TOOLS = [  # a program, its Debian package, the tests that need it (they fail: never a silent skip)
    ("/usr/sbin/sshd", "openssh-server", "the SSH tests"),
    ("ssh-keygen", "openssh-client", "the SSH tests"),
    ("tmux", "tmux", "the terminal tests"),
    ("sbatch", "slurm-wlm", "the Slurm tests"),
    ("/usr/sbin/munged", "munge", "the Slurm tests"),
    ("/usr/sbin/slurmdbd", "slurmdbd", "the Slurm accounting test"),
    ("/usr/sbin/mariadbd", "mariadb-server", "the Slurm accounting test"),
    ("/usr/bin/chromium", "chromium", "the browser tests of serve"),
]


def _has_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def absent() -> tuple[list[str], list[str]]:
    """(what is missing whose tests skip, what is missing whose tests fail): one line
    each, saying how to get it and whose tests need it. Cheap: finds modules without
    importing them, programs on PATH or at their path."""
    import shutil

    skip = [f"{n} ({_PIP}): {who}" for n, who in _SKIPPED if not _has_module(n)]
    fail = [f"{n} ({_PIP}): {who}" for n, who in _FAILED if not _has_module(n)]
    fail += [f"{prog} (apt-get install {pkg}): {who}" for prog, pkg, who in _TOOLS
             if not (os.access(prog, os.X_OK) if os.path.isabs(prog) else shutil.which(prog))]
    return skip, fail


def header() -> list[str]:
    """pytest's header lines: what is missing, and what becomes of the tests that need it."""
    skip, fail = absent()
    if strict():
        skip, fail = [], fail + skip
    if not skip and not fail and _has_module("pytest_timeout"):
        return ["eagle3-tui: every test dependency found"]
    lines = []
    if skip:
        lines.append(f"eagle3-tui: {len(skip)} test dependencies missing; their tests will SKIP "
                     "(./tests/run installs them, and makes a missing one a failure):")
        lines += ["  " + ln for ln in skip]
    if fail:
        why = " (strict: CI or EAGLE3_TESTS_STRICT=1)" if strict() else ""
        lines.append(f"eagle3-tui: {len(fail)} test dependencies missing; their tests will FAIL{why}:")
        lines += ["  " + ln for ln in fail]
    if not _has_module("pytest_timeout"):
        lines.append(f"eagle3-tui: pytest-timeout missing ({_PIP}): a test that hangs holds the suite")
    return lines
