"""Trust on the host: one rule for every file the host side opens as the user it runs as
-- the runs dir, a run dir, the launch lock, run records, the patch journal, a run's
timeline and a run's ``[run] log`` (created in the run's ``cwd``). Standard library
only; Python 3.9+.

The rule (``open_file``, ``check_dir``):

* the path is walked from ``/`` one component at a time (``openat``-style, through
  directory fds), so what is checked is what is opened; a symlink on the way is
  followed only where the directory holding it is trusted -- owned by us or root and
  writable by no one else (or sticky, and the link is ours or root's) -- else refused:
  whoever may change that directory could point it anywhere;
* the last component is never a symlink (``O_NOFOLLOW``), and files are opened
  ``O_NONBLOCK`` and ``lstat``-checked first, so a FIFO can neither block nor feed us;
* what is found must be a regular file (or a directory, for ``check_dir``), owned by
  the user we run as, writable by no group or other user, and, when written, have one
  link (not a hard link to some other file of ours);
* group write is accepted when the group is the user's own private group (named after
  the user or the user's primary group, no other member, no other account's primary
  group): a directory made by hand under the umask 002 of user-private groups;
* otherwise ``Untrusted`` with one line naming the path, its owner and its mode, and
  for a write bit what to run (``chmod g-w PATH``) and why.

Another user who can write the runs dir could plant a run record (``relaunch`` runs its
argv), a manifest (``kill`` signals its pid) or a ``.launch.lock`` symlink (the lock is
created where it points); a planted patch journal would be "rolled back" over any file;
a symlink or FIFO named like a run's log would have root append the run's output to any
file, or block root's shim until they read it.

What we create ourselves gets an explicit mode whatever the umask: directories 0700
(``make_dir``, every level it makes), files 0600 unless the caller shares them on purpose.
"""

from __future__ import annotations

import errno
import fcntl
import grp
import os
import pwd
import shlex
import stat
from typing import Dict, List, Optional, Tuple

MAX_LINKS = 40  # symlinks followed on one path, as the kernel's own limit
_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC


class Untrusted(Exception):
    """A path the agent refuses to use; ``str()`` is the one-line reason."""


def owner_name(uid: int) -> str:
    try:
        return "%s (uid %d)" % (pwd.getpwuid(uid).pw_name, uid)
    except KeyError:
        return "uid %d" % uid


def _group_name(gid: int) -> str:
    try:
        return "%s (gid %d)" % (grp.getgrgid(gid).gr_name, gid)
    except KeyError:
        return "gid %d" % gid


_PRIVATE: Dict[Tuple[int, int], Tuple[Tuple[float, float], bool]] = {}


def _db_stamp() -> Tuple[float, float]:
    out = []
    for f in ("/etc/group", "/etc/passwd"):
        try:
            out.append(os.stat(f).st_mtime)
        except OSError:
            out.append(0.0)
    return out[0], out[1]


def private_group(gid: int, uid: Optional[int] = None) -> bool:
    """`gid` is the user-private group of `uid` (default: us): named after the user or
    the user's primary group, with no member but the user, and no other account's
    primary group. Cached until /etc/group or /etc/passwd changes."""
    uid = os.geteuid() if uid is None else uid
    stamp = _db_stamp()
    hit = _PRIVATE.get((gid, uid))
    if hit is not None and hit[0] == stamp:
        return hit[1]
    try:
        user = pwd.getpwuid(uid)
        group = grp.getgrgid(gid)
        ok = ((group.gr_name == user.pw_name or gid == user.pw_gid)
              and all(m == user.pw_name for m in group.gr_mem)
              and not any(p.pw_gid == gid and p.pw_uid != uid for p in pwd.getpwall()))
    except KeyError:
        ok = False
    _PRIVATE[(gid, uid)] = (stamp, ok)
    return ok


def _writers(st: os.stat_result) -> int:
    """The group/other write bits of `st` that someone other than its owner could use
    (group write of the owner's private group is the owner's own)."""
    bits = st.st_mode & 0o022
    if bits & 0o020 and private_group(st.st_gid, st.st_uid):
        bits &= ~0o020
    return bits


