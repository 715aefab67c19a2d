"""A patch push as one transaction on the host (the agent op ``patch_apply``): every
file of it is written, or none is, whatever happens to the agent or the link.

Steps, under an exclusive ``flock`` on ``JOURNAL_DIR/.lock`` (one push at a time per
user; the lock dies with its holder):

1. every file's current sha256 is checked against the one the client read; a mismatch
   refuses the whole push before anything is written;
2. the original bytes of each file are saved (``orig-<i>``, atomically), then
   ``journal.json`` names the files (and the pristine backups this push creates), their
   original and new hashes, and the target version; from here the push is "begun";
3. each file's pristine backup (once) and the file itself are written atomically;
4. the hashes are verified, then the journal is removed (the commit), then the reply.

A push that fails in step 3 or 4 is rolled back from the journal before the error is
returned. An agent that starts and finds ``journal.json`` (its writer died: SIGKILL,
OOM, a reboot) rolls it back before anything else and reports it (``recover``). Back,
not forward: the original bytes are on disk before the first write, and the client
learns of a push only from its reply, so an unfinished push is one that did not happen
(a reply lost after the commit still leaves the pushed version: both are whole states).
A rollback undoes only the push's own writes: a file is put back only while its bytes
are what the push wrote (a file the push created is removed only then); a file that is
neither its old bytes nor the push's was changed by someone else after the push began
(the agent can lie dead for days): it is left as it is and named in the report.

The journal dir is ``~/.cache/eagle3-tui/patch-journal`` (``EAGLE3_TUI_JOURNAL_DIR``
overrides it); it and its files must be ours alone (``trust.py``): a planted journal
would have us "restore" any file to bytes of someone else's choosing.
``EAGLE3_TUI_TEST_KILL_AT=N`` (tests only) makes the agent SIGKILL itself at step N of
a push, so a test can interrupt it at every step. Stdlib only; Python 3.9+.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import glob
import hashlib
import json
import os
import signal
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

from remote.base import atomicfile, trust
from remote.base.wire import BadRequest, arg, user_path, user_path_or_none

JOURNAL_ENV = "EAGLE3_TUI_JOURNAL_DIR"
KILL_AT_ENV = "EAGLE3_TUI_TEST_KILL_AT"  # tests only: SIGKILL ourselves at this step
LOCK_WAIT = 30.0  # seconds a push or a recovery waits for another agent's push


def journal_dir() -> str:
    return os.environ.get(JOURNAL_ENV) or os.path.expanduser("~/.cache/eagle3-tui/patch-journal")


def _sha(data: Optional[bytes]) -> Optional[str]:
    return hashlib.sha256(data).hexdigest() if data is not None else None


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


class _Steps:
    """Counts the steps of a push; the test hook kills the agent at step N."""

    def __init__(self) -> None:
        self.n = 0
        self.kill_at = os.environ.get(KILL_AT_ENV)

    def __call__(self, what: str) -> None:
        self.n += 1
        if self.kill_at == str(self.n):
            os.write(2, ("killed at step %d: %s\n" % (self.n, what)).encode())
            os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def _locked(d: str) -> Iterator[None]:
    fd = trust.open_file(os.path.join(d, ".lock"), os.O_RDWR | os.O_CREAT, "patch journal lock")
    try:
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise BadRequest("another patch push is in progress on this host") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def _open_dir() -> str:
    d = journal_dir()
    try:
        trust.make_dir(d, "patch journal dir")
    except trust.Untrusted as e:
        raise BadRequest(str(e)) from None
    return d


def _clear(d: str) -> None:
    """The commit (or the end of a rollback): the journal first, then the saved copies."""
    path = os.path.join(d, "journal.json")
    if os.path.lexists(path):
        os.unlink(path)
    for old in glob.glob(os.path.join(d, "orig-*")):
        os.unlink(old)
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _roll_back(d: str, journal: Dict[str, Any]) -> Tuple[List[str], List[str]]:
    """Undo the writes of `journal`, and only those: a file whose bytes are what the push
    wrote goes back to its original bytes (a file the push created is removed); a file
    still as it was is left alone; a file that is neither was changed by someone else
    since (an edit while the agent lay dead) and is left as it is. The pristine backups
    the push made go too, unless someone changed a file: then they stay, so that the
    user can still get back to pristine. Returns (the paths put back, the paths someone
    else changed)."""
    restored: List[str] = []
    changed: List[str] = []
    backups = []
    for i, f in enumerate(journal["files"]):
        path = f["path"]
        # a write cut short between its temp file and the rename (atomicfile's names)
        for tmp in glob.glob(os.path.join(os.path.dirname(path), ".%s.%s.tmp" % (
                glob.escape(os.path.basename(path)), "[0-9a-f]" * 8))):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        now = _sha(_read(path))
        if now == f["orig_sha256"]:
            continue  # not written yet, or already put back
        if f.get("backup"):
            backups.append(f)
        elif now != f["new_sha256"]:
            changed.append(path)
        elif f["orig_sha256"] is None:
            os.unlink(path)  # the push created it, and it is still what the push wrote
            restored.append(path)
        else:
            orig = trust.read_bytes(os.path.join(d, "orig-%d" % i), "patch journal copy")
            if _sha(orig) != f["orig_sha256"]:
                raise BadRequest("patch journal copy of %s is damaged; left as it is" % path)
            atomicfile.write_bytes(path, orig, os.stat(path))
            restored.append(path)
    for f in backups if not changed else []:
        if _sha(_read(f["path"])) == f["new_sha256"]:
            os.unlink(f["path"])
    return restored, changed


def recover() -> Optional[Dict[str, Any]]:
    """Roll back a push whose agent died (its journal is still there). None when there
    was none; else {target, started, restored: [paths]} (or {error} when it could not)."""
    d = journal_dir()
    if not os.path.lexists(os.path.join(d, "journal.json")):
        return None
    try:
        d = _open_dir()
        with _locked(d):
            return _recover_locked(d)
    except (OSError, ValueError, BadRequest, trust.Untrusted) as e:
        return {"error": "cannot roll back the interrupted patch push in %s: %s" % (d, e)}


def describe(recovered: Dict[str, Any]) -> str:
    """What `recover` did, for the user: one line, then one line for each file someone
    else changed since the push began (left as it is)."""
    return "\n".join(_lines(recovered))


def _lines(recovered: Dict[str, Any]) -> List[str]:
    if recovered.get("error"):
        return [str(recovered["error"])]

    def one(path: str) -> str:  # a path is the user's text: one line whatever it holds
        return path.replace("\r", "\\r").replace("\n", "\\n")

    lines = ["an interrupted patch push to %s was rolled back: %s" % (
        recovered.get("target"), ", ".join(one(p) for p in recovered.get("restored") or [])
        or "nothing had changed yet")]
    lines += ["%s was changed by someone else after the interrupted push began; left as it is"
              % one(path) for path in recovered.get("changed") or []]
    return lines


def _recover_locked(d: str) -> Optional[Dict[str, Any]]:
    try:
        raw = trust.read_bytes(os.path.join(d, "journal.json"), "patch journal")
    except FileNotFoundError:
        return None  # the push we waited for finished
    journal = json.loads(raw.decode("utf-8"))
    restored, changed = _roll_back(d, journal)
    _clear(d)
    out = {"target": journal.get("target"), "started": journal.get("started"),
           "restored": restored, "changed": changed}
    out["lines"] = _lines(out)
    return out


def apply(files: List[Dict[str, Any]], target: str) -> Dict[str, Any]:
    """Write `files` ([{path, data, expect_sha256, backup}]) as one transaction."""
    step = _Steps()
    d = _open_dir()
    with _locked(d):
        recovered = _recover_locked(d)  # a push whose agent died comes first
        step("locked")
        originals = []
        for f in files:
            current = _read(f["path"])
            if _sha(current) != f["expect_sha256"]:
                raise BadRequest("%s changed: current sha256 %s, expected %s; nothing was written" % (
                    f["path"], (_sha(current) or "")[:12] or "none (missing)",
                    (f["expect_sha256"] or "")[:12] or "none (must not exist)"))
            originals.append(current)
        journal: Dict[str, Any] = {"target": target, "started": time.time(), "agent_pid": os.getpid(),
                                   "files": []}
        backups = []  # (the file's index, its backup's path): the pristine copies this push makes
        for i, (f, orig) in enumerate(zip(files, originals)):
            if orig is not None:
                atomicfile.write_bytes(os.path.join(d, "orig-%d" % i), orig)
            journal["files"].append({"path": f["path"], "orig_sha256": _sha(orig),
                                     "new_sha256": _sha(f["data"])})
            if f.get("backup") and orig is not None and not os.path.lexists(f["backup"]):
                backups.append((i, f["backup"]))
        # after the files, so that entry i's saved copy is orig-i
        journal["files"] += [{"path": b, "orig_sha256": None, "new_sha256": _sha(originals[i]),
                              "backup": True} for i, b in backups]
        step("originals saved")
        atomicfile.write_json(os.path.join(d, "journal.json"), journal)
        step("journal written")
        try:
            made = dict(backups)
            for i, (f, orig) in enumerate(zip(files, originals)):
                st = os.stat(f["path"]) if orig is not None else None
                if i in made and orig is not None:
                    atomicfile.write_bytes(made[i], orig, st)
                    step("backup of %s" % os.path.basename(f["path"]))
                atomicfile.write_bytes(f["path"], f["data"], st)
                step("wrote %s" % os.path.basename(f["path"]))
            bad = [f["path"] for f in files if _sha(_read(f["path"])) != _sha(f["data"])]
            if bad:
                raise BadRequest("verification failed after writing %s" % ", ".join(bad))
        except BaseException as e:
            restored, changed = _roll_back(d, journal)
            _clear(d)
            why = str(e) if isinstance(e, BadRequest) else "%s: %s" % (type(e).__name__, e)
            raise BadRequest("patch push to %s failed (%s); rolled back %s%s" % (
                target, why, ", ".join(restored) or "nothing (nothing had changed)",
                "".join("; %s changed by someone else meanwhile, left as it is" % p for p in changed))) from None
        _clear(d)
        step("committed")
    return {"files": [{"path": f["path"], "sha256": _sha(f["data"])} for f in files],
            "recovered": recovered}


def apply_request(args: Dict[str, Any]) -> Dict[str, Any]:
    """`patch_apply {files: [{path, b64, expect_sha256, backup}], target}`, checked."""
    files = []
    for f in arg(args, "files", list):
        if not isinstance(f, dict):
            raise BadRequest("patch_apply: files must be objects")
        try:
            data = base64.b64decode(arg(f, "b64", str), validate=True)
        except ValueError:
            raise BadRequest("patch_apply: b64 is not valid base64") from None
        files.append({"path": user_path(arg(f, "path", str)), "data": data,
                      "expect_sha256": arg(f, "expect_sha256", str, None),
                      "backup": user_path_or_none(arg(f, "backup", str, None))})
    return apply(files, arg(args, "target", str, "?"))
