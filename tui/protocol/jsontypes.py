"""JSON as a type: what a host's records and replies are made of before they get a
dataclass of their own (a run's spec, pace and attempts, a kill's report, a result).

`JSONValue` is any value `json.loads` returns; `JSONObject` one object. Code that reads
a field checks its type first (`isinstance`), as it must for data a host sent.
"""

from __future__ import annotations

from typing import TypeAlias, Union

JSONValue: TypeAlias = Union[str, int, float, bool, None, list["JSONValue"], dict[str, "JSONValue"]]
JSONObject: TypeAlias = dict[str, JSONValue]

__all__ = ["JSONObject", "JSONValue"]
