"""Patch actions on a host: status, push, rollback, capture -- through the agent.

Each function takes an agent client (`tui.transport.AgentApi`, which raises on
ok:false) and uses only its ops `resolve_module`, `file_read`, `patch_apply` and
`py_compile` (docs/architecture.md, "Agent protocol"). Everything
else -- building a version, classifying the host's state -- is the pure engine in
tui/state/patches.py, run here on the client.

Safety rules:
- the target package is found with the host's Python without importing it;
- a version is built from the *pristine* bytes (the host's one-time backup
  `<file>.eagle3-pristine`, the current file when it is pristine, or the current file
  with its known version's diff reversed), checked against the manifest's sha256;
- an unknown state (hand edits) is never overwritten without `force`; the refusal
  carries the diff of the host file against pristine;
- every file is compiled with the host's Python before anything is written; the writes
  are one agent request (`patch_apply`), one transaction on the host (remote/agent/journal.py):
  every hash is checked first, a journal is written, then the files (each atomic), then
  the journal is removed; a failure, or an agent killed mid-way, is rolled back on the
  host itself (by the next agent in the latter case), never over the link;
- `would_refuse` runs every check without writing: the UI shows why before asking;
- the backup is made only from a pristine file, and only once.
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tui.protocol.hosttext import clean, clean_tree
from tui.protocol.ops import PatchFile
from tui.services.files import atomic_write
from tui.state import patches as P
from tui.transport import AgentApi, AgentRequestError

BACKUP_SUFFIX = ".eagle3-pristine"


class PatchServiceError(Exception):
    """A refused or failed patch action. `str()` is one line; `detail` may hold a diff.
    Both carry the host's paths and file contents: sanitized here, where they become
    words to show (`tui.protocol.hosttext.clean`)."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(clean(message, newline=False))
        self.detail = clean(detail)


@dataclass
class _HostFile:
    rel: str
    path: str
    data: bytes | None  # None: missing
    sha: str | None
    backup: bytes | None  # the backup's bytes when it is the pristine file


@dataclass
class _Host:
    pset: P.PatchSet
    package_dir: str
    dist_version: str | None
    files: list[_HostFile]

    @property
    def current(self) -> dict[str, str | None]:
        return {f.rel: f.sha for f in self.files}


async def _read(client: AgentApi, path: str) -> tuple[bytes | None, str | None]:
    r = await client.file_read(path)
    return r.data, r.sha256


async def _inspect(client: AgentApi, pset: P.PatchSet, python: str | None) -> _Host:
    """Find the package on the host (without importing it) and read its target files."""
    r = await client.resolve_module(pset.package, python)
    origin = r.origin
    if not origin:
        raise PatchServiceError(f"package {pset.package!r} not found by {python} on the host")
    pkg_dir = posixpath.dirname(origin)
    files = []
    for rel in pset.files:
        path = posixpath.join(pkg_dir, rel)
        data, sha = await _read(client, path)
        backup, bsha = await _read(client, path + BACKUP_SUFFIX)
        files.append(_HostFile(rel, path, data, sha, backup if bsha == pset.files[rel] else None))
    return _Host(pset, pkg_dir, r.version, files)


def _pristine(host: _Host, state: str) -> dict[str, bytes] | None:
    """Pristine bytes of every file, or None when they cannot be had."""
    out: dict[str, bytes] = {}
    for f in host.files:
        if f.backup is not None:
            out[f.rel] = f.backup
        elif f.data is not None and f.sha == host.pset.files[f.rel]:
            out[f.rel] = f.data
        elif f.data is not None and state not in (P.UNKNOWN, P.MISSING, P.PRISTINE):
            undone = P.apply_diff(f.data, P.reverse_diff(P.get_version(host.pset, state).diff),
                                  f.rel)
            if P.sha256(undone) != host.pset.files[f.rel]:
                return None
            out[f.rel] = undone
        else:
            return None
    return out


def _classify(host: _Host) -> str:
    try:
        return P.classify(host.pset, host.current)
    except P.PatchError:  # a user version without sha256: build from the backup
        return P.classify(host.pset, host.current, _pristine(host, P.UNKNOWN))


