"""File operations of the agent: atomic, hash-checked writes; bounded reads; the
fixed helper scripts run with the host's Python; and the ops that serve them (`@op`,
dispatched by main.py). Standard library only."""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import shutil
import stat
import subprocess
from typing import Any, Dict, List, Optional, Tuple

from remote.base import atomicfile
from remote.base.wire import BadRequest, arg, b64, op, user_path, user_path_or_none

FILE_READ_MAX = 16 * 1024 * 1024
READ_RANGE_MAX = 4 * 1024 * 1024
SUBPROC_TIMEOUT = 30.0


RESOLVE_SCRIPT = r"""
import importlib.machinery, importlib.util, json, os, sys
name = sys.argv[1]
parts = name.split(".")
out = {"origin": None, "search_paths": [], "version": None}
spec = importlib.util.find_spec(parts[0])  # top level only: finding does not import
if spec is not None:
    locs = list(spec.submodule_search_locations or [])
    out["search_paths"] = locs
    if len(parts) == 1:
        out["origin"] = spec.origin
    else:
        rel = os.path.join(*parts[1:])
        for loc in locs:
            cands = [os.path.join(loc, rel, "__init__.py")]
            cands += [os.path.join(loc, rel + s) for s in importlib.machinery.all_suffixes()]
            hits = [c for c in cands if os.path.isfile(c)]
            if hits:
                out["origin"] = hits[0]
                break
    try:
        from importlib import metadata
        try:
            out["version"] = metadata.version(parts[0])
        except metadata.PackageNotFoundError:
            dists = getattr(metadata, "packages_distributions", dict)().get(parts[0]) or []
            out["version"] = metadata.version(dists[0]) if dists else None
    except Exception:
        pass
print(json.dumps(out))
"""

COMPILE_SCRIPT = r"""
import json, sys
src = sys.stdin.buffer.read()
try:
    compile(src, sys.argv[1], "exec", dont_inherit=True)
    res = {"ok": True, "error": None}
except SyntaxError as e:
    res = {"ok": False, "error": "%s:%s:%s: %s" % (e.filename, e.lineno, e.offset, e.msg)}
except (ValueError, TypeError) as e:
    res = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
print(json.dumps(res))
"""


def run_python(python: str, script: str, argv: List[str], stdin: bytes = b"") -> Dict[str, Any]:
    """Run one of the fixed scripts with the host's python; its JSON output, or BadRequest."""
    if os.sep not in python and shutil.which(python) is None:
        # A bare name nowhere on PATH (say so, rather than the EACCES of some PATH entry
        # this user may not search).
        raise BadRequest("%s not found on host" % python)
    try:
        out = subprocess.run([python, "-c", script] + argv, input=stdin, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, timeout=SUBPROC_TIMEOUT, check=False)
    except FileNotFoundError:
        raise BadRequest("%s not found on host" % python) from None
    except PermissionError:
        raise BadRequest("%s is not executable on host" % python) from None
    except subprocess.TimeoutExpired:
        raise BadRequest("%s timed out after %d s" % (python, SUBPROC_TIMEOUT)) from None
    lines = out.stdout.decode("utf-8", "replace").strip().splitlines()
    if out.returncode != 0 or not lines:
        err = out.stderr.decode("utf-8", "replace").strip().splitlines()
        raise BadRequest("%s failed: %s" % (python, err[-1] if err else "exit %d" % out.returncode))
    return json.loads(lines[-1])


