"""The agent's files and content hash are read once for a fleet's hundreds of connects,
and again when a file of the package changes (tui/transport/bundle.py agent_bundle)."""

from __future__ import annotations

import os
from pathlib import Path

from tui.transport.bundle import agent_bundle, agent_files, agent_sha


def test_the_bundle_is_read_again_only_when_a_file_changes(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text("print('v1')\n")
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
