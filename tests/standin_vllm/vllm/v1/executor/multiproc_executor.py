"""STAND-IN for vLLM 0.16 `vllm.v1.executor.multiproc_executor` (tests only; not vLLM).

In-process "workers" (one per TP rank) instead of processes; the parent-side contract
follows vLLM 0.16:
- v1/executor/multiproc_executor.py:96 MultiprocExecutor(vllm_config, monitor_workers).
- :270-292 execute_model / sample_tokens are collective_rpc calls with
  unique_reply_rank=output_rank (TP rank 0 here).
- :303-372 collective_rpc: every rank runs the method; with unique_reply_rank set only
  that rank's reply is read and returned **as the value itself**
  (`return responses[0] if output_rank is not None else responses`, :363), otherwise a
  list; a failed reply raises RuntimeError("Worker failed with error '<e>', please
  check the stack trace above for the root cause") (:357-361); the worker loop sends
  the exception (:845-870).
- v1/executor/abstract.py:112-118 initialize_from_config(kv_cache_configs), then
  compile_or_warm_up_model on all workers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from vllm.distributed import set_current_rank
from vllm.v1.worker.gpu_worker import make_worker

logger = logging.getLogger("vllm.v1.executor.multiproc_executor")


class MultiprocExecutor:
    def __init__(self, vllm_config: Any, monitor_workers: bool = True) -> None:
        self.vllm_config = vllm_config
        self.world_size = vllm_config.parallel_config.tensor_parallel_size
        self.workers = []
        for rank in range(self.world_size):
            set_current_rank(rank, self.world_size)
            self.workers.append(make_worker(vllm_config, rank))
        self.output_rank = 0
        self.is_failed = False

    def collective_rpc(self, method: str | Callable, timeout: float | None = None,
                       args: tuple = (), kwargs: dict | None = None, non_block: bool = False,
                       unique_reply_rank: int | None = None,
                       kv_output_aggregator: Any = None) -> Any:
        if self.is_failed:
            raise RuntimeError("Executor failed.")
        replies: list[tuple[bool, Any]] = []
        for rank, worker in enumerate(self.workers):
            set_current_rank(rank, self.world_size)
            try:
                func = getattr(worker, method) if isinstance(method, str) else (
                    lambda *a, w=worker, **k: method(w, *a, **k))
                replies.append((True, func(*args, **(kwargs or {}))))
            except Exception as e:  # noqa: BLE001 - the worker process replies with it
                logger.error("WorkerProc hit an exception.")
                replies.append((False, e))
        if unique_reply_rank is not None:
            replies = [replies[unique_reply_rank]]
        responses = []
        for ok, result in replies:
            if not ok:
                raise RuntimeError(f"Worker failed with error '{result}', please check the"
                                   " stack trace above for the root cause")
            responses.append(result)
        return responses[0] if unique_reply_rank is not None else responses

    def execute_model(self, scheduler_output: Any, non_block: bool = False) -> Any:
        return self.collective_rpc("execute_model", args=(scheduler_output,),
                                   unique_reply_rank=self.output_rank, non_block=non_block)

    def sample_tokens(self, grammar_output: Any, non_block: bool = False) -> Any:
        return self.collective_rpc("sample_tokens", args=(grammar_output,),
                                   unique_reply_rank=self.output_rank, non_block=non_block)

    def initialize_from_config(self, kv_cache_configs: list[Any]) -> None:
        self.collective_rpc("initialize_from_config", args=(kv_cache_configs,))
        self.collective_rpc("compile_or_warm_up_model")

    def shutdown(self) -> None:
        self.workers = []
