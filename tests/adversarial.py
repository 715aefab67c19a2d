"""Adversarial log lines and every parser that meets host text, on both sides.

``tokens()`` builds repeatable tokens from each parser regex's own alphabet: for every
pattern, strings that almost match it (a match's prefix, one missing its last piece),
its literal runs, and a fixed list of the usual culprits (digit runs, "step 1 ",
"loss=", bracket and whitespace runs, a shard bar's description). ``line(token)`` repeats
a token into a 1 MB line. ``parsers()`` names every entry point that reads a host line:
the client's fold (``tui.state.loganalysis.fold.step``, in a fresh analysis and inside an open
traceback), each line parser on its own, the signature table, the line splitter, the
host's pace (``remote/run/pace.py``) and its restart matcher (``remote/run/restartpolicy.py``).

``python -m tests.adversarial`` prints the slowest line per parser (used for the
numbers in issue 35); ``tests/test_linear_time.py`` asserts each stays under 50 ms.
"""

from __future__ import annotations

import re
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

try:  # Python 3.11+
    from re import _constants as sre_c  # type: ignore[attr-defined]
    from re import _parser as sre_p  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - 3.10
    import sre_constants as sre_c  # type: ignore[no-redef]
    import sre_parse as sre_p  # type: ignore[no-redef]

LINE_BYTES = 1 << 20

# The culprits named in issue 35, and the alphabet of tqdm bars, metrics and tracebacks.
FIXED = (
    "step 1 ", "1", "9", "0.", " ", "\t", "loss=", "loss: ", "loss ", "[", "(", ":", "|", "]", ")", "=",
    "nan ", "inf ", "'", '"', "/", "1/", "1/2 ", "%", "1%|", "1% ", "-", "_", "a", "a.", "a_", ".", ",",
    "1,000", "e", "1e", "Error", "Error: ", "Loading safetensors checkpoint shards: ",
    "Loading safetensors checkpoint shards:  50% Completed | 1/2 [", "[extract] batch 1/2 | ",
    'File "', "step=1 ", "iteration 1/2 ", "Epoch [1][", "[1/2][", "global_step: 1 ", "loss=nan ",
    "ProcessGroupNCCL ", "CUDA error: ", "Traceback ", "pid=1 ", "(Worker_TP0 pid=1) ", "INFO ",
    "\u2588", "#015", "\\|", "train/loss=", "lr ", "grad norm ", "1 [00:01<00:02, ",
)


def _gen(items: Any, pick: int, depth: int = 0) -> str:
    """A string that matches the parsed pattern ``items`` (the ``pick``-th alternative of
    each branch, where it has one), best effort: lookarounds and anchors add nothing."""
    out = []
    for op, av in items:
        if depth > 20:
            break
        if op is sre_c.LITERAL:
            out.append(chr(av))
        elif op is sre_c.NOT_LITERAL:
            out.append("a" if av != ord("a") else "b")
        elif op is sre_c.ANY:
            out.append("a")
        elif op is sre_c.IN:
            out.append(_class_char(av))
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, getattr(sre_c, "POSSESSIVE_REPEAT", None)):
            lo, hi, sub = av
            n = max(lo, min(hi, 2))
            out.append(_gen(sub, pick, depth + 1) * n)
        elif op is sre_c.SUBPATTERN:
            out.append(_gen(av[-1], pick, depth + 1))
        elif op is getattr(sre_c, "ATOMIC_GROUP", None):
            out.append(_gen(av, pick, depth + 1))
        elif op is sre_c.BRANCH:
            alts = av[1]
            out.append(_gen(alts[pick % len(alts)], pick, depth + 1))
        elif op is sre_c.GROUPREF_EXISTS:
            out.append(_gen(av[1], pick, depth + 1))
    return "".join(out)


