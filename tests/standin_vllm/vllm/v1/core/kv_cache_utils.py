"""STAND-IN for vLLM 0.16 `vllm.v1.core.kv_cache_utils` (tests only; not vLLM).

Signatures as in vLLM 0.16:
- v1/core/kv_cache_utils.py:856  _get_kv_cache_groups_uniform_spec(kv_cache_specs)
- v1/core/kv_cache_utils.py:1069 get_kv_cache_config_from_groups(vllm_config,
  kv_cache_groups, available_memory)  -- no `kv_cache_specs` since 0.12, so passing it
  raises TypeError "... got an unexpected keyword argument 'kv_cache_specs'".
- v1/core/kv_cache_utils.py:1148 unify_hybrid_kv_cache_specs(kv_cache_spec)
- v1/core/kv_cache_utils.py:89,555 init_none_hash(hash_fn),
  get_request_block_hasher(block_size, caching_hash_fn)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor

NONE_HASH: bytes = b""


def _get_kv_cache_groups_uniform_spec(kv_cache_specs: dict[str, Any]) -> list[KVCacheGroupSpec]:
    first = next(iter(kv_cache_specs.values()))
    return [KVCacheGroupSpec(list(kv_cache_specs), first)]


def unify_hybrid_kv_cache_specs(kv_cache_spec: dict[str, Any]) -> None:
    if len(set(kv_cache_spec.values())) > 1:
        raise ValueError("Hybrid KV cache specs are not supported by the stand-in")


def get_kv_cache_config_from_groups(vllm_config: Any, kv_cache_groups: list[KVCacheGroupSpec],
                                    available_memory: int) -> KVCacheConfig:
    if not kv_cache_groups:
        return KVCacheConfig(num_blocks=1, kv_cache_groups=kv_cache_groups)
    group_size = max(len(g.layer_names) for g in kv_cache_groups)
    page = kv_cache_groups[0].kv_cache_spec.page_size_bytes
    num_blocks = available_memory // page // group_size
    tensors = [KVCacheTensor(page * num_blocks, [g.layer_names[i] for g in kv_cache_groups])
               for i in range(group_size)]
    return KVCacheConfig(num_blocks, tensors, kv_cache_groups)


def init_none_hash(hash_fn: Callable[[Any], bytes]) -> None:
    global NONE_HASH
    NONE_HASH = hash_fn(None)


def get_request_block_hasher(block_size: int,
                             caching_hash_fn: Callable[[Any], bytes]) -> Callable[[Any], list[bytes]]:
    def hasher(request: Any) -> list[bytes]:
        out, parent = [], NONE_HASH
        ids = request.prompt_token_ids
        for start in range(0, len(ids) - block_size + 1, block_size):
            parent = caching_hash_fn((parent, tuple(ids[start:start + block_size])))
            out.append(parent)
        return out
    return hasher
