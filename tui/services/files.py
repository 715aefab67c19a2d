"""Atomic file writes on the client: the one helper every client module uses.

Readers see the old file or the whole new one: the data goes to a hidden temp file
beside the target (a random name, created with O_EXCL so the umask sets its mode as
with open()), is fsynced, then renamed over the target with os.replace.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically; the parent directory must exist."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
