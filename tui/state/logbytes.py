"""Line assembly for raw log bytes: split, decode, sanitize, collapse ``\\r`` redraws.

Pure and incremental. The caller keeps ``partial`` (the undecoded bytes of the line that
has no ``\\n`` yet) between chunks::

    lines, partial = split_lines(partial, chunk)
    ...
    lines = finish_lines(partial)          # at end of stream
    live = live_segment(partial)              # a tqdm bar being redrawn in place

Decoding happens only on complete lines, so a multi-byte UTF-8 character split across
chunks is never turned into U+FFFD (``\\n`` never occurs inside a UTF-8 sequence).
Each line passes `tui.protocol.hosttext.clean` (escapes, controls, bidi overrides) before
its redraws are collapsed: this is where the log's text enters the client.
"""

from __future__ import annotations

import re

from tui.protocol.hosttext import clean

__all__ = [
    "MAX_PARTIAL",
    "clean_line",
    "collapse_cr",
    "finish_lines",
    "live_segment",
    "split_lines",
    "strip_ansi",
]

# A "line" with no newline this long is emitted anyway, so a binary or runaway file
# cannot grow the partial state without bound. Real vLLM/tqdm lines are < 1 KiB.
MAX_PARTIAL = 8 * 1024 * 1024

# The worker prefix vLLM's decorate_logs writes at the start of every physical line:
# "(Worker_TP0 pid=1234) ", "(VllmWorker rank=1 pid=7) ", "(EngineCore_DP0 pid=9) ".
_LEAD_PREFIX = re.compile(r"\s*(\([A-Za-z][\w\-]*(?: [\w=\-]+)? pid=\d+\))\s*")


def strip_ansi(text: str) -> str:
    """``text`` sanitized (`tui.protocol.hosttext.clean`), its ``\\r`` kept for `collapse_cr`."""
    return clean(text, cr=True)


def collapse_cr(text: str) -> str:
    """Return what a terminal would show for one line containing ``\\r`` redraws.

    The last ``\\r`` segment with visible content wins. A vLLM worker prefix written
    before the first ``\\r`` ("(Worker_TP0 pid=1) \\rLoading ...") is kept in front of
    the winning segment, because in the file it labels the whole physical line.
    """
    if text.endswith("\r"):
        text = text.rstrip("\r")
    if "\r" not in text:
        return text
    segments = text.split("\r")
    winner = None
    for seg in reversed(segments[1:]):
        if seg.strip():
            winner = seg
            break
    if winner is None:
        return segments[0]
    m = _LEAD_PREFIX.match(segments[0])
    if m and not _LEAD_PREFIX.match(winner):
        return f"{m.group(1)} {winner}"
    return winner


def clean_line(raw: bytes) -> str:
    """Decode one physical line and turn it into the displayed text."""
    return collapse_cr(clean(raw, cr=True))


def split_lines(partial: bytes, data: bytes) -> tuple[list[str], bytes]:
    """Feed ``data`` after ``partial``; return the complete lines and the new partial.

    ``\\r\\n`` ends a line like ``\\n``. Returned lines carry no line terminator.
    """
    buf = partial + data if partial else data
    end = buf.rfind(b"\n")
    if end < 0:
        if len(buf) > MAX_PARTIAL:
            return [clean_line(buf)], b""
        return [], bytes(buf)
    complete = buf[:end]
    rest = bytes(buf[end + 1 :])
    lines = [clean_line(raw) for raw in complete.split(b"\n")]
    if len(rest) > MAX_PARTIAL:
        lines.append(clean_line(rest))
        rest = b""
    return lines, rest


def finish_lines(partial: bytes) -> list[str]:
    """Lines left when the stream ends: the partial line, if it holds anything."""
    if not partial:
        return []
    return [clean_line(partial)]


def live_segment(partial: bytes) -> str:
    """The text a terminal shows right now for the unfinished line.

    tqdm writing to a file redraws with ``\\r`` and no ``\\n``; this is the latest
    redraw (with the worker prefix kept), or "" when nothing is pending. A multi-byte
    character still incomplete at the end of ``partial`` is left out, not replaced.
    """
    if not partial:
        return ""
    cut = len(partial) - _incomplete_tail(partial)
    text = partial[:cut].decode("utf-8", errors="replace")
    return collapse_cr(strip_ansi(text))


def _incomplete_tail(data: bytes) -> int:
    """How many bytes at the end of ``data`` are an unfinished UTF-8 sequence (0-3)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if byte >> 5 == 0b110:
            need = 2
        elif byte >> 4 == 0b1110:
            need = 3
        elif byte >> 3 == 0b11110:
            need = 4
        else:
            need = 1
        return back if need > back else 0
    return 0
