"""Patch engine: versioned patch sets for an installed library, as pure functions.

A *patch set* is a directory `patches/<set>/` holding `manifest.toml` and one
cumulative unified diff per *version* (`v1.diff` … `vN.diff`), each against the
pristine files of one release of one distribution (e.g. speculators 0.3.0). A version
is therefore a *state* of the target files: pristine + diff_K. The applied state of a
host is recognised by hashing its files (`classify`).

Why our own diff applier instead of GNU `patch` or a library: a patch to an installed
library must apply exactly or not at all. `patch` applies hunks with fuzz and at
shifted offsets, so an edited or different file can be silently mis-patched; and the
client must not depend on the workstation having `patch`. `apply_diff` accepts a hunk
only when every context and removed line matches at the exact line the hunk names.

This module never imports textual or rich and does no I/O beyond reading patch-set
files (bundled with the package, or the user's copies).
"""

from __future__ import annotations

import difflib
import hashlib
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

PRISTINE = "pristine"
UNKNOWN = "unknown"
MISSING = "missing"
LATEST = "latest"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(Exception):
    """Anything wrong with a patch set or applying it; `str()` is one line."""


@dataclass(frozen=True)
class PatchVersion:
    """One version of a set: a cumulative diff against the pristine files."""

    name: str
    title: str
    diff: str  # the unified diff text
    diff_file: str  # its file name inside the set directory
    fixes: tuple[str, ...] = ()
    notes: str = ""
    sha256: Mapping[str, str] = field(default_factory=dict)  # expected result hashes


@dataclass(frozen=True)
class PatchSet:
    """A patch set: the target release, its pristine file hashes, and its versions."""

    name: str
    root: Path
    distribution: str
    version: str  # the target distribution's version
    package: str  # importable package whose directory the file paths are relative to
    files: Mapping[str, str]  # relative path -> sha256 of the pristine file, in order
    versions: tuple[PatchVersion, ...]
    user: bool = False  # loaded from the user's patch directory


def sha256(data: bytes) -> str:
    """Hex sha256 of bytes."""
    return hashlib.sha256(data).hexdigest()


def bundled_sets_dir() -> Path:
    """The patch sets shipped with eagle3-tui (a checkout's or an installed wheel's)."""
    import patches  # the data package next to `tui`; found the same way in both cases

    return Path(patches.__file__).resolve().parent


def user_sets_dir() -> Path:
    """Where the user's own sets and captured versions live."""
    from platformdirs import user_config_dir

    return Path(user_config_dir("eagle3-tui")) / "patches"


def _set_dirs(user_dir: Path | None) -> list[tuple[Path, bool]]:
    return [(user_sets_dir() if user_dir is None else user_dir, True), (bundled_sets_dir(), False)]


def list_sets(user_dir: Path | None = None) -> list[str]:
    """Names of all sets, user and bundled (a user copy shadows a bundled one)."""
    names: set[str] = set()
    for base, _ in _set_dirs(user_dir):
        if base.is_dir():
            names.update(p.name for p in base.iterdir() if (p / "manifest.toml").is_file())
    return sorted(names)


def load_set(name: str, user_dir: Path | None = None) -> PatchSet:
    """Load a set by name; the user's copy wins over the bundled one."""
    if not _NAME.match(name):
        raise PatchError(f"bad patch set name {name!r}")
    for base, is_user in _set_dirs(user_dir):
        if (base / name / "manifest.toml").is_file():
            return load_set_dir(base / name, user=is_user)
    raise PatchError(f"no patch set named {name!r} (have: {', '.join(list_sets(user_dir)) or 'none'})")


