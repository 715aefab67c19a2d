"""Train an EAGLE-3 drafter with speculators 0.3.0's own Trainer on an extraction output.

The demo's training job (``eagle3-tui demo --train``): run with the Python of an
environment holding speculators 0.3.0 and transformers < 5, as

    python demo_train_drafter.py DATA_DIR VERIFIER_DIR SAVE_DIR [EPOCHS [MAX_FILES]]

It sets up what a training run needs the way speculators' scripts/train.py does — the
sample-file dataset with its noise transform, the multipack batch sampler and collate
function, Eagle3SpeculatorConfig over the verifier's config, the draft vocabulary from
token_freq.pth — and hands them to ``speculators.train.trainer.Trainer``, whose
``run_training`` prints the log the dashboard reads (rich-formatted INFO lines, a metrics
line per step, a validation pass and a checkpoint save per epoch).

Two things differ from a GPU run, both because this runs on a CPU in seconds: the
trainer's device is "cpu" (its ``local_rank``), and the draft layer's attention is
registered as "cpu_dense_attention" — FlexAttention has no backward on a CPU, so
speculators' own block_mask_to_dense_attention_mask turns the model's BlockMask into a
dense mask for torch's scaled_dot_product_attention (the same masking, computed densely).
Run with TORCH_COMPILE_DISABLE=1: compiling the forward would take minutes on a CPU.
"""

from __future__ import annotations

import os
import sys
from typing import Any

os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")

import torch  # noqa: E402
from speculators.config import SpeculatorsConfig, VerifierConfig  # noqa: E402
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig  # noqa: E402
from speculators.models.eagle3.attention import block_mask_to_dense_attention_mask  # noqa: E402
from speculators.proposals.greedy import GreedyTokenProposalConfig  # noqa: E402
from speculators.train.data import (  # noqa: E402
    Eagle3SampleFileDataset,
    create_collate_fn,
    split_files,
    standardize_data_v1,
)
from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2  # noqa: E402
from speculators.train.logger import setup_metric_logger, setup_root_logger  # noqa: E402
from speculators.train.noise_transforms import AddUniformNoise  # noqa: E402
from speculators.train.trainer import Trainer, TrainerConfig  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from transformers import AutoConfig, LlamaConfig  # noqa: E402
from transformers.modeling_utils import AttentionInterface  # noqa: E402

TOTAL_SEQ_LEN = 128  # a multiple of the BlockMask block (128): the dense mask covers whole blocks
DRAFT_VOCAB = 256
TTT = {"use_off_policy_tokens": False, "ttt_steps": 3, "ttt_step_loss_decay": 1.0}


def cpu_dense_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                        value: torch.Tensor, attention_mask: Any, scaling: float | None = None,
                        **_kwargs: Any) -> tuple[torch.Tensor, None]:
    """The draft layer's attention with the BlockMask made dense (see the docstring)."""
    mask = block_mask_to_dense_attention_mask(attention_mask, query.device, torch.bool)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


# register() is a classmethod (the registry is class-wide): no instance is needed
AttentionInterface.register("cpu_dense_attention", cpu_dense_attention)


def _vocab_maps(freq: dict[int, int], size: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft vocabulary: the ``size`` most frequent target tokens (ties by id, topped
    up with the lowest unused ids), as speculators' Eagle-3 model takes it — ``d2t`` the
    offset from each draft id to its target id, ``t2d`` which target ids are drafted.
    (Computed here: speculators' own helper lives in a module that imports the datasets
    package, which the demo does not need otherwise.)"""
    chosen = sorted(freq, key=lambda t: (-freq[t], t))[:size]
    taken = set(chosen)
    chosen += [t for t in range(vocab) if t not in taken][: size - len(chosen)]
    ids = torch.tensor(sorted(chosen), dtype=torch.long)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(size, dtype=torch.long), t2d


def _model(data_dir: str, verifier: str) -> Eagle3DraftModel:
    token_freq = torch.load(f"{data_dir}/token_freq.pth", weights_only=True)
    vconf = AutoConfig.from_pretrained(verifier)
    d2t, t2d = _vocab_maps(dict(token_freq), DRAFT_VOCAB, vconf.vocab_size)
    layer = LlamaConfig(
        vocab_size=vconf.vocab_size, hidden_size=vconf.hidden_size,
        intermediate_size=vconf.intermediate_size, num_hidden_layers=1,
        num_attention_heads=vconf.num_attention_heads,
        num_key_value_heads=vconf.num_key_value_heads, hidden_act=vconf.hidden_act,
        max_position_embeddings=vconf.max_position_embeddings,
        initializer_range=vconf.initializer_range, rms_norm_eps=vconf.rms_norm_eps,
        head_dim=getattr(vconf, "head_dim", None))
    layer._attn_implementation = "cpu_dense_attention"
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=DRAFT_VOCAB, norm_before_residual=True,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(proposal_type="greedy", speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=verifier, architectures=["LlamaForCausalLM"])))
    return Eagle3DraftModel(config=config, t2d=t2d, d2t=d2t)


def _loader(files: list[str], noise: bool) -> DataLoader[dict[str, Any]]:
    transform = AddUniformNoise(std=0.05, tensors=("hidden_states", "verifier_last_hidden_states"))
    ds = Eagle3SampleFileDataset(file_list=files, max_len=TOTAL_SEQ_LEN, standardize_fn=standardize_data_v1,
                                 transform=transform if noise else None)
    sampler = MultipackDistributedBatchSamplerV2(batch_max_length=TOTAL_SEQ_LEN, lengths=ds.approx_lengths,
                                                 num_replicas=1, rank=0)
    return DataLoader(ds, batch_sampler=sampler, num_workers=0, collate_fn=create_collate_fn(TOTAL_SEQ_LEN))


def main(data_dir: str, verifier: str, save_dir: str, epochs: int, max_files: int = 0) -> None:
    torch.manual_seed(0)
    setup_root_logger()
    setup_metric_logger(loggers=[], run_name="demo", output_dir=save_dir)
    train_files, val_files = split_files(data_dir, ratio=0.9)
    if max_files:  # a demo on a CPU: a few dozen samples make a run of a few dozen steps
        train_files, val_files = train_files[:max_files], val_files[: max(1, max_files // 8)]
    trainer = Trainer(
        _model(data_dir, verifier),
        TrainerConfig(lr=3e-3, num_epochs=epochs, save_path=save_dir, local_rank="cpu",
                      train_call_kwargs=TTT, val_call_kwargs=TTT, scheduler_type="none"),
        _loader(train_files, noise=True), _loader(val_files, noise=False) if val_files else None)
    trainer.run_training()
    print(f"[train] done: {epochs} epochs -> {save_dir}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 3,
         int(sys.argv[5]) if len(sys.argv) > 5 else 0)
