"""STAND-IN for vLLM 0.16 `vllm.sequence` (tests only; not vLLM).

Follows sequence.py:18 (IntermediateTensors: a dict of tensors passed between PP ranks).
"""

from __future__ import annotations

from typing import Any


class IntermediateTensors:
    def __init__(self, tensors: dict[str, Any], kv_connector_output: Any = None) -> None:
        self.tensors = tensors

    def __getitem__(self, key: str) -> Any:
        return self.tensors[key]
