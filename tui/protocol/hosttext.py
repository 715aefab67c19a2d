"""Host text as data: the one sanitizer for every string the host sends that the client shows.

Log lines, process command lines, run names and ids, file names, error strings: all of
it comes from machines and users we do not control. ``clean`` turns it into text that
can only be printed, never act on a terminal:

- every ESC sequence goes, with its parameters: CSI (``ESC [`` … final byte, with
  parameter and intermediate bytes), OSC, DCS, SOS, PM and APC strings up to their BEL or
  ST (or the end of the text), and the two- and three-byte escapes (``ESC c``, ``ESC 7``,
  ``ESC 8``, ``ESC =``, ``ESC >``, ``ESC #8``, ``ESC (B``…); the same for the 8-bit
  introducers (U+009B CSI, U+009D OSC, U+0090 DCS, U+0098 SOS, U+009E PM, U+009F APC),
  except that an 8-bit SOS/PM/APC with no BEL or ST after it loses only itself (it is
  most often a cp1252 letter read as Latin-1, and the rest of the line is text);
- then every other C0 control but TAB (and newline, unless ``newline=False`` makes it a
  space; ``cr=True`` keeps ``\\r`` for the line assembler, which collapses redraws), DEL,
  every C1 control (U+0080-U+009F) and the bidi overrides and isolates (U+202A-U+202E,
  U+2066-U+2069), which could make a line read as another.

Bytes are decoded as UTF-8 with ``errors="replace"``; a lone surrogate (bytes that were
not UTF-8, decoded with ``surrogateescape`` on the host: a path with byte 0xFF) becomes
U+FFFD too, since no UTF-8 encoder takes it (Textual's web driver raised and ended the
browser session). Text that is already printable (the common case: one character-class
scan in C) is returned as it is, so a 2,000 lines/s burst pays one regex scan per line.
Markup is the other half of the rule and lives in the views:
host text reaches a widget as ``rich.text.Text`` or with ``markup=False``.
"""

from __future__ import annotations

import re
from typing import TypeVar, cast

from tui.protocol.jsontypes import JSONValue

_J = TypeVar("_J", bound=JSONValue)  # clean_tree keeps the shape it is given

__all__ = ["ESCAPES", "clean", "clean_tree", "has_controls"]

# The sequences a terminal would act on, 7-bit (one literal prefix, so `re` skips to
# each ESC in C) and 8-bit. The alternatives never overlap in what they repeat, so the
# scan is linear whatever the input.
_STRING = r"[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # an OSC/DCS/SOS/PM/APC body up to BEL or ST
_SEQ7 = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]?"  # CSI: parameters, intermediates, final byte
    rf"|[\]PX^_]{_STRING}"  # OSC, DCS, SOS, PM, APC
    r"|[ -/]*[0-~]?)"  # ESC c, ESC 7, ESC =, ESC #8, ESC (B, a lone ESC
)
ESCAPES = _SEQ7  # for a matcher that strips escapes as `clean` does (the host's restart policy)
# An 8-bit SOS, PM or APC (U+0098, U+009E, U+009F) is usually no escape at all but a
# cp1252 letter read as Latin-1 (˜ ž Ÿ): one with no ST or BEL after it loses only
# itself, not the rest of the line. Its body stops at any 8-bit introducer too, so no
# character is scanned by two unterminated strings: linear however many there are.
_SEQ8 = re.compile(r"\x9b[0-?]*[ -/]*[@-~]?"
                   rf"|[\x90\x9d]{_STRING}"
                   r"|[\x98\x9e\x9f](?:[^\x07\x1b\x90\x98\x9b-\x9f]*(?:\x07|\x1b\\|\x9c))?")
_INTRODUCER = re.compile("[\x90\x98\x9b\x9d\x9e\x9f]")

# What goes after the sequences: C0 but TAB and newline (and CR unless kept), DEL, C1,
# the bidi overrides and isolates. One character class: `re.sub` scans it in C.
_CONTROLS = "\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069"
_DROP = {False: re.compile(f"[{_CONTROLS}\r]"), True: re.compile(f"[{_CONTROLS}]")}
_SURROGATE = re.compile("[\ud800-\udfff]")
_ANY = re.compile(f"[{_CONTROLS}\r\ud800-\udfff]")  # what `clean` changes: the fast path's one scan


def clean(text: str | bytes, *, cr: bool = False, newline: bool = True) -> str:
    """``text`` as the client may show it: no escape sequence, no control but TAB and
    newline (a space with ``newline=False``; ``\\r`` kept with ``cr=True``), no bidi
    override. Idempotent."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8", errors="replace")
    if _ANY.search(text) is None:  # the common case: nothing to do, one scan in C
        return text if newline else text.replace("\n", " ")
    if _SURROGATE.search(text):
        text = _SURROGATE.sub("\ufffd", text)
    if _INTRODUCER.search(text):
        text = _SEQ8.sub("", text)
    if "\x1b" in text:
        text = _SEQ7.sub("", text)
    text = _DROP[cr].sub("", text)
    return text if newline else text.replace("\n", " ")


def has_controls(text: str) -> bool:
    """True when ``clean`` would change ``text`` beyond its TABs and newlines."""
    return _ANY.search(text) is not None


def clean_tree(value: _J, *, newline: bool = False) -> _J:
    """A decoded JSON value with every string in it (keys too) cleaned: the same shape
    (a tuple in it comes back a list)."""
    return cast(_J, _clean_tree(value, newline))


def _clean_tree(value: object, newline: bool) -> object:
    if isinstance(value, str):
        return clean(value, newline=newline)
    if isinstance(value, dict):
        return {_clean_tree(k, False): _clean_tree(v, newline) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean_tree(v, newline) for v in value]
    return value
