"""A record's reserved space for a full disk: blanks written and fsynced while the disk
still has room, so that a run's end (``exit.reserve``, rundir.EXIT_RESERVE) or its
attempts (``attempts.reserve``, remote/run/attempts.py) can later be written over them in
place, with no new block needed. The launch makes them before anything starts (`make`:
OSError, no room, no run); the shim and the restart supervisor open the launch's (`open_or_make`), or
make their own where a run dir has none. Stdlib only, Python 3.9+."""

from __future__ import annotations

import contextlib
import os

from remote.base import trust


def make(run_dir: str, name: str, size: int) -> int:
    """RUN_DIR/`name`, `size` blanks (the last a newline), written and fsynced; an fd on
    it. OSError, and no file left, when the disk has no room for them."""
    path = os.path.join(run_dir, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        data = b" " * (size - 1) + b"\n"
        while data:  # a short write is the disk filling: the next one says ENOSPC
            data = data[os.write(fd, data):]
        os.fsync(fd)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return fd


def open_or_make(run_dir: str, name: str, size: int) -> int | None:
    """An fd on RUN_DIR/`name`: the one the launch made, else a new one (`make`); None
    when there is none to be had (not ours alone, not `size` bytes, no room)."""
    try:
        fd = trust.open_file(os.path.join(run_dir, name), os.O_RDWR, name)
    except FileNotFoundError:
        try:
            return make(run_dir, name, size)
        except OSError:
            return None
    except (OSError, trust.Untrusted):
        return None
    if os.fstat(fd).st_size == size:
        return fd
    os.close(fd)
    return None
