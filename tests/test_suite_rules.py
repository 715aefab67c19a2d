"""The suite's own rules (issue 41): a hang is a failure within two minutes, longer only
for a test marked slow that says why; no test skips itself with importorskip (a skip
even in strict mode); a plain `pytest` names the missing dependencies in its header."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests import checkout, need, timeouts

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = checkout.ROOT

CONFTEST = """\
from tests.timeouts import apply


def pytest_collection_modifyitems(items):
    apply(items)
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest under the project's config, rooted at the scratch dir `tmp_path`."""
    return subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                           str(tmp_path), "-p", "no:cacheprovider", "-q", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=100, env=checkout.env())


def _pytest(tmp_path: Path, test_text: str) -> subprocess.CompletedProcess[str]:
    """A scratch test file under the project's pytest config and its timeout rule."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_scratch.py").write_text(textwrap.dedent(test_text))
    return _run(tmp_path, str(tmp_path / "test_scratch.py"))


def test_the_default_timeout_is_two_minutes_at_most() -> None:
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert float(ini["timeout"]) == timeouts.DEFAULT_S <= 120


def test_a_hang_fails_at_the_tests_bound_not_the_suites(tmp_path: Path) -> None:
    t0 = time.monotonic()
    out = _pytest(tmp_path, """\
        import time, pytest

        @pytest.mark.slow(timeout=2, reason="a scratch test")
        def test_hangs():
            time.sleep(60)
    """)
    assert out.returncode == 1 and "Timeout (>2.0s) from pytest-timeout" in out.stdout + out.stderr, out.stdout[-2000:]
    assert time.monotonic() - t0 < 40


@pytest.mark.parametrize("mark", ["@pytest.mark.timeout(600)", "@pytest.mark.slow(timeout=600)",
                                  '@pytest.mark.slow(timeout=600, reason=" ")'])
def test_a_longer_timeout_without_its_reason_is_refused(tmp_path: Path, mark: str) -> None:
    out = _pytest(tmp_path, f"""\
        import pytest

        {mark}
        def test_long():
            pass
    """)
    assert out.returncode != 0 and "test_scratch.py::test_long" in out.stderr, out.stdout + out.stderr


def test_no_test_skips_itself_with_importorskip() -> None:
    """pytest.importorskip skips even under ./tests/run and CI; tests/need.py's `module`
    fails there and skips only in a developer's partial venv."""
    word = "importorskip"
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "tests").rglob("*.py"))
             if p.name != Path(__file__).name
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if word in line]
    assert not found, f"use tests/need.py's module() instead: {found}"


def test_the_header_names_what_is_missing_and_what_becomes_of_its_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    there = {"transformers", "hypothesis", "pytest_timeout", "textual_serve", "importlinter", "safetensors",
             "tokenizers"}
    monkeypatch.setattr(need, "_has_module", lambda name: name in there)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("EAGLE3_TESTS_STRICT", "0")
    lines = need.header()
    text = "\n".join(lines)
    skip_at, fail_at = text.index("will SKIP"), text.index("will FAIL")
    assert skip_at < text.index("torch (pip install") < fail_at
    assert text.index("playwright (pip install") > fail_at and "tmux (apt-get install tmux)" in text
    assert "transformers" not in text
    monkeypatch.setenv("EAGLE3_TESTS_STRICT", "1")  # ./tests/run: a missing torch fails its tests
    assert "will SKIP" not in "\n".join(need.header())
    monkeypatch.setattr(need, "_has_module", lambda name: True)
    monkeypatch.setattr(need, "_TOOLS", [])
    assert need.header() == ["eagle3-tui: every test dependency found"]


def test_a_plain_pytest_prints_the_header(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-p", "no:cacheprovider",
                          "tests/test_suite_rules.py"], cwd=ROOT, capture_output=True, text=True, timeout=100,
                         env=checkout.env(EAGLE3_TESTS_STRICT="0"))
    head = out.stdout.split("collected", 1)[0]
    assert "eagle3-tui: " in head and ("every test dependency found" in head or "missing" in head), head


def test_no_test_module_defines_a_top_level_name_twice() -> None:
    """ruff's F811 is off for tests/ (a fixture imported from a shared module looks like a
    redefinition at each use), so a second `def pytest_collection_modifyitems` in
    conftest.py silently replaced the first, and a normal user's run ran the tests that
    need root instead of skipping them. Two top-level defs of one name in one file are an
    error here."""
    import ast

    twice = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        seen: set[str] = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name in seen:
                    twice.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
                seen.add(node.name)
    assert not twice, twice


HOOKS = """\
from tests.conftest import (pytest_collection_modifyitems, pytest_runtest_logreport,  # noqa: F401
                            pytest_runtest_makereport, pytest_terminal_summary)
"""


def _scratch_suite(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Two scratch files under the project's conftest hooks: test_a.py says a Slurm tier
    line in each of its tests; test_z.py has a test marked slow."""
    (tmp_path / "conftest.py").write_text(HOOKS)
    (tmp_path / "test_a.py").write_text(textwrap.dedent("""\
        from tests.slurm import LINES

        def test_one():
            LINES.append("story line one")

        def test_two():
            LINES.append("story line two")
    """))
    (tmp_path / "test_z.py").write_text(textwrap.dedent("""\
        import pytest

        def test_quick():
            pass

        @pytest.mark.slow
        def test_long():
            pass
    """))
    return _run(tmp_path, *args, str(tmp_path))


@pytest.mark.parametrize("workers", [[], ["-n", "2", "--dist", "load"]], ids=["one process", "two workers"])
def test_the_slurm_tiers_story_reaches_the_summary_once_with_or_without_workers(
        tmp_path: Path, workers: list[str]) -> None:
    """./tests/run spreads the suite over workers (xdist); the story a worker's tests say
    is printed by the process that writes the summary, each line once."""
    out = _scratch_suite(tmp_path, *workers)
    assert out.returncode == 0, out.stdout + out.stderr
    story = out.stdout[out.stdout.index("Slurm tier"):]
    assert story.count("story line one") == story.count("story line two") == 1, out.stdout


def test_the_files_with_a_slow_test_are_handed_out_first(tmp_path: Path) -> None:
    """A minute-long file handed out last keeps one worker busy while the others idle."""
    out = _scratch_suite(tmp_path, "--collect-only")
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    assert ids == ["test_z.py::test_quick", "test_z.py::test_long", "test_a.py::test_one", "test_a.py::test_two"], \
        out.stdout
