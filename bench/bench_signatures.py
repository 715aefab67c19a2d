"""Time per line of the signature match with and without its combined prefilter.

``SignatureSet.match`` first asks its prefilter (a few words one of which every match
contains, tui/state/loganalysis/signatures.py ``Prefilter``) and tries the signatures one by one only
when it admits the line. Until issue 41 the prefilter was one regex of all the patterns
that never compiled for the shipped table (a ``(?i)`` in the middle of it), so every line
was tried signature by signature; compiled, that regex saved nothing (-2 %). This prints
the signature-by-signature cost and the prefilter's over real logs: every ``*.log`` under
``tests/fixtures/corpus``, ``corpus_heldout``, ``heldout`` and ``logs`` (the message part
of each line, as ``tui.state.loganalysis.failures`` passes it), best of ``--repeat`` passes.

    python bench/bench_signatures.py [--repeat 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tui.state.loganalysis.lineshapes import split_prefix  # noqa: E402
from tui.state.loganalysis.record import default_signatures  # noqa: E402
from tui.state.loganalysis.signatures import SignatureSet  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"


def messages() -> list[str]:
    out = []
    for d in ("corpus", "corpus_heldout", "heldout", "logs"):
        for p in sorted((FIXTURES / d).rglob("*.log")):
            for raw in p.read_text("utf-8", "replace").splitlines():
                out.append(split_prefix(raw).message)
    return out


def per_line(sets: list[SignatureSet], msgs: list[str], repeat: int) -> list[tuple[float, int]]:
    """CPU seconds per line (this thread's, so other load on the machine counts less),
    best of ``repeat`` passes taken in turn, and the lines matched, for each set."""
    best = [float("inf")] * len(sets)
    hits = [0] * len(sets)
    for _ in range(repeat):
        for i, sigs in enumerate(sets):
            t0 = time.thread_time()
            hits[i] = sum(1 for m in msgs if sigs.match(m) is not None)
            best[i] = min(best[i], time.thread_time() - t0)
    return [(b / len(msgs), h) for b, h in zip(best, hits)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    sigs = default_signatures()
    if sigs._prefilter is None:
        print("the prefilter did not compile: both rows below try every signature")
    plain = dataclasses.replace(sigs, _prefilter=None, _prefilter_persist=None)
    msgs = messages()
    n_pat = sum(len(s.patterns) for s in sigs.specific + sigs.wrappers)
    print(f"{len(msgs)} lines from tests/fixtures/{{corpus,corpus_heldout,heldout,logs}}, "
          f"{n_pat} patterns, best of {args.repeat}")
    (t_plain, h_plain), (t_pre, h_pre) = per_line([plain, sigs], msgs, args.repeat)
    print(f"signature by signature (no prefilter): {t_plain * 1e6:7.2f} us/line  ({h_plain} lines matched)")
    print(f"prefilter first:                       {t_pre * 1e6:7.2f} us/line  ({h_pre} lines matched)")
    if h_plain != h_pre:
        print("MISMATCH: the prefilter changed which lines match")
        return 1
    print(f"saved {100 * (1 - t_pre / t_plain):.0f} % per line")
    return 0


if __name__ == "__main__":
    sys.exit(main())