def sha256_file(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except FileNotFoundError:
        return None


class NotRegularFile(OSError):
    """A log path that names a FIFO, a device or a socket."""


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def open_regular(path: str) -> Tuple[int, os.stat_result]:
    """(fd, stat) of `path` opened for reading, refused unless a regular file. A log path
    can be another user's (an adopted run's stdout), who can swap the file for a FIFO:
    a blocking open would wait for a writer and freeze the agent, so the open never
    blocks (O_NONBLOCK: no effect on a regular file's reads) and anything else is closed."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):
        return fd, st
    os.close(fd)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
    raise NotRegularFile("%s, not a regular file" % next((kind for test, kind in _KINDS if test(st.st_mode)),
                                                         "mode %06o" % st.st_mode))


def read_range(path: str, offset: int, length: int) -> Dict[str, Any]:
    """`length` bytes of `path` from `offset` (base64), with the file's size and inode."""
    if offset < 0 or not 0 <= length <= READ_RANGE_MAX:
        raise BadRequest("read_range needs offset >= 0 and 0 <= length <= 4 MiB")
    try:
        fd, st = open_regular(path)
    except FileNotFoundError:
        raise BadRequest("%s does not exist" % path) from None
    except NotRegularFile as exc:
        raise BadRequest("%s: %s" % (path, exc)) from None
    try:
        data = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    return {"offset": offset, "b64": b64(data), "size": st.st_size, "inode": st.st_ino}


def file_read(path: str) -> Dict[str, Any]:
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_size > FILE_READ_MAX:
                raise BadRequest("%s is %d bytes, over the 16 MiB file_read limit"
                                 % (path, st.st_size))
            data = f.read(FILE_READ_MAX + 1)
    except FileNotFoundError:
        return {"exists": False, "sha256": None, "size": None, "mode": None, "b64": None}
    return {"exists": True, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
            "mode": st.st_mode & 0o7777, "b64": b64(data)}


def file_write(path: str, data: bytes, expect: Optional[str], backup: Optional[str]) -> Dict:
    """Write `data` to `path` atomically if the file's hash is still `expect`."""
    try:
        st: Optional[os.stat_result] = os.stat(path)
        with open(path, "rb") as f:
            current: Optional[bytes] = f.read()
    except FileNotFoundError:
        st, current = None, None
    cur_sha = hashlib.sha256(current).hexdigest() if current is not None else None
    if cur_sha != expect:
        raise BadRequest("%s changed: current sha256 %s, expected %s" % (
            path, cur_sha[:12] if cur_sha else "none (missing)",
            expect[:12] if expect else "none (must not exist)"))
    if backup and current is not None and not os.path.exists(backup):
        atomicfile.write_bytes(backup, current, st)
    atomicfile.write_bytes(path, data, st)
    return {"sha256": sha256_file(path)}


# -- the ops that read and write files (declared here, dispatched by main.py)


@op("logs")
def op_read_range(agent: Any, args: Dict[str, Any], rid: int) -> Any:
    path, offset = user_path(arg(args, "path", str)), arg(args, "offset", int)
    return read_range(path, offset, arg(args, "length", int))


@op("files")
def op_file_read(agent: Any, args: Dict[str, Any], rid: int) -> Any:
    return file_read(user_path(arg(args, "path", str)))


@op("files")
def op_file_write(agent: Any, args: Dict[str, Any], rid: int) -> Any:
    try:
        data = base64.b64decode(arg(args, "b64", str), validate=True)
    except ValueError:
        raise BadRequest("file_write: b64 is not valid base64") from None
    return file_write(user_path(arg(args, "path", str)), data,
               arg(args, "expect_sha256", str, None),
               user_path_or_none(arg(args, "backup", str, None)))


@op("files", long=True)
def op_resolve_module(agent: Any, args: Dict[str, Any], rid: int) -> Any:
    module = arg(args, "module", str)
    if not module or any(not p.isidentifier() for p in module.split(".")):
        raise BadRequest("not a dotted module name: %r" % module)
    return run_python(arg(args, "python", str, "python3"), RESOLVE_SCRIPT, [module])


@op("files", long=True)
def op_py_compile(agent: Any, args: Dict[str, Any], rid: int) -> Any:
    try:
        src = base64.b64decode(arg(args, "b64", str), validate=True)
    except ValueError:
        raise BadRequest("py_compile: b64 is not valid base64") from None
    return run_python(arg(args, "python", str, "python3"), COMPILE_SCRIPT,
                      [arg(args, "filename", str, "<patch>")], src)
