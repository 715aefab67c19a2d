"""The real speculators 0.3.0 wheel for the patch tests: downloaded once, then cached.

The cache is `$EAGLE3_TUI_TEST_CACHE` or `~/.cache/eagle3-tui-tests`. Without network
and without a cached wheel the tests that need it are skipped with the reason -- except
under CI (`CI` set), where that is a failure, so a broken download never hides as a skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tests import need

SPEC = "speculators==0.3.0"
WHEEL_NAME = "speculators-0.3.0-py3-none-any.whl"
PACKAGE_FILES = ("data_generation/vllm_hidden_states_generator.py",
                 "data_generation/custom_worker.py")


def cache_dir() -> Path:
    return Path(os.environ.get("EAGLE3_TUI_TEST_CACHE") or Path.home() / ".cache" / "eagle3-tui-tests")


def wheel_path() -> Path:
    """Path of the cached wheel, downloading it with pip if needed."""
    cache = cache_dir()
    wheel = cache / WHEEL_NAME
    if wheel.is_file():
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                           SPEC, "-d", str(cache)], capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0 or not wheel.is_file():
        why = f"cannot download {SPEC}: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}"
        need.missing(why)
    return wheel


def package_bytes(rel: str) -> bytes:
    """One file of the `speculators` package, `rel` relative to the package directory."""
    with zipfile.ZipFile(wheel_path()) as z:
        return z.read(f"speculators/{rel}")


def pristine_files() -> dict[str, bytes]:
    """The pristine bytes of the files the bundled patch set targets."""
    return {rel: package_bytes(rel) for rel in PACKAGE_FILES}


def unpack(site_dir: Path) -> Path:
    """Unzip the whole wheel into `site_dir` (a site-packages stand-in); returns the
    package directory `site_dir/speculators`."""
    with zipfile.ZipFile(wheel_path()) as z:
        z.extractall(site_dir)
    return site_dir / "speculators"


def speculators_site(root: Path, files: dict[str, bytes]) -> Path:
    """`root` holding a minimal `speculators/` package: the given generator/worker files,
    the two sibling modules they import, and an empty package `__init__` (the real one
    imports the whole library). Returns `root`, for sys.path."""
    pkg = root / "speculators"
    (pkg / "data_generation").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for rel in ("data_generation/__init__.py", "data_generation/logging_utils.py"):
        (pkg / rel).write_bytes(package_bytes(rel))
    for rel, data in files.items():
        (pkg / rel).write_bytes(data)
    return root
