"""Atomic file writes on the host: the one helper every remote module uses.

Readers see the old file or the whole new one, never a part: the data goes to a temp
file in the same directory (hidden, ending in ``.tmp``), is fsynced, renamed over the
target with ``os.replace``, and the directory is fsynced so the rename survives a crash.
Standard library only; Python 3.9+.
"""

from __future__ import annotations

import binascii
import json
import os
from typing import Any, Optional


def write_bytes(path: str, data: bytes, like: Optional[os.stat_result] = None) -> None:
    """Write `data` to `path` atomically. The new file takes the mode and owner of `like`
    (the file it replaces) when given, else 0644 less the umask: never writable by group
    or others, so a record we write passes our own trust check (``trust.py``)."""
    d = os.path.dirname(os.path.abspath(path))
    # O_EXCL on a random name: no two writers share a temp file (and never a symlink
    # someone put there); the umask still applies (no process-wide umask juggling,
    # which races threads).
    tmp = os.path.join(d, ".%s.%s.tmp" % (os.path.basename(path), binascii.hexlify(os.urandom(4)).decode()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if like is not None:
                os.fchmod(f.fileno(), like.st_mode & 0o7777)
                try:
                    os.fchown(f.fileno(), like.st_uid, like.st_gid)
                except OSError:
                    pass  # not root: the file becomes ours, the mode is still kept
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_json(path: str, obj: Any, indent: Optional[int] = 1) -> None:
    """Write `obj` as JSON (sorted keys, a final newline) atomically."""
    text = json.dumps(obj, indent=indent, sort_keys=True) + "\n"
    write_bytes(path, text.encode("utf-8"))
