"""JSON as a type: host JSON that has no dataclass of its own (a run's pace and
attempts, a result before its reply type parses it, a reply as `--json` prints it); the
host's records are tui/protocol/records.py's.

`JSONValue` is any value `json.loads` returns; `JSONObject` one object. Code that reads
a field checks its type first (`isinstance`), as it must for data a host sent.
"""

from __future__ import annotations

from typing import TypeAlias, Union

JSONValue: TypeAlias = Union[str, int, float, bool, None, list["JSONValue"], dict[str, "JSONValue"]]
JSONObject: TypeAlias = dict[str, JSONValue]

__all__ = ["JSONObject", "JSONValue"]
