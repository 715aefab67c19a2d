"""JSON a host wrote into a file (a run record, a timeline line, a replay's recording) is
data like any host text: bounded before it is parsed and range-checked after.

``loads`` refuses, with ``ValueError``, a document over ``max_bytes`` or nested deeper than
``max_depth`` (json.loads itself raises ``RecursionError`` on a 100,000-deep line), and the
non-JSON ``NaN`` / ``Infinity`` literals. ``checked`` replaces every number that is not
finite or lies beyond ``limit`` (an int of 400 digits makes ``float()`` raise
``OverflowError``; ``1e400`` parses as infinity) by None and counts them, so a caller can
drop or mark the row. ``number`` is one such check for one value.
"""

from __future__ import annotations

import json
import math
from typing import Any, TypeVar, cast

from tui.protocol.jsontypes import JSONValue

_J = TypeVar("_J", bound=JSONValue)  # checked keeps the shape it is given

__all__ = ["DEPTH_MAX", "NUMBER_MAX", "checked", "loads", "number"]

NUMBER_MAX = 1e15  # no time, size, count or reading a run reports comes near it (epoch seconds: 2e9)
DEPTH_MAX = 32  # nesting of a record: a timeline line is 3 deep, a run record 5


def number(value: Any, limit: float = NUMBER_MAX) -> float | None:
    """``value`` as a float when it is a JSON number, finite and within ±``limit``; else
    None (a bool is no number). A huge int is never handed to ``float()``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return float(value) if -limit <= value <= limit else None
    return value if math.isfinite(value) and -limit <= value <= limit else None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(data: bytes | str, max_bytes: int, max_depth: int = DEPTH_MAX) -> JSONValue:
    """One JSON document of at most ``max_bytes``, nested at most ``max_depth`` deep."""
    if len(data) > max_bytes:
        raise ValueError(f"longer than {max_bytes} bytes")
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    try:
        obj: JSONValue = json.loads(data, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deep") from None
    stack = [(obj, 1)]
    while stack:  # no recursion: the depth is what is being checked
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > max_depth:
                raise ValueError(f"nested more than {max_depth} deep")
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))
    return obj


def checked(obj: _J, limit: float = NUMBER_MAX) -> tuple[_J, int]:
    """(``obj`` with every number that ``number`` refuses replaced by None, how many were).
    A bool stays; ints and floats within bounds are kept as they are. ``obj`` must come
    from ``loads`` (bounded depth)."""
    bad = 0

    def fix(v: Any) -> Any:
        nonlocal bad
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        if isinstance(v, (int, float)) and not isinstance(v, bool) and number(v, limit) is None:
            bad += 1
            return None
        return v

    return cast(_J, fix(obj)), bad
