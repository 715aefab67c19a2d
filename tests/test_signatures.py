"""Every failure signature earns its place: each one in the table is matched by a line
of a real log fixture, and taking it out of the table changes what the analysis
concludes (failed or not, the phase, the root cause) for at least one fixture. A
signature nothing needs is dead weight; one whose removal changes nothing is untested.

The table is iterated, so a signature added to tui/data/signatures.toml is held to this
from the day it is added: give it a fixture (tests/fixtures/**.log) where it decides.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tui.services.inspect import inspect_log
from tui.state.loganalysis.signatures import Signature, SignatureSet, load_signatures

FIXTURES = Path(__file__).parent / "fixtures"
TABLE = load_signatures(user_file=None)  # the built-in table only, never the user's file


# id -> why no fixture decides it yet. Strict: a fixture that makes one pass fails the
# test until its id leaves this list, so the list only shrinks.
NO_FIXTURE_YET: dict[str, str] = {}  # emptied by tests/fixtures/signatures/ (issue 41)


@cache
def _logs() -> dict[str, bytes]:
    return {str(p.relative_to(FIXTURES)): p.read_bytes() for p in sorted(FIXTURES.rglob("*.log"))}


@cache
def _found(ids: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Each fixture's analysis with the table ``ids``."""
    sigs = [s for s in TABLE if s.id in ids]
    return {name: inspect_log(data, SignatureSet.build(sigs)) for name, data in _logs().items()}


def result(r: dict[str, Any]) -> tuple[Any, ...]:
    """What a user is told about a log: failed or not, the phase (or the phase it died in),
    the stage, and the root cause's id."""
    cause = r["root_cause"]
    if cause is None:
        return (False, r["phase"], r["stage"], None)
    return (True, r["failed_in"], r["failed_stage"], cause["id"])


ALL = tuple(s.id for s in TABLE)


def _cases() -> list[Any]:
    return [pytest.param(s, id=s.id, marks=[pytest.mark.xfail(strict=True, reason=NO_FIXTURE_YET[s.id])]
                         if s.id in NO_FIXTURE_YET else []) for s in TABLE]


def test_the_table_is_not_empty_and_ids_are_unique() -> None:
    assert len(ALL) >= 10 and len(set(ALL)) == len(ALL), ALL
    assert set(NO_FIXTURE_YET) <= set(ALL), set(NO_FIXTURE_YET) - set(ALL)


@pytest.mark.parametrize("sig", _cases())
def test_signature_is_decisive_on_a_real_fixture(sig: Signature) -> None:
    """Some fixture line is reported as this signature, and without it in the table at least
    one fixture's result changes."""
    full = _found(ALL)
    matched = [name for name, r in full.items() if any(f["id"] == sig.id for f in r["failures"])]
    assert matched, f"no line of tests/fixtures/**.log is reported as {sig.id}: add a real excerpt"
    without = _found(tuple(i for i in ALL if i != sig.id))
    changed = {name: (result(full[name]), result(without[name])) for name in matched
               if result(full[name]) != result(without[name])}
    assert changed, (f"taking {sig.id} out of the table changes no fixture's result (failed, phase, "
                     f"stage, root cause); it is reported in {matched[:5]}")


# ---- the matcher's edges (survivors of a mutation run over tui/state/loganalysis/signatures.py) ----


def _sig(id: str, pattern: str, title: str = "t", **kw: Any) -> Signature:
    import re

    return Signature(id=id, patterns=(re.compile(pattern),), title=title, **kw)


def test_a_back_reference_matches_behind_the_prefilter() -> None:
    """``\\1`` refers to the pattern's own group; the prefilter (words each pattern
    requires) lets its lines through and the signature still finds them."""
    sigs = SignatureSet.build([_sig("x", r"(x)y"), _sig("twice", r"(ab)-\1")])
    found = sigs.match("got ab-ab here")
    assert found is not None and found[0].id == "twice"
    assert sigs.match("ab-xy") is not None and sigs.match("ab-cd") is None


def test_specific_wrappers_and_the_catch_all_are_apart() -> None:
    spec, wrap, generic = _sig("s", "a"), _sig("w", "b", wrapper=True), _sig("g", "c", generic=True)
    sigs = SignatureSet.build([generic, wrap, spec])
    assert (sigs.specific, sigs.wrappers, sigs.generic) == ((spec,), (wrap,), generic)


def test_a_title_it_cannot_fill_is_shown_as_written() -> None:
    import re

    for title in ("broken {", "field {name.attr} of a str", "{0}"):
        sig = _sig("t", r"(?P<name>\w+) died", title=title)
        assert sig.render_title(re.search(sig.patterns[0], "engine died")) == title
    assert _sig("t", r"(?P<name>\w+) died", title="{name} died").render_title(
        re.search(r"(?P<name>\w+) died", "engine died")) == "engine died"


def test_an_unreadable_signatures_file_is_one_line_with_the_reason(tmp_path: Path) -> None:
    from tui.state.loganalysis.signatures import SignatureError

    with pytest.raises(SignatureError) as info:
        load_signatures([tmp_path], user_file=None)  # a directory: cannot be read as a file
    assert str(info.value) == f"{tmp_path}: cannot read: Is a directory"


def test_a_title_with_fields_and_no_match_is_shown_as_written() -> None:
    assert _sig("t", "x", title="{name} died").render_title(None) == "{name} died"


def test_signatures_are_frozen_and_hashable_even_with_a_patch_fix() -> None:
    """The table is shared by every analysis (cached): nobody may change a signature in
    place, and signatures (the patch ones carry a dict fix) can be set members."""
    import dataclasses

    patch_sig = next(s for s in TABLE if isinstance(s.fix, dict))
    assert len({patch_sig, *TABLE}) == len(TABLE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        patch_sig.title = "changed"  # type: ignore[misc]
