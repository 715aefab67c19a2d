"""STAND-IN for vLLM 0.16 `vllm.distributed` (tests only; not vLLM).

Follows distributed/parallel_state.py:1102 (get_tp_group) and :1121 (get_pp_group):
GroupCoordinator objects with `rank_in_group`, `world_size`, `is_first_rank`,
`is_last_rank`. Here the "current rank" is whichever in-process worker the stand-in
executor is running (set by vllm.v1.executor.multiproc_executor); PP size is 1.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GroupCoordinator:
    rank_in_group: int
    world_size: int

    @property
    def is_first_rank(self) -> bool:
        return self.rank_in_group == 0

    @property
    def is_last_rank(self) -> bool:
        return self.rank_in_group == self.world_size - 1


_current = {"tp_rank": 0, "tp_size": 1}


def set_current_rank(tp_rank: int, tp_size: int) -> None:
    """Stand-in only: which in-process worker is running now."""
    _current.update(tp_rank=tp_rank, tp_size=tp_size)


def get_tp_group() -> GroupCoordinator:
    return GroupCoordinator(_current["tp_rank"], _current["tp_size"])


def get_pp_group() -> GroupCoordinator:
    return GroupCoordinator(0, 1)
