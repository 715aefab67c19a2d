"""The architecture, enforced: the import-linter contract (layers, no Textual in the pure
layers, nobody imports the CLI), module size and docstrings, remote/ stdlib-only and
Python-3.9-compatible, ruff and mypy clean (each runs the real tool as a subprocess), and
no private name reached across modules of the project (an AST walk)."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # the client supports 3.10, where tomli is the same parser
    import tomli as tomllib

# Counted apart from the behaviour tests in the run's summary (tests/conftest.py).
pytestmark = pytest.mark.arch

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
REMOTE = sorted(p for p in (ROOT / "remote").rglob("*.py") if "__pycache__" not in p.parts)


def _dotted(path: Path) -> str:
    """remote/run/kill.py -> remote.run.kill; remote/run/__init__.py -> remote.run."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
MAX_LINES = 500
# A module allowed over MAX_LINES while it is being split, with the reason, and the test
# below fails on an entry that is no longer needed.
OVER_SIZE_ALLOWED: dict[str, str] = {
}


def tool(name: str) -> str:
    """A console script of this venv (the test extra pins them), else one on PATH."""
    path = BIN / name
    found = str(path) if path.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return found


def run(args: list[str], cwd: Path = ROOT, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(root))
    return run([tool("lint-imports"), "--config", str(root / "pyproject.toml"), "--no-cache"],
               cwd=root, env=env)


def test_import_contracts_hold() -> None:
    proc = lint_imports(ROOT)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "broken" not in proc.stdout.lower().replace("0 broken", "")


