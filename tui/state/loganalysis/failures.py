"""Failure recognition, one line at a time: signatures, Python tracebacks, bare
exception lines and exception chains (tracked per worker, since workers interleave),
and API request handlers' errors (a request's 400 is not the run's failure).

The quoted root cause is the raised exception's own line: a traceback's last line, or
the last link of a chained traceback. ``EXC_SHAPE``, ``INTERRUPT``, ``REQUEST_SOURCE``,
``NOTE_LEVEL`` and ``NOTE_RETRY`` are also sent to the host's supervisor as they are
(tui/services/restartpolicy.py).
"""

from __future__ import annotations

import re

from tui.state.loganalysis.record import (
    CHAIN_GAP,
    MAX_TB_LINES,
    Builder,
    advance,
    default_signatures,
)

_EXC_LINE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?::\s.*|:)?$")
# A raised exception's line, wherever it stands: "RuntimeError: …",
# "ray.exceptions.RayTaskError(ActorDiedError): …", "AssertionError", "Exception: …".
# Names ending in "Warning" are not exceptions being raised.
EXC_SHAPE = re.compile(
    r"(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Failure|Timeout)|Exception)"
    r"(?:\([\w.]*\))?(?::(?:\s|$)|$)"
)
_TB_START = "Traceback (most recent call last)"
# The user's interrupt (or a kill): Python's KeyboardInterrupt line, click's "Aborted!",
# "received signal SIGINT/SIGTERM"-style lines. Not a failure; what follows is its echo.
INTERRUPT = re.compile(
    r"(?:^KeyboardInterrupt(?::.*)?$|^Aborted!$"
    r"|(?i:\b(?:received|receiving|caught|got|trigger)\b.{0,30}(?:SIGINT|SIGTERM|signal (?:2|15)\b)))"
)
# A line at a quiet level in a shape whose level the prefix parser does not take apart
# (Python logging's "INFO:name:", "- INFO -" after a date, NCCL's "NCCL INFO"/"NCCL WARN")
# that says something is being retried: a note about a failure that was handled, never
# the failure itself ("INFO … retried after: Watchdog caught collective …" must not
# outrank a later OutOfMemoryError). A level word in the head, a retry word anywhere.
NOTE_LEVEL = re.compile(r"(?<![\w.])(?:DEBUG|INFO|NOTICE|WARN|WARNING)(?![\w.])")
NOTE_RETRY = re.compile(r"(?i:\bretr(?:y|ies|ied|ying)\b|\bwill restart\b|\battempts? left\b)")
NOTE_HEAD = 64  # the first characters of the message where the level word must stand


def retry_note(msg: str) -> bool:
    """True for a quiet-level line that only says a failure is being retried."""
    return NOTE_LEVEL.search(msg[:NOTE_HEAD]) is not None and NOTE_RETRY.search(msg) is not None


# Log lines of an API request handler: their errors are the request's (answered with a
# 4xx/5xx while the server keeps serving), unless they say the engine itself is dead.
REQUEST_SOURCE = re.compile(r"(?:^|/)(?:serving\w*|api_router)\.py:")
# Frames that only run after the load: where a traceback was when the run died.
_STAGE_FRAME = re.compile(
    r'^\s+File ".*", line \d+, in (?:(?P<capture>capture_model|capture_one_batch_size|capture_end|capture)'
    r"|(?P<warm>_dummy_sampler_run|compile_or_warm_up_model|warm_up_model|_warmup\w*)"
    r"|(?P<profile>profile_run|determine_available_memory|_initialize_kv_caches|determine_num_available_blocks))$"
)



def request_error(b: Builder, worker: str | None, msg: str, line: str, line_no: int) -> None:
    """An API request handler logged an error: requests flow, so the run is serving. The
    request's own error (a 400 for a too-long prompt, a bad argument) is not the run's
    failure; an engine that is dead is."""
    if b.get("phase") != "failed":
        b.set("phase", advance(b.get("phase"), "serving"))
    sigs = b.get("signatures") or default_signatures()
    hit = sigs.match(msg)
    if hit and hit[0].serving_fatal and EXC_SHAPE.match(msg):
        b.failure(hit[0], hit[1], line, line_no, worker)


