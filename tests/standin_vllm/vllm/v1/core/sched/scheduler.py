"""STAND-IN for vLLM 0.16 `vllm.v1.core.sched.scheduler` (tests only; not vLLM).

Follows (vllm-0.16.0 wheel):
- v1/core/sched/scheduler.py:64-73  Scheduler.__init__(vllm_config, kv_cache_config,
  structured_output_manager, block_size, ...) -- `block_size` required since 0.11.1.
- :321 schedule(): running requests first, then FCFS from waiting, bounded by the token
  budget (max_num_batched_tokens) and max_num_seqs; :656-665 without chunked prefill a
  prompt that does not fit the remaining budget stops scheduling, with it the prompt
  is cut to the budget.
- :860-873 finished_req_ids of the output = requests finished since the last step;
  :933 num_computed_tokens advances at schedule time; :950-952 the set is then reset.
- :1664-1726 finish_requests(ids, status) frees the request and records its id.
Not modelled: decode steps (prompts only), preemption, priorities, encoders, the KV-cache
manager and its prefix-caching assertion (the real tier shows that one).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.request import Request, RequestStatus


class Scheduler:
    def __init__(self, vllm_config: Any, kv_cache_config: Any, structured_output_manager: Any,
                 block_size: int, mm_registry: Any = None, include_finished_set: bool = False,
                 log_stats: bool = False) -> None:
        self.scheduler_config = vllm_config.scheduler_config
        self.cache_config = vllm_config.cache_config
        self.block_size = block_size
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)
        self.requests[request.request_id] = request

    def schedule(self) -> SchedulerOutput:
        cfg = self.scheduler_config
        budget = cfg.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        new_reqs: list[NewRequestData] = []
        cached = CachedRequestData()
        for req in self.running:
            left = req.num_tokens - req.num_computed_tokens
            if left <= 0 or budget <= 0:
                continue
            n = min(left, budget)
            num_scheduled[req.request_id] = n
            cached.req_ids.append(req.request_id)
            cached.num_computed_tokens.append(req.num_computed_tokens)
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = self.waiting[0]
            n = req.num_tokens - req.num_computed_tokens
            if not cfg.enable_chunked_prefill and n > budget:
                break
            n = min(n, budget)
            self.waiting.pop(0)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            num_scheduled[req.request_id] = n
            new_reqs.append(NewRequestData(req.request_id, list(req.prompt_token_ids),
                                           req.num_computed_tokens))
            budget -= n
        out = SchedulerOutput(new_reqs, cached, num_scheduled, sum(num_scheduled.values()),
                              finished_req_ids=self.finished_req_ids)
        for rid, n in num_scheduled.items():
            self.requests[rid].num_computed_tokens += n
        self.finished_req_ids = set()
        return out

    def finish_requests(self, request_ids: str | Iterable[str], finished_status: RequestStatus) -> None:
        assert RequestStatus.is_finished(finished_status)
        ids = (request_ids,) if isinstance(request_ids, str) else set(request_ids)
        for rid in ids:
            req = self.requests.get(rid)
            if req is None or req.is_finished():
                continue
            (self.running if req in self.running else self.waiting).remove(req)
            req.status = finished_status
            self.finished_req_ids.add(rid)
            del self.requests[rid]

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)
