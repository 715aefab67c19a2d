"""remote/ has one import path: every module imports its siblings through the package
(`from remote import x`, `from remote.x import y`), on the host as in the tests and the
client; no relative import, no bare `import x` of a sibling, no fallback between the two.
(Private names across modules, here and in tui/, are tests/test_architecture.py's check.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.arch

ROOT = Path(__file__).resolve().parent.parent
REMOTE = sorted((ROOT / "remote").glob("*.py"))
SIBLINGS = {p.stem for p in REMOTE}


def _imports(source: str) -> list[tuple[int, str, int]]:
    """(line, module, level) of every import in `source`, nested ones included."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, 0) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.lineno, node.module or "", node.level))
    return out


def _offences(source: str) -> list[str]:
    bad = ["%d: relative import" % line for line, _, level in _imports(source) if level]
    bad += ["%d: bare sibling import %s" % (line, mod) for line, mod, level in _imports(source)
            if not level and mod.split(".")[0] in SIBLINGS]
    bad += ["%d: no-redef" % n for n, ln in enumerate(source.splitlines(), 1) if "no-redef" in ln]
    return bad


def test_the_check_sees_each_other_way() -> None:
    old = ("try:\n    from . import wire\nexcept ImportError:\n"
           "    import wire  # type: ignore[no-redef]\n")
    assert _offences(old) == ["2: relative import", "4: bare sibling import wire", "4: no-redef"]
    assert _offences("def f():\n    from rundir import list_runs\n") == ["2: bare sibling import rundir"]
    assert _offences("from remote import wire\nfrom remote.rundir import list_runs\nimport json\n") == []


@pytest.mark.parametrize("path", REMOTE, ids=lambda p: p.name)
def test_remote_module_imports_through_the_package(path: Path) -> None:
    assert _offences(path.read_text(encoding="utf-8")) == []
