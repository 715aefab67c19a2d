"""The agent's output line, its request arguments, its ops' declarations (`@op`: each
op's handler and flags, once) and small shared helpers. Stdlib only.

Every stdout line of the agent goes through `emit()`, which holds one lock, so
worker threads never interleave half lines.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
from typing import Any, Callable, Dict, List, NamedTuple, Optional, TypeVar

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


# -- the ops: each declared once, by `@op` on its handler

_F = TypeVar("_F", bound=Callable[..., Any])


class Op(NamedTuple):
    """One op of the protocol, declared once by `@op` on its handler `op_NAME`
    (a method of `Agent`, or a function of a role module such as fileops.py):
    the loop, the hello and the outcome store read everything they need of it here."""

    handler: Callable[..., Any]  # (agent, args, rid) -> result, or (result, call after the reply)
    capability: str  # the hello's word for it: said only when every op of that word can run
    long: bool  # runs in a worker thread
    action: bool  # may carry an `action` id: its outcome is kept (remote/agent/outcomes.py)
    finish: bool  # changes the host: the agent outlives its client until it ends
    runner: bool  # needs the run modules: refused (and its capability unsaid) without them


OPS: Dict[str, Op] = {}  # every op by name, in the order declared


def op(capability: str, long: bool = False, action: bool = False, finish: bool = False,
       runner: bool = False) -> Callable[[_F], _F]:
    """Declare `op_NAME` as the handler of op NAME, with its flags (see `Op`)."""
    def declare(fn: _F) -> _F:
        OPS[fn.__name__[len("op_"):]] = Op(fn, capability, long, action, finish, runner)
        return fn
    return declare


def capabilities(has_runner: bool) -> List[str]:
    """The hello's capabilities: each op's word, in the order declared, when all its ops can run."""
    words = dict.fromkeys(o.capability for o in OPS.values())
    return [w for w in words if has_runner or not any(o.runner for o in OPS.values() if o.capability == w)]