def _fix(path: str, st: os.stat_result, bits: int) -> str:
    """What to run about write bits `bits` on `path` (ours), and why."""
    who = []
    if bits & 0o020:
        who.append("group %s is not yours alone" % _group_name(st.st_gid))
    if bits & 0o002:
        who.append("any user may write it")
    return " -- run chmod %s-w %s (%s: they could plant files the agent would act on)" % (
        {0o020: "g", 0o002: "o", 0o022: "go"}[bits], shlex.quote(path), "; ".join(who))


def problem(path: str, st: os.stat_result, what: str = "", sealed: bool = False) -> Optional[str]:
    """Why `st` (an lstat of `path`) is not ours alone, as one line, or None when it is.
    `sealed`: the file lies in a directory of ours that no one else may even enter
    (no group/other x bit), so its own group/other write bits cannot be used."""
    why = []
    link = stat.S_ISLNK(st.st_mode)
    if link:
        why.append("a symlink")
    if st.st_uid != os.geteuid():
        why.append("not owned by %s" % owner_name(os.geteuid()))
    bits = 0 if link or sealed else _writers(st)
    if bits:
        why.append("writable by %s" % " and ".join(
            w for bit, w in ((0o020, "group"), (0o002, "others")) if bits & bit))
    if not why:
        return None
    return "refusing %s%s: %s; owner %s, mode %04o%s" % (
        what + " " if what else "", path, ", ".join(why), owner_name(st.st_uid),
        stat.S_IMODE(st.st_mode), _fix(path, st, bits) if bits and st.st_uid == os.geteuid() else "")


def _trusted(st: os.stat_result) -> bool:
    """A directory whose entries only we or root can change (`st` of it)."""
    return st.st_uid in (0, os.geteuid()) and not _writers(st)


def _may_follow(dir_st: os.stat_result, link_st: os.stat_result) -> bool:
    if _trusted(dir_st):
        return True  # only we or root could have put it there
    # sticky (/tmp): only the link's owner or the directory's may replace it
    return bool(dir_st.st_mode & stat.S_ISVTX) and dir_st.st_uid in (0, os.geteuid()) \
        and link_st.st_uid in (0, os.geteuid())


def _walk(path: str, what: str, full: str) -> int:
    """A directory fd of `path` (absolute), reached from / one component at a time: a
    symlink is followed only where `_may_follow` allows (else Untrusted, naming it); each
    directory is opened O_NOFOLLOW, so the fd is what was checked. OSError when a part
    is missing."""
    parts: List[str] = [p for p in path.split("/") if p]
    fds = [os.open("/", _DIR_FLAGS)]  # fds[-1] is where we are; ".." pops
    names: List[str] = []  # the path of fds[-1], for the messages
    links = 0
    try:
        while parts:
            name = parts.pop(0)
            if name == ".":
                continue
            if name == "..":
                if len(fds) > 1:
                    os.close(fds.pop())
                    names.pop()
                continue
            try:  # a directory, never through a link: the fd is what the next step uses
                fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fds[-1])
            except OSError as e:
                if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                st = os.stat(name, dir_fd=fds[-1], follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):
                    raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), full) from None
                dir_st = os.fstat(fds[-1])
                if not _may_follow(dir_st, st):
                    raise Untrusted(
                        "refusing %s %s: on its path, %s is a symlink in a directory that is not "
                        "yours or root's alone (owner %s, mode %04o), which could point it anywhere; "
                        "give the path without it" % (what, full, "/" + "/".join(names + [name]),
                                                      owner_name(dir_st.st_uid), stat.S_IMODE(dir_st.st_mode)))
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), full) from None
                target = os.readlink(name, dir_fd=fds[-1])
                if target.startswith("/"):
                    for fd in fds[1:]:
                        os.close(fd)
                    del fds[1:], names[:]
                parts[:0] = [p for p in target.split("/") if p]
                continue
            fds.append(fd)
            names.append(name)
        return fds.pop()
    finally:
        for fd in fds:
            os.close(fd)


def _parent(path: str, what: str) -> Tuple[int, str, str]:
    """(fd of the directory holding `path`, the last component, the absolute path)."""
    full = os.path.abspath(path)
    parent, name = os.path.split(full)
    if not name:
        raise Untrusted("refusing %s %s: not a file" % (what, full))
    return _walk(parent, what, full), name, full


