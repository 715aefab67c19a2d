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

from tui.state.loganalysis.lineshapes import MAX_SCAN

if sys.version_info >= (3, 11):
    from re import _constants as _sre_constants  # re's own parser: what a pattern requires
    from re import _parser as _sre_parser

    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import sre_constants as _sre_constants
    import sre_parse as _sre_parser

    import tomli as tomllib

__all__ = [
    "BUILTIN_PATH",
    "RESTART_CLASSES",
    "Prefilter",
    "Signature",
    "SignatureError",
    "SignatureSet",
    "load_signatures",
    "required_words",
    "user_signatures_path",
]

BUILTIN_PATH = Path(__file__).resolve().parents[2] / "data" / "signatures.toml"
_KEYS = {"id", "patterns", "title", "explanation", "fix", "wrapper", "generic", "after_load", "serving_fatal",
         "persist", "restart"}
# What a failure's root cause means for the host's restart policy (remote/run/restartpolicy.py):
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
class Prefilter:
    """Words one of which every match of some signature contains: for each pattern the
    longest literal any match of it must contain (``required_words``), lower-cased for a
    pattern that ignores case. A line with none of them matches no signature, and is
    turned away with a few substring tests instead of every pattern's search.

    (One regex made of all the patterns, tried first, was the earlier cheap test: on the
    real logs it cost as much as the patterns one by one, since ``re`` tries each
    alternative at each position without the literal scan a single pattern gets.)"""

    exact: tuple[str, ...]
    folded: tuple[str, ...]  # ASCII, lower-cased: compared with an ASCII line lower-cased

    def admits(self, message: str) -> bool:
        for word in self.exact:
            if word in message:
                return True
        if not self.folded:
            return False
        if not message.isascii():  # re's case folding pairs some non-ASCII letters with ASCII ones
            return True
        low = message.lower()
        return any(word in low for word in self.folded)

    @classmethod
    def of(cls, patterns: Iterable[re.Pattern[str]]) -> Prefilter | None:
        """The prefilter for ``patterns``; None when one of them requires no word (then
        every line must be tried)."""
        exact: set[str] = set()
        folded: set[str] = set()
        for pat in patterns:
            words, icase = required_words(pat)
            if not words:
                return None
            if icase:
                if not all(w.isascii() for w in words):
                    return None
                folded.update(w.lower() for w in words)
            else:
                exact.update(words)
        return cls(_shortest(exact), _shortest(folded))


def _shortest(words: set[str]) -> tuple[str, ...]:
    """``words`` without those that contain another one (that one is found anyway)."""
    return tuple(sorted(w for w in words if not any(o != w and o in w for o in words)))


def required_words(pattern: re.Pattern[str]) -> tuple[tuple[str, ...], bool]:
    """(literals one of which every match of ``pattern`` contains, the longest such choice
    found, or () when none is; whether some part of it ignores case). Read from ``re``'s
    own parse of the pattern."""
    try:
        icase = [bool(pattern.flags & re.IGNORECASE)]
        parsed = _sre_parser.parse(pattern.pattern, pattern.flags)
        return tuple(_required(list(parsed.data), icase)), icase[0]
    except Exception:  # an internal of re that changed shape: no prefilter, never a wrong one
        return (), True


def _required(items: list[Any], icase: list[bool]) -> list[str]:
    c = _sre_constants
    choices: list[list[str]] = []
    run: list[str] = []
    for op, av in items:
        if op is c.LITERAL:
            run.append(chr(av))
            continue
        if op in (c.AT, c.ASSERT, c.ASSERT_NOT):  # zero-width: the literal run goes on
            continue
        if run:
            choices.append(["".join(run)])
            run = []
        if op is c.SUBPATTERN:
            icase[0] = icase[0] or bool(av[1] & c.SRE_FLAG_IGNORECASE)  # a scoped (?i:...)
            choices.append(_required(list(av[-1]), icase))
        elif op is getattr(c, "ATOMIC_GROUP", None):
            choices.append(_required(list(av), icase))
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)) and av[0] >= 1:
            choices.append(_required(list(av[2]), icase))
        elif op is c.BRANCH:
            alts = [_required(list(a), icase) for a in av[1]]
            if all(alts):
                choices.append([w for a in alts for w in a])
    if run:
        choices.append(["".join(run)])
    choices = [ch for ch in choices if ch and all(ch)]
    return max(choices, key=lambda ch: min(map(len, ch)), default=[])


@dataclass(frozen=True)
class SignatureSet:
    """Signatures ordered for matching: specific ones, then wrappers; plus the catch-all."""

    specific: tuple[Signature, ...]
    wrappers: tuple[Signature, ...]
    generic: Signature | None
    # the cheap first test of `match`, for one-line signatures and for persisting ones
    _prefilter: Prefilter | None = field(default=None, compare=False, repr=False)
    _prefilter_persist: Prefilter | None = field(default=None, compare=False, repr=False)

    @classmethod
    def build(cls, sigs: Sequence[Signature]) -> SignatureSet:
        """Order ``sigs`` and build the prefilters ``match`` tries first."""
        specific = tuple(s for s in sigs if not s.wrapper and not s.generic)
        wrappers = tuple(s for s in sigs if s.wrapper and not s.generic)
        generic = next((s for s in sigs if s.generic), None)
        ordered = specific + wrappers
        one = Prefilter.of(p for s in ordered if s.persist == 1 for p in s.patterns)
        many = Prefilter.of(p for s in ordered if s.persist > 1 for p in s.patterns)
        return cls(specific, wrappers, generic, one, many)

    def by_id(self, sid: str) -> Signature | None:
        """The signature of that id (the generic one included), or None."""
        return next((s for s in (*self.specific, *self.wrappers, *([self.generic] if self.generic else []))
                     if s.id == sid), None)

    def match(self, message: str, persist: bool = False) -> tuple[Signature, re.Match[str]] | None:
        """The first signature matching ``message`` (specific before wrappers). Signatures
        that need several consecutive lines (``persist`` > 1) match only when ``persist``."""
        message = message[:MAX_SCAN]  # as every parser of a line: its head only, linear in that
        pre = self._prefilter_persist if persist else self._prefilter
        if pre is not None and not pre.admits(message):
            return None
        for sig in self.specific + self.wrappers:
            if (sig.persist > 1) != persist:
                continue
            m = sig.search(message)
            if m:
                return sig, m
        return None
