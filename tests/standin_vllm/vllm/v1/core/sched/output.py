"""STAND-IN for vLLM 0.16 `vllm.v1.core.sched.output` (tests only; not vLLM).

Follows v1/core/sched/output.py:34 (NewRequestData), :114 (CachedRequestData) and
:184-222 (SchedulerOutput: num_scheduled_tokens, total_num_scheduled_tokens,
finished_req_ids = requests finished since the previous step).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    req_ids: list[str] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: set[str]
    preempted_req_ids: set[str] | None = None