def test_contract_fails_when_a_state_module_imports_textual(tmp_path: Path) -> None:
    # A scratch copy of the project in which one pure module imports Textual.
    for name in ("tui", "remote"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    model = tmp_path / "tui" / "state" / "model.py"
    model.write_text(model.read_text() + "\nimport textual  # noqa: E402,F401\n")
    proc = lint_imports(tmp_path)
    assert proc.returncode != 0, proc.stdout
    assert "tui.state.model -> textual" in proc.stdout, proc.stdout


def _modules(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", _modules("tui", "remote"), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_small_and_says_its_job(path: Path) -> None:
    rel = str(path.relative_to(ROOT))
    source = path.read_text(encoding="utf-8")
    assert ast.get_docstring(ast.parse(source)), f"{rel} has no module docstring"
    lines = source.count("\n")
    if rel not in OVER_SIZE_ALLOWED:
        assert lines < MAX_LINES, f"{rel} has {lines} lines; split it (limit {MAX_LINES})"


def test_oversize_allowlist_names_only_oversize_files() -> None:
    # An entry that is no longer needed must go, so the allowlist only ever shrinks.
    for rel in OVER_SIZE_ALLOWED:
        path = ROOT / rel
        assert path.exists(), f"{rel} is gone: drop it from OVER_SIZE_ALLOWED"
        assert path.read_text(encoding="utf-8").count("\n") >= MAX_LINES, (
            f"{rel} is under {MAX_LINES} lines now: drop it from OVER_SIZE_ALLOWED")


@pytest.mark.parametrize("path", REMOTE, ids=lambda p: str(p.relative_to(ROOT)))
def test_remote_module_imports_with_the_standard_library_only(path: Path) -> None:
    # -I: no PYTHONPATH, no user site; -S: no site-packages at all. What is left is the
    # standard library, as on a bare host. The module is imported as the host does: as
    # `remote.run.kill` from the directory above the package.
    code = ("import sys; sys.path.insert(0, %r); import %s; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in %r); print(bad)"
            % (str(ROOT), _dotted(path), ("tui", "textual", "rich", "asyncssh", "torch")))
    proc = run([sys.executable, "-I", "-S", "-c", code])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout


def test_remote_modules_in_a_bare_venv(tmp_path: Path) -> None:
    # The same in a venv with nothing installed (no pip even), through the venv's python.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True)
    py = tmp_path / "v" / "bin" / "python"
    names = ", ".join(_dotted(p) for p in REMOTE)
    proc = run([str(py), "-I", "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); import {names}"])
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_remote_needs_python_3_9_at_most() -> None:
    proc = run([tool("vermin"), "-t=3.9-", "--no-tips", "--violations", "--no-parse-comments",
                *[str(p) for p in REMOTE]])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_remote_version_check_catches_newer_syntax(tmp_path: Path) -> None:
    # The check above can fail: a 3.10 `match` statement is reported.
    bad = tmp_path / "new.py"
    bad.write_text("def f(x):\n    match x:\n        case 1:\n            return 1\n")
    proc = run([tool("vermin"), "-t=3.9-", "--no-tips", "--violations", str(bad)])
    assert proc.returncode != 0, proc.stdout


def test_ruff_clean() -> None:
    proc = run([tool("ruff"), "check", "--no-cache", "tui", "remote", "tests", "bench"])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr


@pytest.mark.slow(timeout=600,
                  reason="mypy --no-incremental over tui/ and remote/: 25 s idle, ~90 s on a loaded 2-core machine")
def test_mypy_clean() -> None:
    # Strict on all of tui/, the defaults plus untyped bodies on remote/ (pyproject.toml [tool.mypy]).
    proc = run([sys.executable, "-m", "mypy", "--no-incremental", "tui", "remote"])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr


def test_tui_has_every_flag_of_mypys_strict() -> None:
    # pyproject spells --strict out flag by flag (it is not a per-module option): the pinned
    # mypy's own list, read from its --help on one line, is all on for tui/.
    proc = run([sys.executable, "-m", "mypy", "--help"], env=dict(os.environ, COLUMNS="2000"))
    line = next(ln for ln in proc.stdout.splitlines() if ln.split()[:1] == ["--strict"])
    strict = {f.strip().lstrip("-").replace("-", "_") for f in line.split("flags:")[1].split(",")}
    assert len(strict) >= 10 and "disallow_untyped_defs" in strict, line
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    tui = next((o for o in config["overrides"] if o["module"] == ["tui", "tui.*"]), {})
    on = {k for k, v in {**config, **tui}.items() if v is True}
    assert strict <= on, f"not on for tui/: {sorted(strict - on)}"


def test_mypy_checks_a_new_tui_package_strictly_and_remote_bodies(tmp_path: Path) -> None:
    # With the project's config and no paths (its `files`): an unannotated function in a
    # package tui/ does not have yet, and a bad sum in an unannotated function of remote/.
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for pkg in ("tui", "tui/newroom", "remote"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "tui" / "newroom" / "slip.py").write_text("def twice(x):\n    return 2 * x\n")
    (tmp_path / "remote" / "slip.py").write_text("def label():\n    return 1 + 'a'\n")
    proc = run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=tmp_path)
    assert "tui/newroom/slip.py:1: error: Function is missing a type annotation" in proc.stdout, proc.stdout
    assert 'remote/slip.py:2: error: Unsupported operand types for + ("int" and "str")' in proc.stdout, proc.stdout


# -- the agent protocol is the transport's: above it, typed methods only ----------------------

WIRE = ("request", "call_with_progress")  # AgentApi's wire: an op name and an args dict


def wire_uses(root: Path) -> list[str]:
    """Every place under root/tui, outside tui/transport, that touches the wire: reads a
    `.request` / `.call_with_progress` attribute (a call, or an alias that a later call
    would hide behind: `send = client.request`) or asks getattr for one. Those are the
    only ways to pass an op string, so none may exist above the transport."""
    found = []
    for path in sorted((root / "tui").rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[:2] == ("tui", "transport") or "__pycache__" in rel.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in WIRE:
                found.append(f"{rel}:{node.lineno}: .{node.attr}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                  and any(isinstance(a, ast.Constant) and a.value in WIRE for a in node.args)):
                found.append(f"{rel}:{node.lineno}: getattr(…, {node.args[1].value!r})")  # type: ignore[attr-defined]
    return found


def test_no_op_string_above_the_transport() -> None:
    found = wire_uses(ROOT)
    assert not found, "an op string above the transport; use AgentApi's typed methods:\n" + "\n".join(found)


@pytest.mark.parametrize("planted", [
    'async def f(c):\n    return await c.request("read_range", path="x", offset=0, length=1)\n',
    'async def f(c):\n    op = "kill"\n    return await c.call_with_progress(op, None, run_id="r")\n',
    'def f(c):\n    send = c.request\n    return send\n',
    'def f(c):\n    return getattr(c, "request")\n',
])
def test_the_op_string_check_fails_on_a_planted_one(tmp_path: Path, planted: str) -> None:
    shutil.copytree(ROOT / "tui", tmp_path / "tui", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "tui" / "services" / "timeline.py"
    target.write_text(target.read_text() + "\n\n" + planted)
    found = wire_uses(tmp_path)
    assert len(found) == 1 and found[0].startswith("tui/services/timeline.py:"), found


def test_agent_api_has_one_method_per_agent_op() -> None:
    import remote.agent.main  # noqa: F401 - imports every module that declares an op
    from remote.base.wire import OPS  # each op declared once, by @op on its handler
    from tui.transport import AgentApi

    ops = set(OPS)
    methods = {name for name in vars(AgentApi) if not name.startswith("_")} - set(WIRE)
    assert ops and methods == ops, (f"agent ops without a method: {ops - methods}; "
                                    f"methods without an op: {methods - ops}")


# ---- private names stay in the module that owns them ------------------------------------
# A module that needs another's `_name` is cut in the wrong place: the shared piece is
# public API of its owner (a real name, a docstring) or lives where it belongs. Checked
# on the product (tui/, remote/) and on what drives it (tests/, bench/): (a) `from X
# import _name` and (b) `module._name`, where X / module is a module of this project
# (`tui.*`, `remote.*`, and a remote/ module's siblings in its folder imported by their bare
# name, as the host once imported them). Dunder names are not private. A private attribute of an object or a
# class (`ProcTable._cpu`) is out of reach of a static check and not counted.
PROJECT = ("tui", "remote")
SEAM_FOLDERS = ("tui", "remote", "tests", "bench")
# Reaches allowed for now, each with its owner. The test below fails on an entry that is
# no longer needed, so this list only shrinks.
PRIVATE_REACH_ALLOWED: dict[str, str] = {
    # tests of remote/ internals (the same area): a process's CPU base, the ended-runs cache
    "tests/test_agent.py: from remote.agent.proctable import _Proc": "remote",
    "tests/test_host_trust.py: rundir._ENDED": "remote",
}


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _project_module(root: Path, name: str) -> bool:
    """`name` (dotted) is a module or package of this project."""
    if name.split(".")[0] not in PROJECT:
        return False
    base = root.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def private_reaches(root: Path, folders: tuple[str, ...] = SEAM_FOLDERS) -> list[str]:
    """Every `from X import _name` and `module._name` into another module of the project,
    as "path: from X import _name" / "path: alias._name"."""
    found: list[str] = []
    for path in sorted(p for f in folders for p in (root / f).rglob("*.py") if "__pycache__" not in p.parts):
        rel = str(path.relative_to(root))
        here = _module_name(root, path)
        package = here if path.name == "__init__.py" else here.rpartition(".")[0]
        # a remote/ module's siblings in its folder, by bare name
        flat = {p.stem for p in path.parent.glob("*.py")} if rel.startswith("remote/") else set()

        def absolute(module: str | None, level: int) -> str:
            if level == 0:
                name = module or ""
                return f"{package}.{name}" if name.split(".")[0] in flat else name
            base = package.split(".")[: len(package.split(".")) - (level - 1)]
            return ".".join(base + ([module] if module else []))

        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules: dict[str, str] = {}  # a local name bound to a project module -> its dotted name
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                src = absolute(node.module, node.level)
                spelled = "." * node.level + (node.module or "")
                for alias in node.names:
                    if not _project_module(root, src) or src == here:
                        continue
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{rel}: from {spelled} import {alias.name}")
                    elif _project_module(root, f"{src}.{alias.name}"):
                        modules[alias.asname or alias.name] = f"{src}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    name = absolute(alias.name, 0)
                    if _project_module(root, name):
                        bound = alias.asname or alias.name.split(".")[0]
                        modules[bound] = name if alias.asname else name.split(".")[0]
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                continue
            chain, base = [], node.value
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if not isinstance(base, ast.Name) or base.id not in modules:
                continue
            target = ".".join([modules[base.id], *reversed(chain)])
            if target != here and _project_module(root, target):
                found.append(f"{rel}: {ast.unparse(node)}")
    return found


def test_no_private_name_crosses_a_module() -> None:
    found = private_reaches(ROOT)
    new = sorted(set(found) - set(PRIVATE_REACH_ALLOWED))
    assert not new, "private names reached across modules (make them public API of their owner):\n" + "\n".join(new)
    stale = sorted(set(PRIVATE_REACH_ALLOWED) - set(found))
    assert not stale, "no longer needed: drop from PRIVATE_REACH_ALLOWED:\n" + "\n".join(stale)


def test_private_reach_check_catches_both_forms(tmp_path: Path) -> None:
    # A scratch copy of the project with one planted reach of each form.
    for name in ("tui", "remote"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    view = tmp_path / "tui" / "state" / "view.py"
    view.write_text(view.read_text() + "\nfrom tui.state.logbytes import _LEAD_PREFIX  # noqa: E402,F401\n"
                    "from tui.state.loganalysis import lineshapes  # noqa: E402\n_X = lineshapes._LEVELS\n")
    agent = tmp_path / "remote" / "agent" / "main.py"
    agent.write_text(agent.read_text() + "\nfrom ..run import rundir as _rd  # noqa: E402\n_Y = _rd._ENDED\n")
    found = set(private_reaches(tmp_path, ("tui", "remote")))
    assert {"tui/state/view.py: from tui.state.logbytes import _LEAD_PREFIX", "tui/state/view.py: lineshapes._LEVELS",
            "remote/agent/main.py: _rd._ENDED"} <= found, found


# ---- no reach into another object's privates ----------------------------------------
# `x._name` where x is not `self`/`cls` reaches into the privates of whatever x is: of
# another module of the project when `_name` is defined there, of a library (Textual's
# `app._driver`) when it is defined nowhere here. Either way the piece is public API of
# its owner, or the reach goes. A name this module defines alone is its own (a class
# comparing `other._key`). Checked on the product, tui/ and remote/.
STDLIB_PUBLIC = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}  # namedtuple's documented API
# Reaches allowed, by their expression, with the reason; an entry no longer needed fails.
OBJECT_REACH_ALLOWED: dict[str, str] = {
    "os._exit": "the standard library's documented way to leave a forked child",
    "torch._utils": "torch's own tensor rebuild for its zip checkpoints (the extraction job)",
    "torch._utils._rebuild_tensor_v2": "the same",
}


def _names_defined(tree: ast.AST) -> set[str]:
    """Every name a module binds: functions, classes, attributes and variables it assigns,
    imports."""
    names: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            names.add(n.attr)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.alias):
            names.add(n.asname or n.name.split(".")[0])
    return names


def object_reaches(root: Path, folders: tuple[str, ...] = ("tui", "remote")) -> list[str]:
    """Every `x._name` (x not self/cls) whose name another module defines, or none of
    `folders` does, as "path: expression"."""
    paths = sorted(p for f in folders for p in (root / f).rglob("*.py") if "__pycache__" not in p.parts)
    trees = {p: ast.parse(p.read_text(encoding="utf-8")) for p in paths}
    defined = {p: _names_defined(t) for p, t in trees.items()}
    owners: dict[str, set[Path]] = {}
    for p, names in defined.items():
        for name in names:
            owners.setdefault(name, set()).add(p)
    found: list[str] = []
    for p, tree in trees.items():
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")):
                continue
            if isinstance(n.value, ast.Name) and n.value.id in ("self", "cls") or n.attr in STDLIB_PUBLIC:
                continue
            if n.attr in defined[p] and owners[n.attr] == {p}:
                continue
            found.append(f"{p.relative_to(root)}: {ast.unparse(n)}")
    return found


def test_no_reach_into_another_objects_privates() -> None:
    found = object_reaches(ROOT)
    new = sorted({f for f in found if f.partition(": ")[2] not in OBJECT_REACH_ALLOWED})
    assert not new, "private attributes reached from outside their module (make them public API):\n" + "\n".join(new)
    stale = sorted(set(OBJECT_REACH_ALLOWED) - {f.partition(": ")[2] for f in found})
    assert not stale, "no longer needed: drop from OBJECT_REACH_ALLOWED:\n" + "\n".join(stale)


def test_object_reach_check_catches_a_planted_one(tmp_path: Path) -> None:
    # A scratch copy with the reaches this check was written against, put back: a
    # module's private method called from another module, and a Textual private.
    for name in ("tui", "remote"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    blocks = tmp_path / "tui" / "state" / "logpage" / "blocks.py"
    blocks.write_text(blocks.read_text() + "\n\ndef _peek(c: BlockCache) -> int:\n    return c.fetches\n")
    view = tmp_path / "tui" / "state" / "view.py"
    view.write_text(view.read_text() + "\n\ndef _x(app: Any, cache: Any) -> Any:\n"
                    "    return app._driver, cache._peek, app.screen._compositor, self_like._y\n")
    found = set(object_reaches(tmp_path))
    assert {"tui/state/view.py: app._driver", "tui/state/view.py: cache._peek",
            "tui/state/view.py: app.screen._compositor", "tui/state/view.py: self_like._y"} <= found, found
    assert not any(f.startswith("tui/state/logpage/blocks.py") for f in found), found


# A class of the client that defines a private name a library base class defines too
# overrides (or shadows) that library's internals: Textual can rename or drop them in
# any release. Allowed, by qualified name, with the reason; an entry no longer needed fails.
LIBRARY_PRIVATE_OVERRIDES_ALLOWED: dict[str, str] = {
    "tui.views.widgets.tables.KeyedTable._render_cell": (
        "DataTable keys its cell cache by a counter every update_cell bumps, so a 1 Hz tick rendered "
        "every cell again (most of an idle dashboard's CPU); Textual 8.2 has no public hook for a cache "
        "keyed by what a cell shows"),
    "tui.views.driver.NarrowCompositor._get_renders": (
        "Textual renders, for a partial update, every widget whose clip meets the box around the "
        "dirty regions (a panel's clip is the whole screen): a moved clock cell rendered every panel "
        "again. The override only narrows which widgets Textual's own generator renders; "
        "tests/test_dashboard_repaint.py compares the bytes with Textual's"),
}


def library_private_overrides() -> list[str]:
    """"module.Class._name" for each private name a client class body defines that a
    base class from outside the project defines too."""
    import inspect

    found: list[str] = []
    for cls in _client_classes():
        libraries = [b for b in cls.__mro__[1:] if b.__module__.split(".")[0] not in PROJECT]
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
        assert isinstance(body, ast.ClassDef)
        names = {s.name for s in body.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
        names |= {t.id for s in body.body if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)}
        names |= {s.target.id for s in body.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
        for name in sorted(names):
            if name.startswith("_") and not name.startswith("__") and any(name in vars(b) for b in libraries):
                found.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    return found


def test_no_client_class_overrides_a_library_private() -> None:
    found = library_private_overrides()
    new = sorted(set(found) - set(LIBRARY_PRIVATE_OVERRIDES_ALLOWED))
    assert not new, "a library's private name overridden (use its public API):\n" + "\n".join(new)
    stale = sorted(set(LIBRARY_PRIVATE_OVERRIDES_ALLOWED) - set(found))
    assert not stale, "no longer needed: drop from LIBRARY_PRIVATE_OVERRIDES_ALLOWED:\n" + "\n".join(stale)


def _client_classes() -> list[type]:
    """Every class defined in a client module (imports them all, Textual's too)."""
    import importlib
    import inspect
    import pkgutil

    import tui

    classes: list[type] = []
    for info in pkgutil.walk_packages(tui.__path__, "tui."):
        if not info.name.endswith("__main__"):
            module = importlib.import_module(info.name)
            classes += [c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == module.__name__]
    return classes


def split_class_reaches() -> list[str]:
    """A class spread over modules (a screen and its mixin, a base class and its
    subclass) whose part in one module uses `self._name` that a part in another module
    defines: the cut between the files is not where the jobs part. As
    "module.Class: self._name of module.Owner"."""
    import inspect

    found: set[str] = set()
    for cls in _client_classes():
        for part in (b for b in cls.__mro__ if b.__module__.split(".")[0] in PROJECT):
            tree = ast.parse(textwrap.dedent(inspect.getsource(part)))
            used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                    and n.value.id == "self" and n.attr.startswith("_") and not n.attr.startswith("__")}
            for name in used:
                owner = next((o for o in cls.__mro__ if name in vars(o)), None)
                if (owner is not None and owner.__module__.split(".")[0] in PROJECT
                        and owner.__module__ != part.__module__):
                    found.add(f"{part.__module__}.{part.__qualname__}: "
                              f"self.{name} of {owner.__module__}.{owner.__qualname__}")
    return sorted(found)


def test_a_class_spread_over_modules_shares_only_public_names() -> None:
    found = split_class_reaches()
    assert not found, "a class's parts reach each other's privates across modules (cut by job):\n" + "\n".join(found)


@pytest.mark.slow
def test_an_event_the_reducer_does_not_handle_is_a_type_error(tmp_path: Path) -> None:
    # The event vocabulary is closed (tui/state/events.py): in a scratch copy whose
    # reducer forgets one member of the union, mypy fails at the dispatch's assert_never.
    shutil.copytree(ROOT / "tui", tmp_path / "tui", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    reducer = tmp_path / "tui" / "state" / "reducer.py"
    branch = "    if isinstance(event, LinkStatus):\n"
    assert branch in reducer.read_text()
    reducer.write_text(reducer.read_text().replace(branch, "    if False:  # noqa\n"))
    proc = run([sys.executable, "-m", "mypy", "--no-incremental", "tui/state/reducer.py"], cwd=tmp_path)
    assert proc.returncode != 0, proc.stdout
    assert 'Argument 1 to "assert_never" has incompatible type "LinkStatus"' in proc.stdout, proc.stdout


# ---- typed records above the protocol ----------------------------------------------------
# What tui/protocol and tui/transport hand up (a public dataclass's field, a public
# function's or method's return) is typed: no `Any`, no `dict[str, Any]`, where code in
# services, views or cli uses it by name. The host's records are tui/protocol/records.py's.
# (The wire itself, `request` / `call_with_progress`, stays below: checked above.)
ANY = re.compile(r"\bAny\b")


def untyped_crossings(root: Path) -> list[str]:
    """Every `Any`-typed field or return of tui/protocol and tui/transport whose name
    code in tui/services, tui/views or tui/cli uses, as "path:line Owner.name: type"."""
    used: set[str] = set()
    for folder in ("services", "views", "cli"):
        for path in (root / "tui" / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Attribute):
                    used.add(node.attr)
                elif isinstance(node, ast.Name):
                    used.add(node.id)
                elif isinstance(node, ast.alias):
                    used.add(node.name.split(".")[-1])
    found: list[str] = []

    def note(where: str, name: str, annotation: ast.expr | None) -> None:
        if annotation is not None and name in used and not name.startswith("_") and name not in WIRE:
            text = ast.unparse(annotation)
            if ANY.search(text):
                found.append(f"{where}{name}: {text}")

    for path in sorted(p for f in ("protocol", "transport") for p in (root / "tui" / f).rglob("*.py")):
        rel = path.relative_to(root)
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                note(f"{rel}:{node.lineno} ", node.name, node.returns)
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        note(f"{rel}:{item.lineno} {node.name}.", item.target.id, item.annotation)
                    elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        note(f"{rel}:{item.lineno} {node.name}.", item.name, item.returns)
    return found


def test_no_untyped_record_crosses_above_the_protocol() -> None:
    found = untyped_crossings(ROOT)
    assert not found, "typed records above tui/protocol and tui/transport, not Any:\n" + "\n".join(found)


def test_the_untyped_crossing_check_catches_one(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "tui", tmp_path / "tui", ignore=shutil.ignore_patterns("__pycache__"))
    ops = tmp_path / "tui" / "protocol" / "ops.py"
    ops.write_text(ops.read_text().replace("    runs: tuple[RunRecord, ...]\n", "    runs: list[dict[str, Any]]\n"))
    assert [f.split(" ", 1)[1] for f in untyped_crossings(tmp_path)] == ["RunList.runs: list[dict[str, Any]]"]
