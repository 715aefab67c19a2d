"""The GPU worker of the real-vLLM tier: the one piece that cannot run here (it needs CUDA,
NCCL and the model's weights). Everything around it is real vLLM 0.16.0: the executor's
RPC loop and the worker-extension mixing (tests/real_vllm_shims.py wires them), and inside
this worker the real InputBatch (gpu_input_batch.py) decides the row order of each step,
in the order of GPUModelRunner._update_states (gpu_model_runner.py:874-1119:
remove, add, condense, reorder, refresh_metadata), with the real reorder of
vllm/v1/attention/backends/utils.py when a backend threshold is set
(EAGLE3_TUI_REORDER_THRESHOLD, as MLA backends set reorder_batch_threshold).

What this file writes itself, following vLLM 0.16.0 (each checked by
tests/test_real_vllm.py against the wheel's source):
- the two-phase step of GPUModelRunner (gpu_model_runner.py:3317-3321: execute_model()
  with state left raises the "State error"; sample_tokens() clears it);
- a toy Llama (model_executor/models/llama.py names: LlamaForCausalLM.model, LlamaModel
  with embed_input_ids / layers / start_layer / end_layer / norm, decoder layers called
  as layer(positions=, hidden_states=, residual=)) whose hidden states depend only on
  token id, position and layer, so any misaligned row shows.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal

import torch
from torch import nn
from vllm.model_executor.models.interfaces import SupportsEagle3
from vllm.sampling_params import SamplingParams
from vllm.v1.attention.backends.utils import reorder_batch_to_split_decodes_and_prefills
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch
from vllm.v1.worker.worker_base import WorkerBase

STATE_ERROR = "State error: sample_tokens() must be called after execute_model() returns None."
HIDDEN = 4


def embed(ids: torch.Tensor) -> torch.Tensor:
    return ids.to(torch.float64)[:, None] * torch.arange(1, HIDDEN + 1, dtype=torch.float64)


class ToyDecoderLayer(nn.Module):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        s = hidden_states if residual is None else hidden_states + residual
        return 0.5 * s + (self.index + 1) * positions.to(torch.float64)[:, None], s


class ToyNorm(nn.Module):
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + residual, x + residual


class LlamaModel(nn.Module):
    def __init__(self, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ToyDecoderLayer(i) for i in range(num_layers))
        self.start_layer, self.end_layer = 0, num_layers
        self.norm = ToyNorm()

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return embed(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                intermediate_tensors: Any = None, inputs_embeds: torch.Tensor | None = None,
                **extra_layer_kwargs: Any) -> torch.Tensor:
        h, r = self.embed_input_ids(input_ids), None
        for layer in self.layers[self.start_layer:self.end_layer]:
            h, r = layer(positions=positions, hidden_states=h, residual=r, **extra_layer_kwargs)
        return self.norm(h, r)[0]


class LlamaForCausalLM(nn.Module, SupportsEagle3):
    supports_eagle3: ClassVar[Literal[True]] = True

    def __init__(self, num_layers: int) -> None:
        super().__init__()
        self.model = LlamaModel(num_layers)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                intermediate_tensors: Any = None, inputs_embeds: Any = None) -> torch.Tensor:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        self.aux_layers = layers

    def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:
        return self.aux_layers


def reference(prompt: list[int], layer_ids: list[int], num_layers: int) -> list[torch.Tensor]:
    """What layer L's capture (hidden_states + residual) holds for `prompt` run alone."""
    out, h, r = {}, embed(torch.tensor(prompt)), None
    pos = torch.arange(len(prompt))
    for i, layer in enumerate(LlamaModel(num_layers).layers):
        h, r = layer(pos, h, r)
        out[i] = h + r
    return [out[i] for i in layer_ids]


