"""Host text is cleaned where it enters the client (issue 41): every string the parser
hands on to be shown -- an agent error, a request's error, the hello's names, a log
reset's reason, a kill's stage and report, an outcome's error -- has no escape
sequence, no control byte and no bidi override, whatever the agent sent. Cleaning
later (a toast, a view) is a second line of defence, not the first: the CLI's
--json, the trace and the notices keep the parsed text as it is.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tui.protocol import (
    AgentError,
    Hello,
    KillProgress,
    LogData,
    LogReset,
    ProtocolError,
    Result,
    parse_line,
    parse_message,
)
from tui.protocol.hosttext import has_controls
from tui.protocol.ops import KillReport, Outcome

NASTY = ["\x1b[2J\x1b[H", "\x1b]52;c;aGk=\x07", "\x1b]8;;http://x\x1b\\", "\x9b31m", "\x00", "\x07", "\x7f",
         "\u202e", "\u2066", "\r", "\x1bc", "\x90q\x9c", "[red]x[/red]"]
TEXT = st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=5)), max_size=6).map("".join)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(k) + _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def _shown_clean(value: Any) -> None:
    for s in _strings(value):
        assert not has_controls(s) and "\x1b" not in s, repr(s)


@settings(max_examples=150, deadline=None)
@given(TEXT)
def test_every_text_the_parser_hands_on_is_clean(text: str) -> None:
    err = parse_message({"type": "error", "message": "boom " + text})
    assert isinstance(err, AgentError) and err.message.startswith("boom")
    _shown_clean(err.message)

    res = parse_message({"type": "result", "id": 1, "ok": False, "error": "denied: " + text})
    assert isinstance(res, Result) and res.error is not None and res.error.startswith("denied:")
    _shown_clean(res.error)

    hello = parse_message({"type": "hello", "protocol": 1, "agent_version": text, "agent_sha": text,
                           "hostname": "gpu-" + text, "python": text, "gpu_source": text, "gpu_error": text})
    assert isinstance(hello, Hello)
    _shown_clean([hello.agent_version, hello.agent_sha, hello.hostname, hello.python, hello.gpu_source,
                  hello.gpu_error])

    reset = parse_message({"type": "log_reset", "sub": "s", "reason": text, "offset": 0})
    assert isinstance(reset, LogReset)
    _shown_clean(reset.reason)

    prog = parse_message({"type": "kill_progress", "id": 3, "run_id": text, "stage": text, "alive": [1],
                          "gpus": [{"index": 0, "node": text}], "elapsed": 1.0})
    assert isinstance(prog, KillProgress)
    _shown_clean([prog.run_id, prog.stage, [g.node for g in prog.gpus]])

    report = KillReport.parse({"run_id": text, "ok": False, "note": text, "remaining": [5],
                               "stages": [{"signal": text, "at": 1.0, "sent_to": [5]}],
                               "node_proofs": [{"node": text, "error": text}]})
    _shown_clean([report.run_id, report.note, [asdict(s) for s in report.stages],
                  [asdict(p) for p in report.node_proofs],
                  report.record])

    outs = Outcome.parse_all({"outcomes": {"a1": {"state": "done", "ok": False, "error": text}}})
    _shown_clean(outs["a1"].error)


def test_an_agent_error_line_with_escapes_is_one_clean_line_from_the_wire() -> None:
    """The whole path from the agent's stdout: a line of JSON whose message would clear
    the screen and set the clipboard arrives as plain text with its words intact."""
    line = json.dumps({"type": "error", "message": "bad request\x1b[2J\x1b]52;c;aGk=\x07 from \u202eevil"})
    msg = parse_line(line.encode())
    assert isinstance(msg, AgentError)
    assert msg.message == "bad request from evil"


def test_a_log_chunk_that_is_not_base64_is_an_error_never_garbage_bytes() -> None:
    """A broken agent's or link's chunk (characters outside base64's alphabet) must not
    turn into log bytes shown as the run's output."""
    good = parse_message({"type": "log", "sub": "s", "path": "/x.log", "inode": 1, "offset": 0, "b64": "aGkK"})
    assert isinstance(good, LogData) and good.data == b"hi\n"
    for bad in ("aGk*Cg==", "aGkK\x1b[2J", "a GkK", "aGk"):
        with pytest.raises(ProtocolError):
            parse_message({"type": "log", "sub": "s", "path": "/x.log", "inode": 1, "offset": 0, "b64": bad})


def test_every_string_of_a_host_tree_is_one_line_keys_too() -> None:
    """A host's JSON reply (a kill report, a launch record, a timeline line) is shown
    field by field on one line each: a newline in any string of it, at any depth, key or
    value, is a space, so no host text can forge a line of its own on the screen."""
    from tui.protocol.hosttext import clean_tree

    tree = {"note\nforged": ["a\nb", {"c": "d\ne\x1b[31m"}, ("f\r\ng",)], "n": 3, "ok": None}
    assert clean_tree(tree) == {"note forged": ["a b", {"c": "d e"}, ["f g"]], "n": 3, "ok": None}


def test_a_kills_progress_says_the_seconds_the_agent_counted_from_zero() -> None:
    """The kill's progress lines ("SIGINT: 3 process(es) left, 0.0 s") show the seconds
    the agent counted since the kill began: its first look may come at 0 s, and a
    progress without a count (an agent that did not say) is at 0 s too, never a second
    made up by the client."""
    def progress(**extra: object) -> KillProgress:
        msg = parse_line(json.dumps({"type": "kill_progress", "id": 7, "run_id": "20261206-030000-ab12",
                                     "stage": "SIGINT", "alive": [4242], "gpus": [], **extra}))
        assert isinstance(msg, KillProgress)
        return msg

    assert [progress(elapsed=e).elapsed for e in (0, 0.0, 0.25, 12.5)] == [0.0, 0.0, 0.25, 12.5]
    assert progress().elapsed == 0.0
