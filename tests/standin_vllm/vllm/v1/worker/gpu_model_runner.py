"""STAND-IN for vLLM 0.16 `vllm.v1.worker.gpu_model_runner` (tests only; not vLLM).

Follows (vllm-0.16.0 wheel):
- v1/worker/gpu_model_runner.py:313  ExecuteModelState, kept between the two phases.
- :874-895 _update_states: drop `finished_req_ids` from `self.requests` (the only place
  they leave it), drop unscheduled requests from the batch, add new ones.
- v1/worker/gpu_input_batch.py:304 add_request fills the lowest freed slot
  (logits_processor/state.py:102) and :626 condense() moves the last requests into
  holes -- the row order of a step's tokens is the batch order.
- :3312-3321 execute_model raises "State error: sample_tokens() must be called after
  execute_model() returns None." while a previous step's state is still held;
  :3364-3366 a step with 0 scheduled tokens returns EMPTY_MODEL_RUNNER_OUTPUT and keeps
  no state; :3605-3618 otherwise it stores the state and returns None.
- :3621-3657 sample_tokens(grammar_output) returns None when no state is held, else
  consumes and clears it and returns a ModelRunnerOutput.
The model is the toy in vllm.model_executor.models.llama (CPU tensors).
"""

from __future__ import annotations

from typing import Any

import torch

from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput


class GPUModelRunner:
    def __init__(self, vllm_config: Any, device: Any) -> None:
        self.vllm_config = vllm_config
        self.block_size = vllm_config.cache_config.block_size
        self.num_layers = int(vllm_config.model_config.hf_config["num_hidden_layers"])
        self.model = LlamaForCausalLM(self.num_layers)
        self.requests: dict[str, dict[str, Any]] = {}  # req_id -> {prompt, computed}
        self.batch: list[str | None] = []  # the persistent input batch, by slot
        self.execute_model_state: Any = None
        self.steps = 0

    def get_kv_cache_spec(self) -> dict[str, FullAttentionSpec]:
        spec = FullAttentionSpec(self.block_size, num_kv_heads=2, head_size=8)
        return {f"model.layers.{i}.self_attn.attn": spec for i in range(self.num_layers)}

    def _remove(self, req_id: str) -> None:
        if req_id in self.batch:
            self.batch[self.batch.index(req_id)] = None

    def _update_states(self, scheduler_output: Any) -> None:
        so = scheduler_output
        for rid in so.finished_req_ids:
            self.requests.pop(rid, None)
            self._remove(rid)
        for rid in [r for r in self.batch if r is not None]:
            if rid not in so.num_scheduled_tokens:
                self._remove(rid)
        for new in so.scheduled_new_reqs:
            self.requests[new.req_id] = {"prompt": new.prompt_token_ids,
                                         "computed": new.num_computed_tokens}
            slot = self.batch.index(None) if None in self.batch else len(self.batch)
            self.batch[slot:slot + 1] = [new.req_id]
        for rid, computed in zip(so.scheduled_cached_reqs.req_ids,
                                 so.scheduled_cached_reqs.num_computed_tokens):
            self.requests[rid]["computed"] = computed
            if rid not in self.batch:
                slot = self.batch.index(None) if None in self.batch else len(self.batch)
                self.batch[slot:slot + 1] = [rid]
        while None in self.batch:  # condense: the last request moves into the first hole
            last = self.batch.pop()
            if last is not None:
                self.batch[self.batch.index(None)] = last

    def execute_model(self, scheduler_output: Any, intermediate_tensors: Any = None) -> Any:
        if self.execute_model_state is not None:
            raise RuntimeError("State error: sample_tokens() must be called "
                               "after execute_model() returns None.")
        self._update_states(scheduler_output)
        if not scheduler_output.total_num_scheduled_tokens:
            return EMPTY_MODEL_RUNNER_OUTPUT
        ids: list[int] = []
        pos: list[int] = []
        for rid in self.batch:
            n = scheduler_output.num_scheduled_tokens[rid]
            req = self.requests[rid]
            start = req["computed"]
            ids += req["prompt"][start:start + n]
            pos += range(start, start + n)
            req["computed"] = start + n
        hidden = self.model(input_ids=torch.tensor(ids), positions=torch.tensor(pos),
                            intermediate_tensors=None, inputs_embeds=None)
        self.steps += 1
        self.execute_model_state = (scheduler_output, hidden, list(self.batch))
        return None

    def sample_tokens(self, grammar_output: Any) -> ModelRunnerOutput | None:
        if self.execute_model_state is None:
            return None
        _, _, batch = self.execute_model_state
        self.execute_model_state = None
        return ModelRunnerOutput(batch, {r: i for i, r in enumerate(batch)}, [[0] for _ in batch])