class FakeModelRunner:
    def __init__(self, vllm_config: Any) -> None:
        mc, sc = vllm_config.model_config, vllm_config.scheduler_config
        self.block_size = vllm_config.cache_config.block_size
        self.num_layers = mc.hf_config.num_hidden_layers
        self.model = LlamaForCausalLM(self.num_layers)
        self.input_batch = InputBatch(
            max_num_reqs=sc.max_num_seqs, max_model_len=mc.max_model_len,
            max_num_batched_tokens=sc.max_num_batched_tokens, device=torch.device("cpu"),
            pin_memory=False, vocab_size=mc.get_vocab_size(),
            block_sizes=[self.block_size], kernel_block_sizes=[self.block_size])
        self.requests: dict[str, CachedRequestState] = {}
        self.execute_model_state: Any = None
        self.steps = 0
        self.orders: list[list[str]] = []  # the batch order of each step, for the tests
        threshold = os.environ.get("EAGLE3_TUI_REORDER_THRESHOLD")
        self.reorder_batch_threshold = int(threshold) if threshold else None

    def get_kv_cache_spec(self) -> dict[str, FullAttentionSpec]:
        return {f"model.layers.{i}.self_attn.attn": FullAttentionSpec(
            block_size=self.block_size, num_kv_heads=2, head_size=2, dtype=torch.bfloat16)
            for i in range(self.num_layers)}

    def _update_states(self, so: Any) -> None:
        for req_id in so.finished_req_ids:
            self.requests.pop(req_id, None)
            self.input_batch.remove_request(req_id)
        for new in so.scheduled_new_reqs:
            state = CachedRequestState(
                req_id=new.req_id, prompt_token_ids=new.prompt_token_ids,
                mm_features=new.mm_features, sampling_params=new.sampling_params,
                generator=None, block_ids=new.block_ids,
                num_computed_tokens=new.num_computed_tokens, output_token_ids=[])
            self.requests[new.req_id] = state
            self.input_batch.add_request(state)
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            self.requests[req_id].num_computed_tokens = cached.num_computed_tokens[i]
            self.input_batch.num_computed_tokens_cpu[
                self.input_batch.req_id_to_index[req_id]] = cached.num_computed_tokens[i]
        self.input_batch.condense()
        if self.reorder_batch_threshold is not None:
            reorder_batch_to_split_decodes_and_prefills(
                self.input_batch, so, decode_threshold=self.reorder_batch_threshold)
        self.input_batch.refresh_metadata()

    def execute_model(self, so: Any) -> Any:
        if self.execute_model_state is not None:
            raise RuntimeError(STATE_ERROR)
        self._update_states(so)
        if not so.total_num_scheduled_tokens:
            return EMPTY_MODEL_RUNNER_OUTPUT
        ids, pos = [], []
        order = list(self.input_batch.req_ids)
        for req_id in order:
            state, n = self.requests[req_id], so.num_scheduled_tokens[req_id]
            start = state.num_computed_tokens
            ids += state.prompt_token_ids[start:start + n]
            pos += range(start, start + n)
        self.model(input_ids=torch.tensor(ids), positions=torch.tensor(pos))
        self.steps += 1
        self.orders.append(order)
        self.execute_model_state = order
        return None

    def sample_tokens(self, grammar_output: Any) -> Any:
        if self.execute_model_state is None:
            return None
        order, self.execute_model_state = self.execute_model_state, None
        return ModelRunnerOutput(req_ids=order, req_id_to_index={r: i for i, r in enumerate(order)},
                                 sampled_token_ids=[[1] for _ in order])


class FakeWorker(WorkerBase):
    """vllm.v1.worker.gpu_worker.Worker's RPC surface on this path."""

    def __init__(self, vllm_config: Any, local_rank: int, rank: int,
                 distributed_init_method: str, is_driver_worker: bool = False) -> None:
        super().__init__(vllm_config, local_rank, rank, distributed_init_method, is_driver_worker)
        self.model_runner = FakeModelRunner(vllm_config)

    def get_kv_cache_spec(self) -> dict[str, FullAttentionSpec]:
        return self.model_runner.get_kv_cache_spec()

    def initialize_from_config(self, kv_cache_config: Any) -> None:
        self.kv_cache_config = kv_cache_config

    def compile_or_warm_up_model(self) -> float:
        return 0.0

    def execute_model(self, scheduler_output: Any) -> Any:
        return self.model_runner.execute_model(scheduler_output)

    def sample_tokens(self, grammar_output: Any) -> Any:
        return self.model_runner.sample_tokens(grammar_output)

    def runner_report(self) -> dict:
        r = self.model_runner
        return {"requests": sorted(r.requests), "state": r.execute_model_state is not None,
                "steps": r.steps, "orders": r.orders}


def reorder_probe() -> list[str]:
    """The real reorder on a real InputBatch where one request already has computed tokens
    (as it would with prefix caching or a chunked prompt): it is moved to the front."""
    batch = InputBatch(max_num_reqs=4, max_model_len=64, max_num_batched_tokens=64,
                       device=torch.device("cpu"), pin_memory=False, vocab_size=100,
                       block_sizes=[16], kernel_block_sizes=[16])
    scheduled = {}
    for req_id, prompt, computed, n in (("a", [5] * 10, 0, 10), ("b", [6] * 6, 5, 1),
                                        ("c", [7], 0, 1)):
        batch.add_request(CachedRequestState(
            req_id=req_id, prompt_token_ids=prompt, mm_features=[],
            sampling_params=SamplingParams(max_tokens=1, temperature=0.0),
            generator=None, block_ids=([],), num_computed_tokens=computed, output_token_ids=[]))
        scheduled[req_id] = n
    batch.condense()

    class Out:
        num_scheduled_tokens = scheduled

    reorder_batch_to_split_decodes_and_prefills(batch, Out(), decode_threshold=4096)
    return list(batch.req_ids)