def _class_char(items: Any) -> str:
    for op, av in items:
        if op is sre_c.NEGATE:
            return "a" if not any(o is sre_c.LITERAL and a == ord("a") for o, a in items) else "~"
        if op is sre_c.LITERAL:
            return chr(av)
        if op is sre_c.RANGE:
            return chr(av[0])
        if op is sre_c.CATEGORY:
            return {sre_c.CATEGORY_DIGIT: "1", sre_c.CATEGORY_SPACE: " ", sre_c.CATEGORY_WORD: "a",
                    sre_c.CATEGORY_NOT_DIGIT: "a", sre_c.CATEGORY_NOT_SPACE: "a",
                    sre_c.CATEGORY_NOT_WORD: " "}.get(av, "a")
    return "a"


def _literals(items: Any) -> Iterator[str]:
    run: list[str] = []
    for op, av in items:
        if op is sre_c.LITERAL:
            run.append(chr(av))
            continue
        if run:
            yield "".join(run)
            run = []
        if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            yield from _literals(av[2])
        elif op is sre_c.SUBPATTERN:
            yield from _literals(av[-1])
        elif op is sre_c.BRANCH:
            for alt in av[1]:
                yield from _literals(alt)
    if run:
        yield "".join(run)


def pattern_tokens(pattern: str) -> set[str]:
    """Tokens from one regex: near-matches of each alternative and its literal runs."""
    try:
        parsed = sre_p.parse(pattern)
    except re.error:
        return set()
    out: set[str] = set()
    for pick in range(4):
        s = _gen(list(parsed), pick)
        if s:
            out.update({s, s[:-1], s + " ", s[: max(1, len(s) // 2)]})
    out.update(lit for lit in _literals(list(parsed)) if lit.strip())
    return {t for t in out if t}


def patterns() -> list[str]:
    """Every regex of a parser that meets host text, on both sides."""
    from remote.run import pace, restartpolicy
    from tui.state import advice, logbytes
    from tui.state.loganalysis import failures, fold, lineshapes, record, signatures, train

    found: list[str] = []
    for mod in (pace, restartpolicy, lineshapes, fold, train, failures, record, logbytes, advice, signatures):
        for v in vars(mod).values():
            if isinstance(v, re.Pattern) and isinstance(v.pattern, str):
                found.append(v.pattern)
    for sig in record.default_signatures().specific + record.default_signatures().wrappers:
        found.extend(p.pattern for p in sig.patterns)
    return found


def tokens() -> list[str]:
    out = set(FIXED)
    for p in patterns():
        out |= pattern_tokens(p)
    return sorted(t for t in out if t and len(t) < 200)


def line(token: str, size: int = LINE_BYTES) -> str:
    """``token`` repeated to ``size`` characters; a token "HEAD\x00FILL" is HEAD once, then
    FILL repeated (a word followed by a long run of one class: "loss" and 1 MB of blanks)."""
    head, _, fill = token.rpartition("\x00")
    return head + (fill * (size // len(fill) + 1))[: size - len(head)]


FILLERS = (" ", "1", "a", ".", "\t", "[", "/")


def cases() -> list[str]:
    """Every token repeated, and each literal of a pattern (and each fixed token) followed
    by a run of each filler."""
    heads = set(FIXED)
    for p in patterns():
        try:
            heads.update(lit for lit in _literals(list(sre_p.parse(p))) if lit.strip())
        except re.error:
            pass
    runs = {f"{h}\x00{f}" for h in heads if len(h) < 200 for f in FILLERS}
    return tokens() + sorted(runs)


def huge_numbers() -> list[str]:
    """Lines shaped like a match of some pattern, each of their numbers 5000 digits long
    (int() refuses more than 4300; float() of a 400-digit int overflows): once, and
    repeated into a 1 MB line."""
    out = set()
    for tok in tokens():
        if any(c.isdigit() for c in tok):
            big = re.sub(r"\d+", "1" * 5000, tok)
            out.update({big, big + " " + tok})
    return sorted(out)


def parsers() -> dict[str, Callable[[str], Any]]:
    """Name -> a function that parses one host line the way the product does."""
    from remote.run import pace, restartpolicy
    from tui.services.config import parse_config
    from tui.services.restartpolicy import compile_policy
    from tui.state import logbytes, watch
    from tui.state.loganalysis import fold, lineshapes, train
    from tui.state.loganalysis.record import LogAnalysis, default_signatures

    sigs = default_signatures()
    fresh = LogAnalysis(signatures=sigs)
    in_tb = fold.step(fresh, "Traceback (most recent call last):", 1, 0.0)
    matcher = restartpolicy.Matcher(compile_policy(parse_config('[run]\nrestart = "on-failure"\n')) or {})

    def host_pace(text: str) -> Any:
        p = pace.Pace("/nonexistent")
        p._feed(text.encode("utf-8", "replace") + b"\n", 1.0)
        return p.step

    return {
        "client step": lambda text: fold.step(fresh, text, 2, 1.0),
        "client step (traceback open)": lambda text: fold.step(in_tb, text, 2, 1.0),
        "client split_lines": lambda text: logbytes.split_lines(b"", text.encode("utf-8", "replace") + b"\n"),
        "client split_prefix": lineshapes.split_prefix,
        "client shard bar": lineshapes.parse_shard_progress,
        "client extract": lineshapes.parse_extract_progress,
        "client train line": train.parse_train_line,
        "client signatures": sigs.match,
        "client signatures (persist)": lambda text: sigs.match(text, persist=True),
        "client step label": lambda text: watch.attempt_cause({"progress": {"step": text}, "cause": {"title": "x"}}),
        "host pace": host_pace,
        "host pace loss": pace.line_loss,
        "host restart matcher": lambda text: matcher.root_cause([text]),
    }


class TooSlow(Exception):
    pass


class Raised(Exception):
    """A parser raised on a line: the message names the exception."""


def _alarm(signum: int, frame: Any) -> None:
    raise TooSlow


def timed(fn: Callable[[str], Any], text: str, limit: float | None = None) -> float:
    """CPU seconds ``fn(text)`` took (the thread's, so other load on the machine counts
    less); with ``limit``, ``limit`` when it was stopped there (re checks signals)."""
    if limit is not None:
        signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, limit)
    t0 = time.thread_time()
    try:
        fn(text)
    except TooSlow:
        return limit or 0.0
    except Exception as exc:  # a parser never raises on odd input
        raise Raised(f"{type(exc).__name__}: {str(exc)[:120]}") from exc
    finally:
        if limit is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
    return time.thread_time() - t0


def worst(names: Iterable[str] | None = None, toks: list[str] | None = None, limit: float | None = None,
          size: int = LINE_BYTES, progress: bool = False, raised: dict[str, str] | None = None
          ) -> dict[str, tuple[float, str]]:
    """Parser name -> (slowest CPU seconds, its token), over every token's line. A parser
    that raises raises ``Raised``, or with ``raised`` (a dict) is noted there, once."""
    ps = parsers()
    chosen = list(names) if names is not None else list(ps)
    out: dict[str, tuple[float, str]] = {n: (0.0, "") for n in chosen}
    for i, tok in enumerate(toks if toks is not None else cases()):
        if progress and i % 100 == 0:
            print(f"  {i} tokens done", file=sys.stderr, flush=True)
        text = line(tok, size)
        for n in chosen:
            try:
                dt = timed(ps[n], text, limit)
            except Raised as exc:
                if raised is None:
                    raise
                raised.setdefault(n, f"{exc} (token {tok[:40]!r})")
                continue
            if dt > out[n][0]:
                out[n] = (dt, tok)
    return out


def main(argv: list[str]) -> int:
    limit = float(argv[0]) if argv else 5.0
    toks = cases()[:: int(argv[1]) if len(argv) > 1 else 1]
    print(f"{len(toks)} lines of {LINE_BYTES} bytes, each call stopped at {limit:g} s")
    raised: dict[str, str] = {}
    for name, (dt, tok) in worst(toks=toks, limit=limit, progress=True, raised=raised).items():
        shown = ">=" if dt >= limit else "  "
        print(f"{name:32s} {shown}{dt * 1000:9.1f} ms  token {tok[:40]!r}", flush=True)
    for name, what in raised.items():
        print(f"{name:32s} raised {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