def _get(table: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(table, dict) or key not in table:
        raise PatchError(f"{where}: missing key {key!r}")
    value = table[key]
    if not isinstance(value, kind):
        raise PatchError(f"{where}: key {key!r} must be a {kind.__name__}")
    return value


def load_set_dir(root: Path, user: bool = False) -> PatchSet:
    """Parse `root/manifest.toml` and read every version's diff."""
    mf = root / "manifest.toml"
    try:
        data = tomllib.loads(mf.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PatchError(f"{mf}: {str(exc).splitlines()[0]}") from None
    target = _get(data, "target", dict, f"{mf}")
    files = _get(target, "files", dict, f"{mf} [target]")
    if not files or not all(isinstance(v, str) and len(v) == 64 for v in files.values()):
        raise PatchError(f"{mf} [target]: key 'files' must map paths to sha256 hex strings")
    versions: list[PatchVersion] = []
    for i, v in enumerate(data.get("versions", [])):
        where = f"{mf} [[versions]] #{i + 1}"
        vname = _get(v, "name", str, where)
        if not _NAME.match(vname) or vname in (PRISTINE, UNKNOWN, MISSING, LATEST):
            raise PatchError(f"{where}: key 'name' {vname!r} is not allowed")
        title = _get(v, "title", str, where)
        diff_file = _get(v, "diff", str, where)
        if not _NAME.match(diff_file):
            raise PatchError(f"{where}: key 'diff' must be a file name in the set directory")
        try:
            diff = (root / diff_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PatchError(f"{where}: key 'diff': cannot read {diff_file}: {exc}") from None
        versions.append(PatchVersion(
            name=vname, title=title, diff=diff, diff_file=diff_file,
            fixes=tuple(v.get("fixes", ())), notes=str(v.get("notes", "")),
            sha256=dict(v.get("sha256", {}))))
    if len({v.name for v in versions}) != len(versions):
        raise PatchError(f"{mf}: key 'versions': duplicate version names")
    return PatchSet(name=root.name, root=root, user=user,
                    distribution=_get(target, "distribution", str, f"{mf} [target]"),
                    version=_get(target, "version", str, f"{mf} [target]"),
                    package=_get(target, "package", str, f"{mf} [target]"),
                    files=dict(files), versions=tuple(versions))


def version_order(pset: PatchSet) -> list[str]:
    """Version names, oldest first (manifest order)."""
    return [v.name for v in pset.versions]


def latest(pset: PatchSet) -> PatchVersion:
    """The newest version (the complete fix)."""
    if not pset.versions:
        raise PatchError(f"patch set {pset.name!r} has no versions")
    return pset.versions[-1]


def get_version(pset: PatchSet, name: str) -> PatchVersion:
    """A version by name; `latest` means the newest one."""
    if name == LATEST:
        return latest(pset)
    for v in pset.versions:
        if v.name == name:
            return v
    raise PatchError(f"patch set {pset.name!r} has no version {name!r} "
                     f"(have: {', '.join(version_order(pset))})")


def _lines(text: str) -> list[str]:
    """Lines with their "\\n" kept, split on "\\n" only (str.splitlines would also split
    on \\r, \\f and others, which a source line may contain)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _file_sections(diff_text: str) -> dict[str, list[str]]:
    """Split a multi-file unified diff into {path: hunk lines} (paths without a/ b/)."""
    lines = _lines(diff_text)
    out: dict[str, list[str]] = {}
    cur: list[str] | None = None
    i = 0
    while i < len(lines):
        if lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            path = lines[i + 1][4:].rstrip("\n").split("\t")[0]
            path = path.removeprefix("b/")
            cur = out.setdefault(path, [])
            i += 2
            continue
        if cur is not None:
            cur.append(lines[i])
        i += 1
    return out


def apply_diff(original: bytes, diff_text: str, path: str) -> bytes:
    """Apply the part of `diff_text` for `path` to `original`, exactly or not at all."""
    hunks = _file_sections(diff_text).get(path)
    if hunks is None:
        return original
    src = _lines(original.decode("utf-8", "surrogateescape"))
    out: list[str] = []
    pos = 0  # next unconsumed line of src (0-based)
    i, n = 0, 0
    while i < len(hunks):
        m = _HUNK.match(hunks[i])
        if not m:
            raise PatchError(f"{path}: malformed diff line {hunks[i].rstrip()!r}")
        n += 1
        old_start, old_len = int(m[1]), int(m[2] if m[2] is not None else 1)
        new_len = int(m[4] if m[4] is not None else 1)
        start = old_start if old_len == 0 else old_start - 1
        old: list[str] = []
        new: list[str] = []
        prev = " "
        i += 1
        while i < len(hunks) and not hunks[i].startswith("@@"):
            line = hunks[i]
            if line.startswith("\\"):  # "\ No newline at end of file": strip the previous \n
                for side in ((old, new) if prev == " " else (old,) if prev == "-" else (new,)):
                    if side:
                        side[-1] = side[-1].removesuffix("\n")
            elif line[:1] in (" ", "-", "+") or line == "\n":
                prev = line[:1] if line != "\n" else " "
                body = line[1:] if line != "\n" else "\n"
                if prev in " -":
                    old.append(body)
                if prev in " +":
                    new.append(body)
            else:
                raise PatchError(f"{path}: hunk {n}: malformed line {line.rstrip()!r}")
            i += 1
        if len(old) != old_len or len(new) != new_len:
            raise PatchError(f"{path}: hunk {n}: line counts do not match its header")
        if start < pos or src[start:start + old_len] != old:
            raise PatchError(f"{path}: hunk {n} (at line {old_start}) does not match the file")
        out += src[pos:start] + new
        pos = start + old_len
    out += src[pos:]
    return "".join(out).encode("utf-8", "surrogateescape")


def reverse_diff(diff_text: str) -> str:
    """The diff that undoes `diff_text` (sides swapped), for hosts without a backup."""
    out = []
    for line in _lines(diff_text):
        m = _HUNK.match(line)
        if m:
            line = f"@@ -{m[3]},{m[4] or 1} +{m[1]},{m[2] or 1} @@\n"
        elif line.startswith(("--- ", "+++ ")):
            pass  # paths are the same on both sides
        elif line[:1] in "-+":
            line = {"-": "+", "+": "-"}[line[0]] + line[1:]
        out.append(line)
    return "".join(out)


def build_version(pset: PatchSet, version: str, pristine: Mapping[str, bytes]) -> dict[str, bytes]:
    """The target files of `version` (or `pristine`), built from the pristine bytes."""
    missing = [p for p in pset.files if p not in pristine]
    if missing:
        raise PatchError(f"no pristine bytes for {', '.join(missing)}")
    for p, want in pset.files.items():
        if sha256(pristine[p]) != want:
            raise PatchError(f"{p}: the given base is not the pristine file of "
                             f"{pset.distribution} {pset.version}")
    if version == PRISTINE:
        return {p: pristine[p] for p in pset.files}
    v = get_version(pset, version)
    unknown = set(_file_sections(v.diff)) - set(pset.files)
    if unknown:
        raise PatchError(f"{v.diff_file}: touches files outside the set: {', '.join(sorted(unknown))}")
    return {p: apply_diff(pristine[p], v.diff, p) for p in pset.files}


def version_hashes(pset: PatchSet, version: PatchVersion,
                   pristine: Mapping[str, bytes] | None = None) -> dict[str, str]:
    """Expected sha256 of each file in `version`: built when pristine bytes are given,
    else from the manifest (`sha256` table; files the diff does not touch stay pristine)."""
    if pristine is not None:
        return {p: sha256(b) for p, b in build_version(pset, version.name, pristine).items()}
    touched = set(_file_sections(version.diff))
    if not touched <= set(version.sha256):
        raise PatchError(f"version {version.name!r} has no sha256 table; pristine bytes needed")
    return {p: (version.sha256[p] if p in touched else pset.files[p]) for p in pset.files}


def classify(pset: PatchSet, current: Mapping[str, str | None],
             pristine: Mapping[str, bytes] | None = None) -> str:
    """State of the host files given their hashes (None = file absent): `pristine`,
    a version name (the newest one that matches every file), `unknown` or `missing`."""
    if any(current.get(p) is None for p in pset.files):
        return MISSING
    if all(current[p] == sha for p, sha in pset.files.items()):
        return PRISTINE
    for v in reversed(pset.versions):
        if version_hashes(pset, v, pristine) == {p: current[p] for p in pset.files}:
            return v.name
    return UNKNOWN


def file_states(pset: PatchSet, path: str, sha: str | None,
                pristine: Mapping[str, bytes] | None = None) -> list[str]:
    """Every state whose copy of `path` has this hash (several versions may share one)."""
    if sha is None:
        return [MISSING]
    found = [PRISTINE] if pset.files[path] == sha else []
    found += [v.name for v in pset.versions if version_hashes(pset, v, pristine)[path] == sha]
    return found or [UNKNOWN]


def make_version_diff(pristine: bytes, edited: bytes, path: str) -> str:
    """A unified diff `a/path` → `b/path` that `apply_diff` turns pristine into edited."""
    a = _lines(pristine.decode("utf-8", "surrogateescape"))
    b = _lines(edited.decode("utf-8", "surrogateescape"))
    out = []
    for line in difflib.unified_diff(a, b, f"a/{path}", f"b/{path}", n=3):
        if not line.endswith("\n"):  # difflib leaves a final line without \n unmarked
            line += "\n\\ No newline at end of file\n"
        out.append(line)
    return "".join(out)


def with_version(pset: PatchSet, version: PatchVersion) -> PatchSet:
    """The set with one more version appended (names must stay unique)."""
    if version.name in version_order(pset) or not _NAME.match(version.name):
        raise PatchError(f"version name {version.name!r} is taken or not allowed")
    return replace(pset, versions=pset.versions + (version,))


def _toml_str(s: str) -> str:
    # A TOML basic string; json's escapes (\" \\ \n \uXXXX) are valid TOML escapes.
    import json

    return json.dumps(s, ensure_ascii=False)


def render_manifest(pset: PatchSet) -> str:
    """The manifest.toml text of a set (used to write a user's copy)."""
    def table(d: Mapping[str, str]) -> str:
        return "{ " + ", ".join(f"{_toml_str(k)} = {_toml_str(v)}" for k, v in d.items()) + " }"

    out = ["[target]", f"distribution = {_toml_str(pset.distribution)}",
           f"version = {_toml_str(pset.version)}", f"package = {_toml_str(pset.package)}",
           f"files = {table(pset.files)}"]
    for v in pset.versions:
        out += ["", "[[versions]]", f"name = {_toml_str(v.name)}", f"title = {_toml_str(v.title)}",
                "fixes = [" + ", ".join(_toml_str(f) for f in v.fixes) + "]",
                f"notes = {_toml_str(v.notes)}", f"diff = {_toml_str(v.diff_file)}"]
        if v.sha256:
            out.append(f"sha256 = {table(v.sha256)}")
    return "\n".join(out) + "\n"
