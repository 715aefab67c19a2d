"""STAND-IN for vLLM 0.16 `vllm.v1.core.block_pool` (tests only; not vLLM).

Follows v1/core/block_pool.py:209-238 (BlockPool.cache_full_blocks): with prefix caching
on, caching the full blocks of a request asserts, without a message, that the request
has a hash per full block -- a request made without `block_hasher` has none, so the
scheduler's first schedule() of a prompt >= block_size tokens raises a bare
AssertionError. v1/core/kv_cache_manager.py:483 only caches when enable_caching.
"""

from __future__ import annotations

from typing import Any


class BlockPool:
    def __init__(self, num_gpu_blocks: int, enable_caching: bool, hash_block_size: int,
                 enable_kv_cache_events: bool = False, metrics_collector: Any = None) -> None:
        self.num_free = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size

    def cache_full_blocks(self, request: Any, blocks: list[Any], num_cached_blocks: int,
                          num_full_blocks: int, block_size: int, kv_cache_group_id: int) -> None:
        if num_cached_blocks >= num_full_blocks:
            return
        assert len(request.block_hashes) >= num_full_blocks