def _report(host: _Host, state: str) -> dict[str, Any]:
    pset = host.pset
    files = {f.rel: {"abs_path": f.path, "sha256": f.sha, "backup": f.backup is not None,
                     "state": _file_state(pset, f)} for f in host.files}
    out: dict[str, Any] = {"set": pset.name, "target": f"{pset.distribution} {pset.version}",
                           "package_dir": host.package_dir,
                           "distribution_version": host.dist_version,
                           "files": files, "state": state}
    if state not in (P.PRISTINE, P.UNKNOWN, P.MISSING):
        out["version"] = state
    return out


def _file_state(pset: P.PatchSet, f: _HostFile) -> str:
    """Every state this file's bytes belong to, comma-separated (e.g. "v3,v4,v5")."""
    try:
        return ",".join(P.file_states(pset, f.rel, f.sha))
    except P.PatchError:
        return P.UNKNOWN


def _hand_edit_diff(host: _Host, pristine: dict[str, bytes] | None) -> str:
    if pristine is None:
        return ""
    return "".join(P.make_version_diff(pristine[f.rel], f.data or b"", f.rel)
                   for f in host.files if f.data is not None and f.data != pristine[f.rel])


async def status(client: AgentApi, set_name: str, python: str | None,
                 user_dir: Path | None = None) -> dict[str, Any]:
    """Where the host's files stand: {set, target, package_dir, distribution_version,
    files: {path: {abs_path, sha256, backup, state}}, state, version (when a vK)}."""
    host = await _inspect(client, P.load_set(set_name, user_dir), python)
    # a report to show: the host's paths cleaned (clean_tree keeps its shape)
    report: dict[str, Any] = clean_tree(_report(host, _classify(host)))
    return report


async def push(client: AgentApi, set_name: str, version: str, python: str | None,
               force: bool = False, user_dir: Path | None = None) -> dict[str, Any]:
    """Make the host's files exactly `version` (`latest` allowed). Returns a report."""
    pset = P.load_set(set_name, user_dir)
    target = P.get_version(pset, version).name
    return await _transition(client, pset, target, python, force)


async def rollback(client: AgentApi, set_name: str, python: str | None, to: str = P.PRISTINE,
                   force: bool = False, user_dir: Path | None = None) -> dict[str, Any]:
    """Put the host's files back to `to`: `pristine` (default) or an earlier version."""
    pset = P.load_set(set_name, user_dir)
    target = to if to == P.PRISTINE else P.get_version(pset, to).name
    return await _transition(client, pset, target, python, force)


async def would_refuse(client: AgentApi, set_name: str, target: str, python: str | None,
                       force: bool = False, user_dir: Path | None = None) -> PatchServiceError | None:
    """Why a move to `target` (a version, `latest` or `pristine`) would be refused now --
    its `.detail` holds the hand-edit diff -- or None when it would go ahead. Runs every
    check `push`/`rollback` runs (compile included) and never writes to the host."""
    pset = P.load_set(set_name, user_dir)
    goal = target if target == P.PRISTINE else P.get_version(pset, target).name
    try:
        await _plan(client, pset, goal, python, force)
    except PatchServiceError as exc:
        return exc
    return None


@dataclass
class _Plan:
    host: _Host
    state: str
    wanted: dict[str, bytes]
    todo: list[_HostFile]  # the files to rewrite, in manifest order


async def _plan(client: AgentApi, pset: P.PatchSet, target: str, python: str | None,
                force: bool) -> _Plan:
    """Read the host and check that a move to `target` may go ahead; writes nothing."""
    host = await _inspect(client, pset, python)
    state = _classify(host)
    missing = [f.path for f in host.files if f.data is None]
    if missing:
        raise PatchServiceError(f"missing on the host: {', '.join(missing)}")
    pristine = _pristine(host, state)
    if state == P.UNKNOWN and not force:
        raise PatchServiceError(
            f"{pset.package} in {host.package_dir} has been edited by hand (not pristine "
            f"{pset.distribution} {pset.version} nor a version of {pset.name}; host has "
            f"{pset.distribution} {host.dist_version}); refusing without --force",
            detail=_hand_edit_diff(host, pristine))
    if pristine is None:
        raise PatchServiceError(
            f"no pristine copy of {pset.package} on the host (no valid {BACKUP_SUFFIX} backup "
            f"and the files are not a known version); reinstall {pset.distribution}=="
            f"{pset.version} first")
    try:
        wanted = P.build_version(pset, target, pristine)
    except P.PatchError as exc:
        raise PatchServiceError(str(exc)) from None
    todo = [f for f in host.files if f.data != wanted[f.rel]]
    for f in todo:
        r = await client.py_compile(wanted[f.rel], f.path, python)
        if not r.ok:
            raise PatchServiceError(f"{target} does not compile on the host: {r.error}")
    return _Plan(host, state, wanted, todo)


