"""STAND-IN for vLLM 0.16 `vllm.v1.worker.gpu_worker` (tests only; not vLLM).

Follows v1/worker/gpu_worker.py:396 get_kv_cache_spec, :413 initialize_from_config,
:433 compile_or_warm_up_model, :598-610 sample_tokens / execute_model (delegating to the
model runner), and v1/worker/worker_base.py:258-284 (the worker_extension_cls is added
to the worker class's bases so its methods are collective_rpc targets) and :312
(WorkerWrapperBase.initialize_from_config picks this rank's config from the list).
"""

from __future__ import annotations

import importlib
from typing import Any

from vllm.v1.worker.gpu_model_runner import GPUModelRunner


class Worker:
    def __init__(self, vllm_config: Any, local_rank: int, rank: int,
                 distributed_init_method: str, is_driver_worker: bool = False) -> None:
        self.vllm_config = vllm_config
        self.rank = rank
        self.model_runner = GPUModelRunner(vllm_config, "cpu")
        self.kv_cache_config: Any = None

    def get_kv_cache_spec(self) -> dict[str, Any]:
        return self.model_runner.get_kv_cache_spec()

    def initialize_from_config(self, kv_cache_config: Any) -> None:
        # The executor sends the list; vLLM's WorkerWrapperBase picks this rank's entry.
        self.kv_cache_config = kv_cache_config[self.rank]

    def compile_or_warm_up_model(self) -> None:
        pass

    def execute_model(self, scheduler_output: Any) -> Any:
        return self.model_runner.execute_model(scheduler_output)

    def sample_tokens(self, grammar_output: Any) -> Any:
        return self.model_runner.sample_tokens(grammar_output)


def make_worker(vllm_config: Any, rank: int) -> Worker:
    """Build a worker with the configured extension class mixed in."""
    qualname = vllm_config.parallel_config.worker_extension_cls
    cls: type = Worker
    if qualname:
        module, _, name = qualname.rpartition(".")
        ext = getattr(importlib.import_module(module), name)
        cls = type("Worker", (Worker, ext), {})
    return cls(vllm_config, rank, rank, "inproc://", rank == 0)
