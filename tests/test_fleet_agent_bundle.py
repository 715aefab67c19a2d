"""The agent's files (tui/transport/bundle.py): the `remote` package in its shape, its
rooms with their `__init__.py`; read and hashed once for a fleet's hundreds of connects,
and again when a file of the package changes (agent_bundle); written on a host without
SFTP by the exec fallback (hostpython.UPLOAD), which keeps every file inside its dir."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import remote
from tui.transport import hostpython
from tui.transport.bundle import agent_bundle, agent_files, agent_sha


def test_the_bundle_is_read_again_only_when_a_file_changes(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "main.py").write_text("print('v1')\n")
    (tmp_path / "helper.py").write_text("X = 1\n")
    files, sha = agent_bundle(tmp_path)
    assert sha == agent_sha(agent_files(tmp_path)) and "remote/helper.py" in files
    assert agent_bundle(tmp_path)[0] is files  # not read again

    (tmp_path / "helper.py").write_text("X = 22\n")  # another size
    files2, sha2 = agent_bundle(tmp_path)
    assert sha2 != sha and files2["remote/helper.py"] == b"X = 22\n"

    st = (tmp_path / "helper.py").stat()
    (tmp_path / "helper.py").write_text("X = 33\n")  # the same size, another mtime
    os.utime(tmp_path / "helper.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert agent_bundle(tmp_path)[1] == agent_sha(agent_files(tmp_path)) != sha2

    (tmp_path / "new.py").write_text("")  # a file added
    assert "remote/new.py" in agent_bundle(tmp_path)[0]


def test_the_bundle_carries_the_rooms_with_their_init_files(tmp_path: Path) -> None:
    # The package's subpackages travel in their shape (remote/run/kill.py, and the
    # __init__.py that makes `remote.run` importable on the host); bytecode does not.
    for rel in ("__init__.py", "agent/__init__.py", "agent/main.py", "run/__init__.py", "run/kill.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"# {rel}\n")
    (tmp_path / "run" / "__pycache__").mkdir()
    (tmp_path / "run" / "__pycache__" / "stale.py").write_text("")
    files, sha = agent_bundle(tmp_path)
    assert {n for n in files if n.startswith("remote/")} == {
        "remote/__init__.py", "remote/agent/__init__.py", "remote/agent/main.py",
        "remote/run/__init__.py", "remote/run/kill.py"}
    (tmp_path / "run" / "kill.py").write_text("# another kill\n")  # a change deep down
    assert agent_bundle(tmp_path)[1] != sha


def _upload(files: dict[str, bytes], dest: Path) -> subprocess.CompletedProcess[str]:
    """hostpython.UPLOAD (the exec fallback of a host without SFTP) run here, as the host would."""
    payload = json.dumps({n: (base64.b64encode(d).decode(), hashlib.sha256(d).hexdigest()) for n, d in files.items()})
    return subprocess.run([sys.executable, "-c", hostpython.UPLOAD, str(dest), "abc"], input=payload,
                          capture_output=True, text=True, timeout=60)


def test_the_exec_upload_writes_the_package_in_its_shape(tmp_path: Path) -> None:
    files = agent_files(Path(remote.__file__).parent)
    proc = _upload(files, tmp_path / "agent-x")
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr
    assert {str(p.relative_to(tmp_path / "agent-x")) for p in (tmp_path / "agent-x").rglob("*.py")} == set(files)
    assert (tmp_path / "agent-x" / "remote" / "run" / "__init__.py").is_file()


@pytest.mark.parametrize("name", ["remote/../../escape.py", "remote/./x.py", "remote//x.py", "remote/.hidden/x.py",
                                  "/abs.py"])
def test_the_exec_upload_refuses_a_name_that_leaves_the_tree(tmp_path: Path, name: str) -> None:
    proc = _upload({name: b"x = 1\n"}, tmp_path / "d" / "agent-x")
    assert proc.returncode != 0 and "checksum mismatch for " + name in proc.stderr
    assert not [p for p in tmp_path.rglob("*.py")]
