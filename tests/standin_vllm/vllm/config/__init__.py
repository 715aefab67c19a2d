"""STAND-IN for vLLM 0.16 `vllm.config` (tests only; not vLLM).

Follows (vllm-0.16.0 wheel):
- config/utils.py:38-66  every config is a pydantic dataclass with extra="forbid".
- config/scheduler.py:25-55  SchedulerConfig: InitVars `max_model_len` and
  `is_encoder_decoder` have no default (missing -> pydantic ValidationError
  "is_encoder_decoder / Field required [type=missing, ...]").
- config/scheduler.py:76,131  enable_chunked_prefill=True, async_scheduling=None.
- config/scheduler.py:209-290  __post_init__ / verify_max_model_len checks.
- config/cache.py:39-76  CacheConfig: block_size, gpu_memory_utilization=0.9,
  enable_prefix_caching=True (the 0.12 default change); num_gpu_blocks set later.
- config/parallel.py:94,219  ParallelConfig.worker_extension_cls.
- config/vllm.py:604-691  VllmConfig turns async_scheduling None -> True for the
  `mp` backend and logs "Asynchronous scheduling is %s.".
- config/model.py:100  ModelConfig (here: reads num_hidden_layers/hidden_size from the
  model directory's config.json instead of loading a Hugging Face config).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, ClassVar

logger = logging.getLogger("vllm.config")


class ValidationError(ValueError):
    """Shaped like pydantic_core.ValidationError's text (pydantic is not required)."""


class _Config:
    """A pydantic-dataclass-like config: known fields with defaults, required InitVars."""

    FIELDS: ClassVar[dict[str, Any]] = {}
    INITVARS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **kwargs: Any) -> None:
        errors = [f"{k}\n  Field required [type=missing, input_value=ArgsKwargs((), "
                  f"{kwargs!r}), input_type=ArgsKwargs]" for k in self.INITVARS if k not in kwargs]
        errors += [f"{k}\n  Unexpected keyword argument [type=unexpected_keyword_argument, "
                   f"input_value={v!r}, input_type={type(v).__name__}]"
                   for k, v in kwargs.items() if k not in self.FIELDS and k not in self.INITVARS]
        if errors:
            n = len(errors)
            raise ValidationError(f"{n} validation error{'s' if n > 1 else ''} for "
                                  f"{type(self).__name__}\n" + "\n".join(errors))
        for k, default in self.FIELDS.items():
            setattr(self, k, kwargs.get(k, default))
        self._post_init(**{k: kwargs[k] for k in self.INITVARS})

    def _post_init(self, **initvars: Any) -> None:
        pass


class CacheConfig(_Config):
    FIELDS = {"block_size": None, "gpu_memory_utilization": 0.9, "swap_space": 4,
              "cache_dtype": "auto", "num_gpu_blocks_override": None,
              "enable_prefix_caching": True, "prefix_caching_hash_algo": "sha256",
              "mamba_cache_mode": "none", "kv_sharing_fast_prefill": False}

    def _post_init(self) -> None:
        self.num_gpu_blocks: int | None = None


class SchedulerConfig(_Config):
    INITVARS = ("max_model_len", "is_encoder_decoder")
    FIELDS = {"runner_type": "generate", "max_num_batched_tokens": 2048, "max_num_seqs": 128,
              "max_num_partial_prefills": 1, "long_prefill_token_threshold": 0,
              "enable_chunked_prefill": True, "scheduler_cls": None,
              "async_scheduling": None, "policy": "fcfs"}

    def _post_init(self, max_model_len: int, is_encoder_decoder: bool) -> None:
        if is_encoder_decoder:
            self.enable_chunked_prefill = False
        if self.enable_chunked_prefill:
            logger.info("Chunked prefill is enabled with max_num_batched_tokens=%d.",
                        self.max_num_batched_tokens)
        if self.max_num_batched_tokens < max_model_len and not self.enable_chunked_prefill:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) is "
                             f"smaller than max_model_len ({max_model_len}).")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must "
                             f"be greater than or equal to max_num_seqs ({self.max_num_seqs}).")


class ParallelConfig(_Config):
    FIELDS = {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1,
              "distributed_executor_backend": "mp", "worker_extension_cls": ""}


class ModelConfig(_Config):
    FIELDS = {"model": "", "tokenizer": None, "trust_remote_code": False, "dtype": "auto",
              "max_model_len": None, "enforce_eager": False, "seed": 0}

    def _post_init(self) -> None:
        with open(os.path.join(self.model, "config.json"), encoding="utf-8") as f:
            self.hf_config = json.load(f)
        self.max_model_len = self.max_model_len or self.hf_config.get(
            "max_position_embeddings", 2048)


class DeviceConfig(_Config):
    FIELDS = {"device": "auto"}


class LoadConfig(_Config):
    FIELDS = {"load_format": "auto"}


class VllmConfig(_Config):
    FIELDS = {"model_config": None, "cache_config": None, "parallel_config": None,
              "scheduler_config": None, "device_config": None, "load_config": None}

    def _post_init(self) -> None:
        self.cache_config = self.cache_config or CacheConfig()
        self.parallel_config = self.parallel_config or ParallelConfig()
        sched = self.scheduler_config
        if sched is None:
            sched = self.scheduler_config = SchedulerConfig(max_model_len=8192,
                                                            is_encoder_decoder=False)
        if sched.async_scheduling is None:  # config/vllm.py:647-687, backend "mp"
            sched.async_scheduling = self.parallel_config.distributed_executor_backend in (
                "mp", "uni", "external_launcher")
        logger.info("Asynchronous scheduling is %s.",
                    "enabled" if sched.async_scheduling else "disabled")
