"""The agent's file operations (remote/agent/fileops.py) on real files and real subprocesses:
the edges of the bounded read and of the fixed-script runner that the patch screen's
status, compile check and writes stand on."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

from remote.agent import fileops
from remote.base.wire import BadRequest


def test_file_read_takes_a_file_of_exactly_the_limit_and_refuses_one_byte_more(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fileops, "FILE_READ_MAX", 1000)
    f = tmp_path / "f"
    f.write_bytes(b"x" * 1000)
    r = fileops.file_read(str(f))
    assert (r["exists"], r["size"], r["sha256"]) == (True, 1000, hashlib.sha256(b"x" * 1000).hexdigest())
    f.write_bytes(b"x" * 1001)
    with pytest.raises(BadRequest, match="1001 bytes, over the 16 MiB file_read limit"):
        fileops.file_read(str(f))


def test_missing_files_read_and_hash_as_absent(tmp_path: Path) -> None:
    assert fileops.file_read(str(tmp_path / "none"))["exists"] is False
    assert fileops.sha256_file(str(tmp_path / "none")) is None


def test_a_script_that_fails_after_printing_is_a_failure_naming_its_error() -> None:
    script = "import sys; print('{}'); sys.exit('the reason, on stderr')"
    with pytest.raises(BadRequest, match="failed: the reason, on stderr$"):
        fileops.run_python(sys.executable, script, [])


def test_a_script_that_prints_nothing_is_a_failure_with_its_exit_code() -> None:
    with pytest.raises(BadRequest, match=r"failed: exit 0$"):
        fileops.run_python(sys.executable, "pass", [])


def test_a_script_that_hangs_is_cut_at_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fileops, "SUBPROC_TIMEOUT", 0.5)
    with pytest.raises(BadRequest, match="timed out after 0 s"):
        fileops.run_python(sys.executable, "import time; time.sleep(30)", [])


def test_a_python_that_is_not_there_or_not_executable_is_named(tmp_path: Path) -> None:
    with pytest.raises(BadRequest, match="no-such-python-here not found on host"):
        fileops.run_python("no-such-python-here", "pass", [])
    with pytest.raises(BadRequest, match=f"{tmp_path}/missing not found on host"):
        fileops.run_python(str(tmp_path / "missing"), "pass", [])
    plain = tmp_path / "plain"
    plain.write_text("")
    with pytest.raises(BadRequest, match="is not executable on host"):
        fileops.run_python(str(plain), "pass", [])


def test_a_bare_python_name_on_path_is_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """[host] python = "python3": a bare name is looked up on PATH and run."""
    exe = Path(sys.executable)
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    assert fileops.run_python(exe.name, "import json; print(json.dumps({'ok': 1}))", []) == {"ok": 1}
