"""Action outcomes on disk: ``RUNS_DIR/.actions/<id>.json``, kept ``ACTION_KEEP`` seconds.

An op declared ``action`` (``@op``, remote/base/wire.py) sent with an ``action`` id has its
outcome written here before the agent replies. On disk, not in memory, because the agent that finishes a kill whose
link dropped exits; the client's next agent (after the reconnect) reads the outcome
from here (``outcomes``). Stdlib only, Python >= 3.9.
"""

import json
import os
import time
from typing import Any, Dict, List

from remote.base import atomicfile, trust
from remote.base.wire import BadRequest, emit, one_line

ACTION_KEEP = 3600.0  # seconds an action's outcome stays in RUNS_DIR/.actions/
ACTION_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


def valid_id(action: Any) -> bool:
    return isinstance(action, str) and bool(action) and set(action) <= ACTION_ID_CHARS


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def record_outcome(folder: str, action: str, record: Dict[str, Any]) -> None:
    """Write ``record`` for ``action`` atomically (a "done" record keeps the op, run id
    and start of the "running" one), and drop records older than ``ACTION_KEEP``."""
    path = os.path.join(folder, action + ".json")
    record = dict(record, action=action, at=time.time())
    if record.get("state") == "done":
        try:
            begun = json.loads(trust.read_bytes(path, "action record").decode("utf-8"))
            record.setdefault("op", begun.get("op"))
            record.setdefault("run_id", begun.get("run_id"))
            record.setdefault("started", begun.get("started"))
        except (OSError, ValueError, AttributeError):
            pass
    try:
        trust.make_dir(folder, "actions dir")  # 0700 at every level it makes, whatever the umask
        atomicfile.write_json(path, record, indent=None)
        cutoff = time.time() - ACTION_KEEP
        for name in os.listdir(folder):
            old = os.path.join(folder, name)
            if os.stat(old).st_mtime < cutoff:
                os.unlink(old)
    except (OSError, trust.Untrusted) as exc:
        emit({"type": "error", "message": "cannot record action %s: %s" % (action, one_line(exc))})


def read_outcomes(folder: str, ids: List[Any]) -> Dict[str, Any]:
    """Outcomes of actions by id: the record (state running | done), or None when this
    host never received that action (or its record expired)."""
    out: Dict[str, Any] = {}
    for action in ids:
        if not valid_id(action):
            raise BadRequest("ids must be action ids")
        try:
            rec = json.loads(trust.read_bytes(os.path.join(folder, action + ".json"),
                                              "action record").decode("utf-8"))
        except (OSError, ValueError, trust.Untrusted):
            rec = None
        if isinstance(rec, dict) and rec.get("state") == "running" and not _pid_alive(rec.get("agent_pid")):
            rec = dict(rec, state="done", ok=False, error="the agent that ran it ended before it finished")
        out[action] = rec
    return {"outcomes": out}
