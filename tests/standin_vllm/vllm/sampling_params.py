"""STAND-IN for vLLM 0.16 `vllm.sampling_params` (tests only; not vLLM).

Follows sampling_params.py:117,177,271 (SamplingParams; max_tokens default 16).
"""

from __future__ import annotations

from typing import Any


class SamplingParams:
    def __init__(self, max_tokens: int | None = 16, temperature: float = 1.0,
                 extra_args: dict[str, Any] | None = None, **_: Any) -> None:
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.extra_args = extra_args
