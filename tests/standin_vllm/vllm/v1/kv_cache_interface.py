"""STAND-IN for vLLM 0.16 `vllm.v1.kv_cache_interface` (tests only; not vLLM).

Follows v1/kv_cache_interface.py:20 (KVCacheSpec), :91 (FullAttentionSpec with
`page_size_bytes`), :452 (KVCacheTensor), :462 (KVCacheGroupSpec), :475 (KVCacheConfig).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype_bytes: int = 2

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * self.dtype_bytes


@dataclass
class KVCacheTensor:
    size: int
    shared_by: list[str]


@dataclass
class KVCacheGroupSpec:
    layer_names: list[str]
    kv_cache_spec: FullAttentionSpec


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor] = field(default_factory=list)
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)
