"""Failure signatures: data in ``tui/data/signatures.toml``, extendable by the user.

``load_signatures()`` reads the built-in file, then the user's
``~/.config/eagle3-tui/signatures.toml`` (``platformdirs.user_config_dir``), then any
``extra_paths``. A later entry with an existing ``id`` replaces the fields it sets; a
new ``id`` is tried before the built-in ones. A malformed file gives a
``SignatureError`` whose message is one line naming the file and the key.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = [
    "BUILTIN_PATH",
    "RESTART_CLASSES",
    "Signature",
    "SignatureError",
    "SignatureSet",
    "load_signatures",
    "user_signatures_path",
]

BUILTIN_PATH = Path(__file__).resolve().parent.parent / "data" / "signatures.toml"
_KEYS = {"id", "patterns", "title", "explanation", "fix", "wrapper", "generic", "after_load", "serving_fatal",
         "persist", "restart"}
# What a failure's root cause means for the host's restart policy (remote/restartpolicy.py):
# "transient" restarts, "deterministic" never does, "unclassified" only after progress.
RESTART_CLASSES = ("transient", "deterministic", "unclassified")


class SignatureError(ValueError):
    """A signatures file is malformed; the message is one line."""


@dataclass(frozen=True)
class Signature:
    """One recognisable failure."""

    id: str
    patterns: tuple[re.Pattern[str], ...]
    title: str
    explanation: str = ""
    fix: Any = field(default="", hash=False)  # str, or dict like {"patch": …, "version": …}
    wrapper: bool = False  # only repeats an error reported elsewhere
    generic: bool = False  # the catch-all, used when nothing specific matched
    after_load: bool | None = None  # None: can happen either way
    serving_fatal: bool = False  # the engine died: fatal even when a request handler reports it
    # a failure only when this many consecutive training-metric lines match (a NaN loss that
    # persists); one matching line alone (a recovered overflow) is not a failure
    persist: int = 1
    restart: str | None = None  # one of RESTART_CLASSES; None (a user's entry): "unclassified"

    def search(self, message: str) -> re.Match[str] | None:
        """The first pattern match in ``message``, or None."""
        for pat in self.patterns:
            m = pat.search(message)
            if m:
                return m
        return None

    def render_title(self, match: re.Match[str] | None) -> str:
        """The title with ``{name}`` replaced by the match's named groups."""
        if match is None or "{" not in self.title:
            return self.title
        groups = {k: v for k, v in match.groupdict().items() if v is not None}
        try:
            return self.title.format_map(_Keep(groups))
        except (ValueError, IndexError, AttributeError):
            return self.title


class _Keep(dict):  # type: ignore[type-arg]
    """format_map helper: unknown ``{name}`` fields stay as they are."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def user_signatures_path() -> Path:
    """Where the user's own signatures live."""
    import platformdirs

    return Path(platformdirs.user_config_dir("eagle3-tui")) / "signatures.toml"


