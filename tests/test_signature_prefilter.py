"""The signature table's prefilter: the cheap first test ``SignatureSet.match`` runs
before trying the signatures one by one (issue 41: it never compiled for the shipped
table, silently, so every line paid for every signature).

It must exist for the shipped table, and it must never change an answer: a line it
turns away is a line no signature matches. Checked over every line of the real log
fixtures and the adversarial tokens of every pattern (tests/adversarial.py)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from tests import adversarial
from tui.state.loganalysis.lineshapes import split_prefix
from tui.state.loganalysis.signatures import Signature, SignatureSet, load_signatures

FIXTURES = Path(__file__).parent / "fixtures"


def _sig(id: str, *patterns: str, **kw: object) -> Signature:
    return Signature(id=id, patterns=tuple(re.compile(p) for p in patterns), title=id, **kw)  # type: ignore[arg-type]


def _messages() -> list[str]:
    out = []
    for p in sorted(FIXTURES.rglob("*.log")):
        out += [split_prefix(raw).message for raw in p.read_text("utf-8", "replace").splitlines()]
    return out


def test_the_shipped_table_has_its_prefilter() -> None:
    sigs = SignatureSet.build(load_signatures(user_file=None))
    assert sigs._prefilter is not None and sigs._prefilter_persist is not None
    assert "CUDA out of memory" in sigs._prefilter.exact and "loss" in sigs._prefilter_persist.folded
    assert not sigs._prefilter.admits("INFO 12-01 10:00:00 [loader.py:1] Loading weights took 3.1 s")


def test_a_pattern_with_its_own_flags_keeps_them_and_lends_them_to_no_other() -> None:
    """``(?i)`` is legal only at the very start of a whole regex: one such pattern used to
    make the combined prefilter fail to compile. Its flag still applies to it alone."""
    sigs = SignatureSet.build([_sig("nan", r"(?i)\bloss\s*=\s*nan\b"), _sig("oom", "CUDA out of memory"),
                               _sig("v", r"(?x) Engine \s+ dead  # verbose, with a comment")])
    assert sigs._prefilter is not None
    assert sigs.match("LOSS = NaN", persist=False) is not None
    assert sigs.match("cuda OUT of memory") is None  # the (?i) of another pattern does not reach it
    assert sigs.match("CUDA out of memory") is not None
    assert sigs.match("Engine   dead") is not None and sigs.match("Enginedead") is None


def test_the_prefilter_never_changes_an_answer() -> None:
    sigs = SignatureSet.build(load_signatures(user_file=None))
    plain = dataclasses.replace(sigs, _prefilter=None, _prefilter_persist=None)
    lines = _messages() + [adversarial.line(t, 300) for t in adversarial.tokens()]
    for persist in (False, True):
        for msg in lines:
            a, b = sigs.match(msg, persist=persist), plain.match(msg, persist=persist)
            assert (a and (a[0].id, a[1].span())) == (b and (b[0].id, b[1].span())), msg


def test_a_part_a_pattern_may_leave_out_is_never_required_by_the_prefilter() -> None:
    """A signature of the user's table whose longest literal sits in an optional or
    repeated-maybe-never part (`?`, `*`, `{0,2}`): a failure line without that part is
    still that failure. The prefilter may require only what every match contains; a
    part that must come at least once (`+`, `{2,}`) it may require."""
    sigs = SignatureSet.build([
        _sig("nccl", r"(?:fatal error in the distributed training loop: )?NCCL error"),
        _sig("died", r"worker died(?: while holding the collective communication lock)*"),
        _sig("ecc", r"(?:uncorrectable ECC error encountered on the device ){0,2}Xid 48"),
        _sig("retry", r"(?:step retried after a transient fault, ){2,}gave up"),
    ])
    plain = dataclasses.replace(sigs, _prefilter=None, _prefilter_persist=None)
    lines = {"NCCL error in: ProcessGroupNCCL.cpp:1970": "nccl",
             "fatal error in the distributed training loop: NCCL error": "nccl",
             "worker died": "died", "worker died while holding the collective communication lock": "died",
             "NVRM: Xid 48, pid=1": "ecc",
             "step retried after a transient fault, step retried after a transient fault, gave up": "retry",
             "step retried after a transient fault, gave up": None, "gave up": None}
    for line, sid in lines.items():
        got, want = sigs.match(line), plain.match(line)
        assert (got and got[0].id) == (want and want[0].id) == sid, line
    assert sigs._prefilter is not None and not sigs._prefilter.admits("gave up")  # `{2,}` may be required
