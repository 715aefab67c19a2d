"""The test environment's lock, requirements/test.lock, agrees with what it was compiled
from: every requirement of pyproject.toml (the dependencies and the `test` and `demo`
extras) and of requirements/test.in is pinned, once, within its range, on each Python the
project supports; no requirement the project dropped stays pinned as a direct one; none
of torch's CUDA build is in it (tests/run picks that build); tests/run and CI install the
torch it pins; and docs/testing.md gives the very command that wrote it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # the client supports 3.10, where tomli is the same parser
    import tomli as tomllib

# Counted with the architecture checks in the run's summary (tests/conftest.py).
pytestmark = pytest.mark.arch

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "test.lock"
PYTHONS = ("3.10", "3.11", "3.12", "3.13")  # requires-python >= 3.10; CI's python3 may be any
EXTRAS = ("test", "demo")


def wanted(root: Path = ROOT) -> list[Requirement]:
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lines = [*project["dependencies"], *(r for e in EXTRAS for r in project["optional-dependencies"][e])]
    lines += [ln.split("#")[0] for ln in (root / "requirements" / "test.in").read_text().splitlines()]
    return [Requirement(ln) for ln in lines if ln.strip()]


def entries(lock: Path = LOCK) -> list[tuple[Requirement, list[str]]]:
    """Each pin of the lock with its `# via` lines (uv's annotation: what asked for it)."""
    out: list[tuple[Requirement, list[str]]] = []
    for line in lock.read_text(encoding="utf-8").splitlines():
        if line.startswith("    # "):
            if out:
                out[-1][1].append(line.removeprefix("    # ").removeprefix("via").strip(" #"))
        elif line.strip() and not line.startswith("#"):
            out.append((Requirement(line), []))
    return out


def env(python: str) -> dict[str, str]:
    """A Linux x86_64 CPython of that version, as CI and the developers run it."""
    return {**default_environment(), "python_version": python, "python_full_version": python + ".0",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
            "platform_python_implementation": "CPython", "implementation_name": "cpython", "os_name": "posix"}


def pins(python: str, lock: Path = LOCK) -> dict[str, str]:
    """name -> the one version the lock installs on that Python."""
    found: dict[str, list[str]] = {}
    for req, _ in entries(lock):
        if req.marker is None or req.marker.evaluate(env(python)):
            (spec,) = req.specifier
            assert spec.operator == "==", req
            found.setdefault(canonicalize_name(req.name), []).append(spec.version)
    twice = {n: v for n, v in found.items() if len(v) > 1}
    assert not twice, f"pinned twice on Python {python}: {twice}"
    return {n: v[0] for n, v in found.items()}


def disagreements(root: Path = ROOT) -> list[str]:
    out = []
    lock = root / "requirements" / "test.lock"
    for python in PYTHONS:
        have = pins(python, lock)
        for req in wanted(root):
            if req.marker is not None and not req.marker.evaluate(env(python)):
                continue
            got = have.get(canonicalize_name(req.name))
            if got is None:
                out.append(f"Python {python}: {req} is not in the lock")
            elif not req.specifier.contains(got, prereleases=True):
                out.append(f"Python {python}: the lock pins {req.name}=={got}, outside {req}")
    names = {canonicalize_name(r.name) for r in wanted(root)}
    for req, via in entries(lock):
        direct = [v for v in via if v.startswith(("eagle3-tui (pyproject.toml)", "-r requirements/test.in"))]
        if direct and canonicalize_name(req.name) not in names:
            out.append(f"{req.name}: the lock keeps it for {direct[0]}, which no longer asks for it")
    return out


def test_the_lock_pins_every_requirement_within_its_range_on_every_python() -> None:
    assert disagreements() == [], "\n".join(disagreements()) + "\nrefresh the lock: docs/testing.md"


@pytest.mark.parametrize("edit", ["range", "new", "dropped"])
def test_a_lock_that_disagrees_is_named(tmp_path: Path, edit: str) -> None:
    # The check above can fail: a range the pin is outside, a requirement the lock lacks,
    # a pin kept for a requirement pyproject dropped.
    (tmp_path / "requirements").mkdir()
    for name in ("pyproject.toml", "requirements/test.in", "requirements/test.lock"):
        (tmp_path / name).write_text((ROOT / name).read_text(encoding="utf-8"), encoding="utf-8")
    pyproject = tmp_path / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    pattern, repl = {"range": (r'"textual==[^"]*"', '"textual>=99"'),
                     "new": (r'"click>=', '"no-such-package>=1", "click>='),
                     "dropped": (r'\n    "vermin[^"]*",', "")}[edit]
    edited = re.sub(pattern, repl, text, count=1)
    assert edited != text, pattern
    pyproject.write_text(edited, encoding="utf-8")
    said = "\n".join(disagreements(tmp_path))
    assert {"range": "outside textual>=99", "new": "no-such-package>=1 is not in the lock",
            "dropped": "vermin: the lock keeps it for eagle3-tui (pyproject.toml)"}[edit] in said, said


def test_no_package_of_torchs_cuda_build_is_locked() -> None:
    # tests/run installs torch first, the CPU or the CUDA build as the machine has a driver
    # or not; a lock pinning CUDA packages would pull gigabytes onto a CPU machine.
    cuda = [r.name for r, _ in entries() if re.match(r"(nvidia-(?!ml-py$)|cuda-|triton$)", r.name)]
    assert cuda == [], f"add them to requirements/torch-cuda.txt and refresh the lock: {cuda}"


def test_tests_run_and_ci_install_the_locked_torch() -> None:
    (locked,) = {v for p in PYTHONS for n, v in pins(p).items() if n == "torch"}
    for script in ("tests/run", ".ci/run"):
        named = set(re.findall(r"torch==(\d+(?:\.\d+)*)", (ROOT / script).read_text()))
        assert named == {locked}, f"{script} names torch {named}, the lock {locked}"


def test_the_docs_give_the_command_that_wrote_the_lock() -> None:
    header = LOCK.read_text(encoding="utf-8").splitlines()[:2]
    assert header[0].startswith("# This file was autogenerated by uv"), header
    command = header[1].removeprefix("#").strip()
    assert command.startswith("uv pip compile ") and "--universal" in command, command
    assert command in " ".join((ROOT / "docs" / "testing.md").read_text(encoding="utf-8").split()), command
