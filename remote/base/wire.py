"""The agent's output line, its request arguments and small shared helpers. Stdlib only.

Every stdout line of the agent goes through `emit()`, which holds one lock, so
worker threads never interleave half lines.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
from typing import Any, Dict, Optional

# Characters of one log line that any host-side parser looks at (remote/run/pace.py, the
# restart matcher in remote/run/restartpolicy.py): the client's tui/state/logline.MAX_SCAN, so
# both sides read the same part of a line, and a 1 GB line costs what a normal one does.
MAX_SCAN = 8192

_OUT_LOCK = threading.Lock()
# Set once stdout is broken (the client or the SSH link is gone): later lines are
# dropped and the main loop winds down as on stdin EOF, letting kills finish first.
CLIENT_GONE = threading.Event()


class BadRequest(Exception):
    """A request the agent refuses; its message is the one-line error sent back."""


def emit(msg: Dict[str, Any]) -> None:
    """Write one JSON line to stdout under the lock; dropped once the client is gone."""
    data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
    with _OUT_LOCK:
        if CLIENT_GONE.is_set():
            return
        try:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except (BrokenPipeError, ValueError, OSError):
            CLIENT_GONE.set()


def one_line(exc: BaseException) -> str:
    """`Type: first line of the message`, for one-line errors."""
    text = str(exc).strip().splitlines()
    return "%s: %s" % (type(exc).__name__, text[0]) if text else type(exc).__name__


def b64(data: bytes) -> str:
    """Bytes as base64 text (log data and file contents travel this way)."""
    return base64.b64encode(data).decode("ascii")


def user_path(path: str) -> str:
    """`~` and `~user` expanded; a relative path stays relative to the agent's cwd."""
    return os.path.expanduser(path)


def user_path_or_none(path: Optional[str]) -> Optional[str]:
    return user_path(path) if path else path


def arg(args: Dict[str, Any], name: str, kind: Any, default: Any = KeyError) -> Any:
    """Fetch and type-check one request argument; a missing required one is a BadRequest."""
    if name not in args or args[name] is None:
        if default is KeyError:
            raise BadRequest("missing argument %r" % name)
        return default
    value = args[name]
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise BadRequest("argument %r has the wrong type" % name)
    return value