def check_dir(path: str, what: str = "directory") -> os.stat_result:
    """Raise Untrusted unless `path` is a real directory that is ours alone, reached
    without an untrusted symlink (`_walk`); its lstat otherwise. OSError when missing."""
    dfd, name, full = _parent(path, what)
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    finally:
        os.close(dfd)
    reason = problem(path, st, what)
    if reason is None and not stat.S_ISDIR(st.st_mode):
        reason = "refusing %s %s: not a directory" % (what, path)
    if reason:
        raise Untrusted(reason)
    return st


def make_dir(path: str, what: str = "directory") -> os.stat_result:
    """Create `path` and every missing directory above it, each 0700 whatever the umask,
    then `check_dir` it."""
    full = os.path.abspath(path)
    missing = []
    here = full
    while not os.path.lexists(here) and here != os.path.dirname(here):
        missing.append(here)
        here = os.path.dirname(here)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
    return check_dir(path, what)


def _kind(st: os.stat_result) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(st.st_mode):
            return name
    return "not a regular file"


def _file_problem(full: str, st: os.stat_result, what: str, sealed: bool, writing: bool) -> Optional[str]:
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
        reason = problem(full, st, what, sealed)
        if not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode):
            reason = "refusing %s %s: %s, not a regular file; owner %s, mode %04o" % (
                what, full, _kind(st), owner_name(st.st_uid), stat.S_IMODE(st.st_mode))
        return reason
    if writing and st.st_nlink > 1:
        return "refusing %s %s: it has %d hard links (another name could be any file of yours); owner %s, mode %04o" % (
            what, full, st.st_nlink, owner_name(st.st_uid), stat.S_IMODE(st.st_mode))
    return problem(full, st, what, sealed)


def open_file(path: str, flags: int = os.O_RDONLY, what: str = "file", mode: int = 0o600) -> int:
    """An fd of `path` opened under the one rule (see the module): reached by `_walk`,
    never through a symlink, never blocking (a FIFO is refused, not waited on), a regular
    file that is ours alone; Untrusted otherwise (one line). With O_CREAT a missing file
    is created with `mode` (0600 unless shared on purpose; never group/other-writable).
    O_TRUNC is applied only after the checks. The fd is blocking again when returned."""
    if mode & 0o022:
        raise ValueError("open_file: mode %04o is writable by others" % mode)
    trunc, flags = flags & os.O_TRUNC, flags & ~os.O_TRUNC
    writing = bool(flags & (os.O_WRONLY | os.O_RDWR))
    dfd, name, full = _parent(path, what)
    try:
        dir_st = os.fstat(dfd)
        sealed = dir_st.st_uid == os.geteuid() and not dir_st.st_mode & 0o033
        try:  # looked at before it is opened: a FIFO or device is never opened at all
            st: Optional[os.stat_result] = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            if not flags & os.O_CREAT:
                raise
            st = None
        if st is not None:
            reason = _file_problem(full, st, what, sealed, writing)
            if reason:
                raise Untrusted(reason)
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, mode,
                         dir_fd=dfd)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENXIO):
                raise
            try:  # swapped for a symlink or a FIFO since we looked: say what it is now
                now = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                raise e from None
            raise Untrusted(_file_problem(full, now, what, sealed, writing)
                            or "refusing %s %s: it changed while it was opened" % (what, full)) from None
    finally:
        os.close(dfd)
    try:
        got = os.fstat(fd)
        reason = _file_problem(full, got, what, sealed, writing)
        if reason is None and st is not None and (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino):
            reason = "refusing %s %s: it changed while it was opened" % (what, full)
        if reason:
            raise Untrusted(reason)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        if trunc:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: str, what: str = "file") -> bytes:
    """All of a file of ours (`open_file`); OSError when missing, Untrusted when not ours.
    A symlink gives Untrusted, never its target."""
    fd = open_file(path, os.O_RDONLY, what)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def read_tail(path: str, start: int, most: int, what: str = "log") -> bytes:
    """The bytes of a file of ours (`open_file`: never a FIFO, a device or another user's
    file) from ``start``, at most its last ``most``. For the host's readers of a run's log
    (the pace thread, the restart supervisor), which must never block on a log swapped
    for a FIFO. OSError when missing, Untrusted when not ours."""
    fd = open_file(path, os.O_RDONLY, what)
    with os.fdopen(fd, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(start, size - most))
        return f.read(most)

