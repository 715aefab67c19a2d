"""STAND-IN for vLLM 0.16 `vllm.v1.structured_output` (tests only; not vLLM).

Follows v1/structured_output/__init__.py:38 (StructuredOutputManager(vllm_config)).
No grammars here, so the executor's sample_tokens() always gets grammar_output=None.
"""

from __future__ import annotations

from typing import Any


class StructuredOutputManager:
    def __init__(self, vllm_config: Any) -> None:
        self.vllm_config = vllm_config
