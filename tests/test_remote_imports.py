"""remote/ has one import path: every module imports the others through the package
(`from remote.run import kill`, `from remote.base.wire import one_line`), on the host as in
the tests and the client; no relative import, no bare `import x` of a sibling (a module of
the package or one of its rooms), no fallback between the two.
(Private names across modules, here and in tui/, are tests/test_architecture.py's check.)"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.arch

ROOT = Path(__file__).resolve().parent.parent
REMOTE = sorted(p for p in (ROOT / "remote").rglob("*.py") if "__pycache__" not in p.parts)
# What a bare import could wrongly mean: a module or a room of the package. Not `vllm`:
# extraction/vllm.py is the job's vLLM backend, and `import vllm` there is vLLM itself (an
# entry point started as a file takes its own folder off sys.path: tests/test_extract.py).
SIBLINGS = ({p.stem for p in REMOTE} | {p.parent.name for p in REMOTE}) - {"__init__", "remote", "vllm"}


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
    assert _offences("def f():\n    from run.rundir import list_runs\n") == ["2: bare sibling import run.rundir"]
    assert _offences("from remote.base import wire\nfrom remote.run.rundir import list_runs\nimport json\n") == []


@pytest.mark.parametrize("path", REMOTE, ids=lambda p: str(p.relative_to(ROOT)))
def test_remote_module_imports_through_the_package(path: Path) -> None:
    assert _offences(path.read_text(encoding="utf-8")) == []


def test_no_module_or_room_is_named_like_a_standard_module() -> None:
    # An entry point started as a file has its own folder first on sys.path while its
    # standard imports run (before it moves the folder off): a `json.py` there would be json.
    names = {p.stem for p in REMOTE} | {p.parent.name for p in REMOTE}
    assert not names & set(sys.stdlib_module_names), names & set(sys.stdlib_module_names)


# The entry points as the client, the shim, Slurm and users start them: files, from another
# directory, on a bare host Python (-E -S: no site-packages, no PYTHONPATH; not -I,
# which would keep the file's own folder off sys.path by itself). Each gets as
# far as its usage line (or the agent's hello): every import resolved through the package.
ENTRIES = [
    ("agent/main.py", [], '"type":"hello"'),
    ("agent/step.py", [], ""),  # exit 2, silent: no RUN_ID
    ("run/shim.py", [], "usage: shim.py supervise RUN_DIR"),
    ("run/restart.py", [], "usage: restart.py RUN_DIR"),
    ("extract.py", ["--help"], "usage: extract.py"),
    ("extraction/preflight.py", ["--help"], "usage: preflight.py"),
]


@pytest.mark.parametrize(("entry", "args", "says"), ENTRIES, ids=[e[0] for e in ENTRIES])
def test_entry_point_starts_as_a_file(tmp_path: Path, entry: str, args: list[str], says: str) -> None:
    proc = subprocess.run([sys.executable, "-E", "-S", "-u", str(ROOT / "remote" / entry), *args],
                          cwd=tmp_path, input="", capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 2) and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert says in proc.stdout + proc.stderr


@pytest.mark.parametrize("argv", [["extraction/preflight.py"], ["extract.py", "--preflight"]], ids=" ".join)
def test_the_preflight_started_as_a_file_imports_vllm_not_its_backend_module(tmp_path: Path, argv: list[str]) -> None:
    # extraction/vllm.py is the job's vLLM backend: were that folder on sys.path (the way
    # Python starts preflight.py as a file), `import vllm` would find it ("ok import vllm:
    # ... at .../remote/extraction") instead of vLLM, here not installed (-S).
    proc = subprocess.run([sys.executable, "-E", "-S", str(ROOT / "remote" / argv[0]), *argv[1:]],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    line = next((ln for ln in proc.stdout.splitlines() if "import vllm" in ln), proc.stdout + proc.stderr)
    assert line == "[preflight] FAIL import vllm: ModuleNotFoundError: No module named 'vllm'", proc.stdout
