"""extract.py's vLLM backend: speculators 0.3.0's VllmHiddenStatesGenerator (tensor
parallel), its results checked for alignment and shape before anything is written.
Stdlib only at import; speculators, vLLM and torch are imported when it is used."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Sequence, Tuple

from remote.base.wire import one_line
from remote.extraction.common import Fail, Sample

# speculators 0.3.0 batches at most this many sequences and this many tokens
# (max(8192, max_model_len)); more would make vLLM chunk the prefill, which 0.3.0's
# generator silently corrupts (speculators #279).
VLLM_MAX_SEQS = 32
VLLM_MIN_BATCH_TOKENS = 8192


class VllmBackend:
    """speculators 0.3.0's VllmHiddenStatesGenerator, with its results checked for shape."""

    def __init__(self, model_dir: Path, layers: List[int], hidden: int, dtype: str, tp: int,
                 max_seq_len: int) -> None:
        import torch

        self.torch = torch
        self.model_dir = model_dir
        self.layers = layers
        self.hidden = hidden
        self.dtype = getattr(torch, dtype)
        self.tp = tp
        self.max_seq_len = max_seq_len
        self.gen: Any = None

    def load(self) -> None:
        try:
            from speculators.data_generation.vllm_hidden_states_generator import (
                VllmHiddenStatesGenerator,
            )
        except ImportError as exc:
            raise Fail("the vllm backend needs speculators and vllm: %s" % one_line(exc)) from None
        # generate() truncates prompts to max_model_len - 1; +1 keeps ours whole.
        self.gen = VllmHiddenStatesGenerator(
            model_path=str(self.model_dir),
            layer_ids=list(self.layers),
            max_model_len=self.max_seq_len + 1,
            tensor_parallel_size=self.tp,
        )

    def warm_up(self, batch: Sequence[Sample], buffer_sets: int) -> None:
        """Nothing: vLLM warms itself up while it loads."""

    def extract(self, batch: Sequence[Sample]) -> Tuple[List[List[Any]], Any]:
        results = self.gen.generate([list(s.ids) for s in batch])
        if len(results) != len(batch):
            raise Fail("generator returned %d results for %d sequences"
                       % (len(results), len(batch)), 3)
        out = []
        for j, (res, s) in enumerate(zip(results, batch)):
            got_ids = res["input_ids"].tolist()
            hs = res["hidden_states"]
            # A reply-shape mismatch (the `[0]` of 0.3.0 on vLLM >= 0.11.1) yields token
            # rows instead of layers: refuse it rather than write wrong training data.
            if got_ids != list(s.ids):
                raise Fail("generator result %d is not aligned with its input ids" % j, 3)
            if len(hs) != len(self.layers) or any(
                    tuple(h.shape) != (len(s.ids), self.hidden) for h in hs):
                shapes = [tuple(h.shape) for h in hs][:3]
                raise Fail("generator result %d has layer shapes %s, expected %d x (%d, %d)"
                           % (j, shapes, len(self.layers), len(s.ids), self.hidden), 3)
            out.append([h.to("cpu", self.dtype).contiguous() for h in hs])
        return out, None

