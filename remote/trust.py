"""Trust on the host: what the agent reads or writes under its own directories (the runs
dir, a run dir, the launch lock, run records, the patch journal) must be owned by the
user the agent runs as and writable by nobody else, and is never reached through a
symlink. Standard library only; Python 3.9+.

The rule is strict: a directory that another user owns, or that group or others may
write (sticky bit or not), is refused with one line naming the path, its owner and its
mode; so is a file of ours that is a symlink, or that someone else owns or may write.
Another user who can write the runs dir could plant a run record (``relaunch`` runs its
argv), a manifest (``kill`` signals its pid) or a ``.launch.lock`` symlink (the lock is
created where it points); a planted patch journal would be "rolled back" over any file.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from typing import Optional


class Untrusted(Exception):
    """A path the agent refuses to use; ``str()`` is the one-line reason."""


def owner_name(uid: int) -> str:
    try:
        return "%s (uid %d)" % (pwd.getpwuid(uid).pw_name, uid)
    except KeyError:
        return "uid %d" % uid


def problem(path: str, st: os.stat_result, what: str = "", sealed: bool = False) -> Optional[str]:
    """Why `st` (an lstat of `path`) is not ours alone, as one line, or None when it is.
    `sealed`: the file lies in a directory of ours that no one else may even enter
    (no group/other x bit), so its own group/other write bits cannot be used."""
    why = []
    if stat.S_ISLNK(st.st_mode):
        why.append("a symlink")
    if st.st_uid != os.geteuid():
        why.append("not owned by %s" % owner_name(os.geteuid()))
    if st.st_mode & 0o022 and not stat.S_ISLNK(st.st_mode) and not sealed:
        why.append("writable by %s" % " and ".join(
            w for bit, w in ((0o020, "group"), (0o002, "others")) if st.st_mode & bit))
    if not why:
        return None
    return "refusing %s%s: %s; owner %s, mode %04o" % (
        what + " " if what else "", path, ", ".join(why), owner_name(st.st_uid),
        stat.S_IMODE(st.st_mode))


def _sealed(d: str) -> bool:
    """`d` is a real directory of ours that group and others cannot enter: a file in it
    written under a umask of 002 (an older record, 0664) is still ours alone."""
    try:
        st = os.lstat(d)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o033


def check_dir(path: str, what: str = "directory") -> os.stat_result:
    """lstat `path` and raise Untrusted unless it is a real directory that is ours alone."""
    st = os.lstat(path)
    reason = problem(path, st, what)
    if reason is None and not stat.S_ISDIR(st.st_mode):
        reason = "refusing %s %s: not a directory" % (what, path)
    if reason:
        raise Untrusted(reason)
    return st


def make_dir(path: str, what: str = "directory") -> os.stat_result:
    """Create `path` (and its parents) 0700 when missing, then `check_dir` it."""
    os.makedirs(path, 0o700, exist_ok=True)
    return check_dir(path, what)


def open_file(path: str, flags: int = os.O_RDONLY, what: str = "file") -> int:
    """An fd of `path` opened without following a symlink (O_NOFOLLOW), checked to be ours
    alone; Untrusted otherwise. With O_CREAT a missing file is created 0600."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        reason = problem(path, st, what, _sealed(os.path.dirname(os.path.abspath(path))))
        if reason is None and not stat.S_ISREG(st.st_mode):
            reason = "refusing %s %s: not a regular file" % (what, path)
        if reason:
            raise Untrusted(reason)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: str, what: str = "file") -> bytes:
    """All of a file of ours (`open_file`); OSError when missing, Untrusted when not ours.
    A symlink gives Untrusted (ELOOP from O_NOFOLLOW), never its target."""
    try:
        fd = open_file(path, os.O_RDONLY, what)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Untrusted("refusing %s %s: a symlink" % (what, path)) from None
        raise
    with os.fdopen(fd, "rb") as f:
        return f.read()
