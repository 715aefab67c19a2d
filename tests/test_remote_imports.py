"""remote/ has one import path: every module imports its siblings through the package
(`from remote import x`, `from remote.x import y`), on the host as in the tests and the
client; no relative import, no bare `import x` of a sibling, no fallback between the two.
And no module reaches into a sibling's private names (`from remote.x import _y`, `x._y`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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


def _private_reaches(source: str) -> list[str]:
    tree = ast.parse(source)
    modules = {}  # local name -> sibling module, from `from remote import x [as y]`
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "remote":
            for a in node.names:
                if node.module == "remote":
                    modules[a.asname or a.name] = a.name
                elif a.name.startswith("_"):
                    bad.append("%d: from %s import %s" % (node.lineno, node.module, a.name))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            bad.append("%d: %s.%s" % (node.lineno, modules[node.value.id], node.attr))
    return bad


@pytest.mark.parametrize("path", REMOTE, ids=lambda p: p.name)
def test_remote_module_imports_through_the_package_and_only_public_names(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    assert _offences(source) + _private_reaches(source) == []


def test_the_reach_check_sees_both_forms() -> None:
    src = ("from remote import kill as killer, rundir\nfrom remote.launch import _new_run_dir\n"
           "f = killer._Finder\nx = rundir._STARTED_ONLY\ny = rundir.__file__\nz = killer.RunFinder\n")
    assert _private_reaches(src) == ["2: from remote.launch import _new_run_dir",
                                     "3: kill._Finder", "4: rundir._STARTED_ONLY"]
