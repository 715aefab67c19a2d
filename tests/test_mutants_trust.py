"""Trust survivors of issue 41's mutation sample (remote/base/trust.py): whose group write the
agent accepts. A group is the user's private one only while no one else is in it; the
group database is a real /etc/group, bind-mounted in a private mount namespace so the
machine's own is never touched."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROBE = """\
import os, pwd, sys
sys.path.insert(0, sys.argv[1])
from remote.base import trust
uid = int(sys.argv[2])  # the user outside: in a user namespace (a normal user's run) we are its root
print(trust.private_group(pwd.getpwuid(uid).pw_gid, uid))
"""


def _private_with_members(tmp_path: Path, members: list[str]) -> bool:
    """trust.private_group(our primary gid) when /etc/group lists `members` in it."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.fail("needs util-linux's unshare (a private mount namespace): apt-get install util-linux")
    real = Path("/etc/group").read_text().splitlines()
    ours = pwd.getpwuid(os.geteuid()).pw_gid
    lines = [ln if ln.split(":")[2:3] != [str(ours)] else ":".join(ln.split(":")[:3] + [",".join(members)])
             for ln in real]
    fake = tmp_path / ("group-" + "-".join(members or ["none"]))
    fake.write_text("\n".join(lines) + "\n")
    argv = [unshare, "--mount"] + (["--map-root-user"] if os.geteuid() != 0 else [])
    script = 'mount --bind "$1" /etc/group && exec "$2" -c "$3" "$4" "$5"'
    out = subprocess.run([*argv, "sh", "-c", script, "sh", str(fake), sys.executable, PROBE, str(ROOT),
                          str(os.geteuid())],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip() == "True"


def test_a_group_is_private_only_while_no_one_else_is_in_it(tmp_path: Path) -> None:
    me = pwd.getpwuid(os.geteuid()).pw_name
    other = next(p.pw_name for p in pwd.getpwall() if p.pw_name != me)
    if not _private_with_members(tmp_path, []):
        pytest.skip(f"{me}'s primary group is shared here (another account's primary group)")
    assert _private_with_members(tmp_path, [me]) is True  # listed in our own group: still ours
    assert _private_with_members(tmp_path, [other]) is False  # another member could write
    assert _private_with_members(tmp_path, [me, other]) is False


REACH = [(0o700, False), (0o704, False), (0o701, True), (0o710, True), (0o711, True), (0o705, True)]


@pytest.mark.parametrize("dir_mode,refused", REACH, ids=[f"dir-{m:04o}" for m, _ in REACH])
def test_a_writable_file_is_ours_alone_only_where_no_one_else_can_reach_it(
        tmp_path: Path, dir_mode: int, refused: bool) -> None:
    """A run record left world-writable (0666) is still ours alone in a directory no one
    else may enter (no group or other x bit: reading its names is not reaching them); once
    anyone may pass through the directory, anyone may rewrite the record: refused."""
    from remote.base import trust

    d = tmp_path / "sealed"
    d.mkdir()
    rec = d / "record.json"
    rec.write_text("{}")
    os.chmod(rec, 0o666)
    os.chmod(d, dir_mode)
    try:
        if refused:
            with pytest.raises(trust.Untrusted, match="writable by .*others"):
                trust.read_bytes(str(rec), "run record")
        else:
            assert trust.read_bytes(str(rec), "run record") == b"{}"
    finally:
        os.chmod(d, 0o700)


@pytest.mark.parametrize("target", ["./real", "../top/real", "./././real/."])
def test_a_trusted_relative_link_with_dot_parts_leads_where_it_points(tmp_path: Path, target: str) -> None:
    """A runs dir given through a symlink of ours whose target has "." or ".." parts
    (`ln -s ./real runs`): every file is read from where the link points, never from
    the directory that holds the link (where a same-named file may lie)."""
    from remote.base import trust

    top = tmp_path / "top"
    (top / "real" / "run1").mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path, 0o700)
    os.chmod(top, 0o700)
    (top / "real" / "record.json").write_text("the run's")
    (top / "record.json").write_text("a decoy beside the link")
    (top / "runs").symlink_to(target)
    assert trust.read_bytes(str(top / "runs" / "record.json"), "run record") == b"the run's"
    assert trust.check_dir(str(top / "runs" / "run1"), "run dir").st_ino == (top / "real" / "run1").stat().st_ino


def test_a_file_we_create_may_be_shared_to_read_or_run_never_to_write(tmp_path: Path) -> None:
    """open_file's mode: read and execute bits for others are a choice (a script shared
    on purpose); a write bit for the group or others is refused before anything is made."""
    from remote.base import trust

    for mode in (0o600, 0o644, 0o711, 0o755):
        path = tmp_path / f"f-{mode:04o}"
        os.close(trust.open_file(str(path), os.O_WRONLY | os.O_CREAT, "file", mode))
        assert path.is_file()
    for mode in (0o620, 0o602, 0o666, 0o777):
        path = tmp_path / f"w-{mode:04o}"
        with pytest.raises(ValueError, match="writable by others"):
            trust.open_file(str(path), os.O_WRONLY | os.O_CREAT, "file", mode)
        assert not path.exists()


def test_a_link_with_more_dot_dots_than_its_depth_stops_at_the_root(tmp_path: Path) -> None:
    """`..` at / is / (POSIX): a trusted relative link that climbs past the root, then
    names an absolute place, leads there, as the kernel resolves it."""
    from remote.base import trust

    top = tmp_path / "top"
    (top / "real").mkdir(parents=True, mode=0o700)
    (top / "real" / "record.json").write_text("the run's")
    (top / "runs").symlink_to("../" * (len(top.parts) + 5) + str(top / "real").lstrip("/"))
    assert (top / "runs" / "record.json").read_text() == "the run's"  # the kernel's reading
    assert trust.read_bytes(str(top / "runs" / "record.json"), "run record") == b"the run's"
