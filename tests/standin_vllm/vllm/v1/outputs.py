"""STAND-IN for vLLM 0.16 `vllm.v1.outputs` (tests only; not vLLM).

Follows v1/outputs.py:160 (ModelRunnerOutput) and :250 (EMPTY_MODEL_RUNNER_OUTPUT).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]] = field(default_factory=list)


EMPTY_MODEL_RUNNER_OUTPUT = ModelRunnerOutput(req_ids=[], req_id_to_index={})