def note_interrupt(b: Builder, msg: str, line_no: int) -> bool:
    """Record the user's interrupt (or a kill) if ``msg`` says one came; True if so."""
    if not INTERRUPT.search(msg.rstrip()):
        return False
    if b.get("interrupted_at") is None:
        b.set("interrupted_at", line_no)
    return True


def find_failures(b: Builder, worker: str | None, key: str, msg: str, line: str, line_no: int) -> None:
    """Failure signatures, Python tracebacks and bare exception lines (tracked per
    worker, since they interleave). The quoted line is the exception that was raised."""
    sigs = b.get("signatures") or default_signatures()
    tbs = b.get("_tracebacks")
    chains = b.get("_chains")
    at = msg.find(_TB_START)
    if at >= 0 and (at == 0 or msg[:at].rstrip().endswith(":")):
        # "Traceback (most recent call last):", or "Scheduler hit an exception: Traceback …"
        head = msg[:at]
        hit = sigs.match(head) if head.strip() else None
        fail_at = b.failure(hit[0], hit[1], line, line_no, worker).line_no if hit else None
        b.set("_tracebacks", {**tbs, key: (line_no, False, fail_at)})
        if key in chains:
            b.set("_chains", {k: v for k, v in chains.items() if k != key})
        return
    open_tb = tbs.get(key)
    if open_tb is not None and line_no - open_tb[0] > MAX_TB_LINES:
        b.set("_tracebacks", {k: v for k, v in tbs.items() if k != key})
        open_tb = None
    chain = chains.get(key)
    if chain is not None and (open_tb is not None or line_no - chain[0] > CHAIN_GAP):
        chains = {k: v for k, v in chains.items() if k != key}
        b.set("_chains", chains)
        chain = None
    continuation = not msg or msg[0].isspace() or msg.startswith(("During handling", "The above"))
    if not continuation and note_interrupt(b, msg, line_no):
        if open_tb is not None or chain is not None:  # the interrupt's traceback ends here
            b.set("_tracebacks", {k: v for k, v in tbs.items() if k != key})
            b.set("_chains", {k: v for k, v in b.get("_chains").items() if k != key})
        return
    hit = sigs.match(msg)
    if continuation:
        sm = _STAGE_FRAME.match(msg)
        if sm:
            b.stage(str(sm.lastgroup), line_no)
    if open_tb is not None:
        if continuation or not _EXC_LINE.match(msg):
            # a frame or source line, or a foreign line in between: the traceback goes on
            if hit:
                f = b.failure(hit[0], hit[1], line, line_no, worker)
                if not open_tb[1]:
                    b.set("_tracebacks", {**tbs, key: (open_tb[0], True, open_tb[2] or f.line_no)})
            return
        # the exception line ends this traceback
        fail_at = open_tb[2]
        if fail_at is not None and (hit is None or not hit[0].generic):
            better = b.failure(hit[0], hit[1], line, line_no, worker) if hit else None
            b.requote(fail_at, line, line_no, better)
            linked = line_no
        elif hit:
            linked = b.failure(hit[0], hit[1], line, line_no, worker).line_no
        elif not open_tb[1] and sigs.generic is not None:
            linked = b.failure(sigs.generic, None, line, line_no, worker).line_no
        else:
            linked = None
        b.set("_tracebacks", {k: v for k, v in tbs.items() if k != key})
        b.set("_chains", {**b.get("_chains"), key: (line_no, linked)})
        return
    if chain is not None and continuation:
        b.set("_chains", {**chains, key: (line_no, chain[1])})
        return
    if continuation and hit:
        # a frame or source line of a traceback whose header is not in the log (an
        # excerpt, or a process that logs only the end): the exception line will quote it
        f = b.failure(hit[0], hit[1], line, line_no, worker)
        b.set("_tracebacks", {**tbs, key: (line_no, True, f.line_no)})
        return
    exc = EXC_SHAPE.match(msg)
    if exc:
        sig, m = hit if hit else (sigs.generic, None)
        if sig is None:
            return
        f = b.failure(sig, m, line, line_no, worker)
        if chain is not None:
            b.chain_link(chain[1], f)
        b.set("_chains", {**b.get("_chains"), key: (line_no, f.line_no)})
        return
    if chain is not None:
        b.set("_chains", {k: v for k, v in chains.items() if k != key})
    if hit:
        b.failure(hit[0], hit[1], line, line_no, worker)