async def _transition(client: AgentApi, pset: P.PatchSet, target: str, python: str | None,
                      force: bool) -> dict[str, Any]:
    plan = await _plan(client, pset, target, python, force)
    wanted = plan.wanted
    files = [PatchFile(f.path, wanted[f.rel], f.sha,
                       f.path + BACKUP_SUFFIX if f.sha == pset.files[f.rel] else None)
             for f in plan.todo]
    if files:
        # One request, one transaction on the host (remote/agent/journal.py): every file is
        # written or none is, whatever happens to the agent or the link. A cancellation
        # (a dismissed screen, Ctrl-C) waits for the reply, so the outcome is known.
        try:
            await _to_the_end(client.patch_apply(files, target))
        except AgentRequestError as exc:  # the host refused or rolled back: it says what
            raise PatchServiceError(str(exc).removeprefix("patch_apply: ")) from None
        except Exception as exc:  # noqa: BLE001 - the link: no answer, so say what is sure
            raise PatchServiceError(
                f"push to {target}: no answer from the host ({exc}); the host is as it was or "
                f"wholly at {target}, never half-patched (a push its agent did not finish is "
                f"rolled back by the next agent); see `eagle3-tui patch status`") from None
    after = await _inspect(client, pset, python)
    bad = [f.path for f in after.files if f.data != wanted[f.rel]]
    if bad:
        raise PatchServiceError(f"verification failed after writing: {', '.join(bad)} "
                                f"do not have the expected sha256")
    report = _report(after, _classify(after))
    report.update(previous_state=plan.state, written=[f.rel for f in plan.todo],
                  forced=plan.state == P.UNKNOWN)
    return report


async def _to_the_end(coro: Coroutine[Any, Any, Any]) -> Any:
    """Await `coro` shielded from cancellation of the calling task; a cancellation that
    arrives meanwhile is re-raised once `coro` has finished."""
    task = asyncio.ensure_future(coro)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # the request itself was cancelled (the loop is closing)
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task.result()


async def capture(client: AgentApi, set_name: str, python: str | None, new_version: str,
                  title: str, notes: str = "", fixes: tuple[str, ...] = (),
                  user_dir: Path | None = None) -> dict[str, Any]:
    """Record the host's hand-edited files as a new version in the user's copy of the set."""
    pset = P.load_set(set_name, user_dir)
    host = await _inspect(client, pset, python)
    state = _classify(host)
    if state != P.UNKNOWN:
        raise PatchServiceError(f"nothing to capture: the host files are {state}")
    pristine = _pristine(host, state)
    if pristine is None:
        raise PatchServiceError(f"cannot capture: no pristine {BACKUP_SUFFIX} backup on the host")
    current = {f.rel: f.data or b"" for f in host.files}
    diff = "".join(P.make_version_diff(pristine[r], current[r], r) for r in pset.files)
    version = P.PatchVersion(name=new_version, title=title, diff=diff,
                             diff_file=f"{new_version}.diff", fixes=tuple(fixes), notes=notes,
                             sha256={r: P.sha256(b) for r, b in current.items()})
    try:
        new_set = P.with_version(pset, version)
    except P.PatchError as exc:
        raise PatchServiceError(str(exc)) from None
    dest = (P.user_sets_dir() if user_dir is None else user_dir) / pset.name
    if not pset.user:  # first capture: start the user's copy from the bundled set
        dest.mkdir(parents=True, exist_ok=True)
        for v in pset.versions:
            _write_local(dest / v.diff_file, v.diff)
    _write_local(dest / version.diff_file, diff)
    _write_local(dest / "manifest.toml", P.render_manifest(new_set))
    again = P.load_set_dir(dest, user=True)
    if P.build_version(again, new_version, pristine) != current:
        raise PatchServiceError(f"captured {new_version} does not rebuild the host files")
    return {"set": pset.name, "version": new_version, "dir": str(dest),
            "diff_file": str(dest / version.diff_file), "files": sorted(pset.files)}


def _write_local(path: Path, text: str) -> None:
    """Atomic write of a local text file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text.encode("utf-8"))


__all__ = ["BACKUP_SUFFIX", "PatchServiceError", "capture", "push", "rollback", "status",
           "would_refuse"]
