"""STAND-IN for vLLM 0.16 `vllm.v1.request` (tests only; not vLLM).

Follows v1/request.py:59-77 (Request.__init__ signature; `block_hasher` optional and,
when given, computes `block_hashes` for the full prompt blocks) and :296-318
(RequestStatus; anything after PREEMPTED is finished).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import Any


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_FSM = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED


class Request:
    def __init__(self, request_id: str, prompt_token_ids: list[int] | None,
                 sampling_params: Any, pooling_params: Any, eos_token_id: int | None,
                 client_index: int = 0, arrival_time: float | None = None,
                 prompt_embeds: Any = None, mm_features: Any = None, lora_request: Any = None,
                 cache_salt: str | None = None, priority: int = 0, trace_headers: Any = None,
                 block_hasher: Callable[[Request], list[Any]] | None = None,
                 resumable: bool = False, reasoning_ended: bool | None = None) -> None:
        if sampling_params is None and pooling_params is None:
            raise ValueError("sampling_params and pooling_params can't both be unset")
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = arrival_time if arrival_time is not None else time.time()
        self.status = RequestStatus.WAITING
        self.prompt_token_ids = list(prompt_token_ids or [])
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.num_computed_tokens = 0
        self.max_tokens = 1 if pooling_params is not None else sampling_params.max_tokens
        self.block_hashes: list[Any] = []
        self._block_hasher = block_hasher
        if block_hasher is not None:
            self.block_hashes = block_hasher(self)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)