def _parse_file(path: Path) -> list[dict[str, Any]]:
    """Read and validate one file; return its entries as checked dicts."""
    name = str(path)
    try:
        with path.open("rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise SignatureError(f"{name}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SignatureError(f"{name}: not valid TOML: {exc}") from None
    unknown = set(doc) - {"signature"}
    if unknown:
        raise SignatureError(f"{name}: key {min(unknown)!r}: unknown (expected [[signature]])")
    entries = doc.get("signature", [])
    if not isinstance(entries, list):
        raise SignatureError(f"{name}: key 'signature': must be an array of tables ([[signature]])")
    out = []
    for i, entry in enumerate(entries):
        out.append(_check_entry(name, i, entry))
    return out


def _check_entry(name: str, i: int, entry: Any) -> dict[str, Any]:
    """Validate one [[signature]] table; compile its patterns."""
    where = f"{name}: signature[{i}]"
    if not isinstance(entry, dict):
        raise SignatureError(f"{where}: must be a table")
    sid = entry.get("id")
    if not isinstance(sid, str) or not re.fullmatch(r"[a-z0-9][a-z0-9\-_.]*", sid):
        raise SignatureError(f"{where}: key 'id': must be a lowercase name like 'cuda-oom'")
    where = f"{name}: signature {sid!r}"
    for key in entry:
        if key not in _KEYS:
            raise SignatureError(f"{where}: key {key!r}: unknown")
    checked: dict[str, Any] = {"id": sid}
    if "patterns" in entry:
        pats = entry["patterns"]
        if not isinstance(pats, list) or not all(isinstance(p, str) for p in pats):
            raise SignatureError(f"{where}: key 'patterns': must be a list of strings")
        compiled = []
        for p in pats:
            try:
                compiled.append(re.compile(p))
            except re.error as exc:
                raise SignatureError(f"{where}: key 'patterns': bad regex {p!r}: {exc}") from None
        checked["patterns"] = tuple(compiled)
    for key in ("title", "explanation"):
        if key in entry:
            if not isinstance(entry[key], str):
                raise SignatureError(f"{where}: key {key!r}: must be a string")
            checked[key] = entry[key].strip()
    if "fix" in entry:
        fix = entry["fix"]
        ok = isinstance(fix, str) or (
            isinstance(fix, dict) and all(isinstance(v, str) for v in fix.values())
        )
        if not ok:
            raise SignatureError(f"{where}: key 'fix': must be a string or a table of strings")
        checked["fix"] = dict(fix) if isinstance(fix, dict) else fix
    if "persist" in entry:
        if not isinstance(entry["persist"], int) or isinstance(entry["persist"], bool) or entry["persist"] < 1:
            raise SignatureError(f"{where}: key 'persist': must be a whole number of lines, at least 1")
        checked["persist"] = entry["persist"]
    if "restart" in entry:
        if entry["restart"] not in RESTART_CLASSES:
            raise SignatureError(f"{where}: key 'restart': must be one of {', '.join(RESTART_CLASSES)}")
        checked["restart"] = entry["restart"]
    for key in ("wrapper", "generic", "after_load", "serving_fatal"):
        if key in entry:
            if not isinstance(entry[key], bool):
                raise SignatureError(f"{where}: key {key!r}: must be true or false")
            checked[key] = entry[key]
    return checked


def _merge(sigs: list[Signature], entries: list[dict[str, Any]], name: str) -> list[Signature]:
    """Apply one file's entries: override existing ids, put new ids first."""
    by_id = {s.id: i for i, s in enumerate(sigs)}
    new: list[Signature] = []
    for e in entries:
        if e["id"] in by_id:
            idx = by_id[e["id"]]
            fields = {k: v for k, v in e.items() if k != "id"}
            sigs[idx] = replace(sigs[idx], **fields)
            continue
        if "title" not in e:
            raise SignatureError(f"{name}: signature {e['id']!r}: key 'title': required")
        if not e.get("patterns") and not e.get("generic"):
            raise SignatureError(f"{name}: signature {e['id']!r}: key 'patterns': required")
        e.setdefault("patterns", ())
        new.append(Signature(**e))
    return new + sigs


def load_signatures(
    extra_paths: Iterable[str | Path] = (),
    *,
    user_file: str | Path | None = "",
    errors: list[str] | None = None,
) -> list[Signature]:
    """Load the built-in signatures, then the user file, then ``extra_paths``.

    ``user_file=""`` means the default location; ``None`` skips it. A missing user
    file is fine. A malformed user or extra file raises ``SignatureError``, or, when
    ``errors`` is a list, is skipped with its one-line message appended there.
    """
    sigs = _merge([], _parse_file(BUILTIN_PATH), str(BUILTIN_PATH))
    paths: list[Path] = []
    if user_file is not None:
        up = user_signatures_path() if user_file == "" else Path(user_file)
        if up.is_file():
            paths.append(up)
    paths.extend(Path(p) for p in extra_paths)
    for path in paths:
        try:
            sigs = _merge(list(sigs), _parse_file(path), str(path))
        except SignatureError as exc:
            if errors is None:
                raise
            errors.append(str(exc))
    return sigs


@dataclass(frozen=True)
class SignatureSet:
    """Signatures ordered for matching: specific ones, then wrappers; plus the catch-all."""

    specific: tuple[Signature, ...]
    wrappers: tuple[Signature, ...]
    generic: Signature | None
    _prefilter: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def build(cls, sigs: Sequence[Signature]) -> SignatureSet:
        """Order ``sigs`` and compile one combined regex used as a cheap first test."""
        specific = tuple(s for s in sigs if not s.wrapper and not s.generic)
        wrappers = tuple(s for s in sigs if s.wrapper and not s.generic)
        generic = next((s for s in sigs if s.generic), None)
        pats = [p.pattern for s in specific + wrappers for p in s.patterns]
        prefilter = None
        # Group references would shift inside the combined regex: then test one by one.
        if pats and not any(re.search(r"\\\d|\(\?P=", p) for p in pats):
            try:
                combined = "|".join(_scoped(_ungroup(p)) for p in pats)
                prefilter = re.compile(combined)
            except re.error:
                prefilter = None
        return cls(specific, wrappers, generic, prefilter)

    def match(self, message: str, persist: bool = False) -> tuple[Signature, re.Match[str]] | None:
        """The first signature matching ``message`` (specific before wrappers). Signatures
        that need several consecutive lines (``persist`` > 1) match only when ``persist``."""
        if self._prefilter is not None and not self._prefilter.search(message):
            return None
        for sig in self.specific + self.wrappers:
            if (sig.persist > 1) != persist:
                continue
            m = sig.search(message)
            if m:
                return sig, m
        return None


_GLOBAL_FLAGS = re.compile(r"\(\?([aiLmsux]+)\)")


def _scoped(pattern: str) -> str:
    """``pattern`` as one alternative of the combined regex: its leading global flags
    ("(?i)…", which Python allows only at the very start of a whole expression) become a
    group's own flags ("(?i:…)"), so they still apply to it and to nothing else."""
    flags = ""
    while m := _GLOBAL_FLAGS.match(pattern):
        flags += m.group(1)
        pattern = pattern[m.end():]
    if not flags:
        return f"(?:{pattern})"
    # a verbose pattern's trailing comment would swallow the group's ")": end it first
    return f"(?{flags}:{pattern}\n)" if "x" in flags else f"(?{flags}:{pattern})"


def _ungroup(pattern: str) -> str:
    """Turn named groups into plain groups so several patterns can share one regex."""
    return re.sub(r"\(\?P<\w+>", "(", pattern)
