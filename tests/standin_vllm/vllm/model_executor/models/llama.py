"""STAND-IN for vLLM 0.16 `vllm.model_executor.models.llama` (tests only; not vLLM).

A toy, weight-free model with the *shape* of vLLM 0.16's Llama:
- llama.py:506,579-592  LlamaForCausalLM: `.model` is the base model, `embed_input_ids`,
  and forward() calls `self.model(input_ids, positions, intermediate_tensors,
  inputs_embeds)` positionally (so a patched base-model forward receives exactly those).
- llama.py:354,398-440  LlamaModel: `embed_input_ids` (0.11.1 renamed it from
  `get_input_embeddings`, which no longer exists), `layers`, `start_layer`, `end_layer`,
  `norm(hidden, residual)`, forward(..., **extra_layer_kwargs).
- llama.py:252,315  LlamaDecoderLayer.forward(positions, hidden_states, residual)
  returns (hidden_states, residual).

Hidden states are a deterministic function of token id, position and layer with no
mixing between tokens, so `reference_hidden_states` can compute, one sequence at a
time, exactly what a correct capture must return for a batch.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

import torch

HIDDEN = 4
_EMBED = torch.tensor([1.0, -1.0, 0.5, 0.25])


class LlamaDecoderLayer:
    def __init__(self, index: int) -> None:
        self.index = index

    def __call__(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                 residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        residual = hidden_states if residual is None else hidden_states + residual
        pos = positions.to(torch.float32)[:, None]
        return residual * 0.5 + (self.index + 1) + pos * 0.25, residual


class RMSNorm:
    def __call__(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + residual, x + residual


class LlamaModel:
    def __init__(self, num_layers: int) -> None:
        self.layers = [LlamaDecoderLayer(i) for i in range(num_layers)]
        self.start_layer, self.end_layer = 0, num_layers
        self.norm = RMSNorm()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # nn.Module.__call__ -> forward
        return self.forward(*args, **kwargs)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return input_ids.to(torch.float32)[:, None] * _EMBED

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors: Any, inputs_embeds: torch.Tensor | None = None,
                **extra_layer_kwargs: Any) -> torch.Tensor:
        hidden = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        residual = None
        for layer in islice(self.layers, self.start_layer, self.end_layer):
            hidden, residual = layer(positions, hidden, residual, **extra_layer_kwargs)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM:
    supports_eagle3 = True

    def __init__(self, num_layers: int) -> None:
        self.model = LlamaModel(num_layers)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors: Any = None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)


def reference_hidden_states(token_ids: list[int], layer_ids: list[int],
                            num_layers: int) -> list[torch.Tensor]:
    """Stand-in only: for ONE sequence alone, the (hidden + residual) after each layer in
    `layer_ids` (what speculators captures), computed with a fresh, unpatched model."""
    model = LlamaModel(num_layers)
    hidden = model.embed_input_ids(torch.tensor(token_ids))
    positions = torch.arange(len(token_ids))
    residual = None
    out: dict[int, torch.Tensor] = {}
    for layer in model.layers:
        hidden, residual = layer(positions, hidden, residual)
        out[layer.index] = hidden + residual
    return [out[i] for i in layer_ids]
