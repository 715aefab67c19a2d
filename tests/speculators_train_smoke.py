"""Train speculators 0.3.0's Eagle-3 draft model on extract.py's output, on CPU.

Run by tests/test_speculators_train.py with the Python of an environment that holds the
real speculators 0.3.0 package (and the transformers < 5 it was written for):

    python speculators_train_smoke.py DATA_DIR VERIFIER_DIR STEPS

Sets things up as speculators' scripts/train.py (v0.3.0) does -- split_files, the
sample-file dataset with its noise transform, the multipack batch sampler, the collate
function, Eagle3SpeculatorConfig over the verifier's config, the vocabulary mapping from
token_freq.pth -- then runs the trainer's step (forward with loss, backward, clip,
AdamW) STEPS times on CPU and prints one JSON line: the losses.

One stand-in: FlexAttention has no backward on CPU, so the draft layer's attention is
registered here as "cpu_dense_attention": speculators' own block_mask_to_dense_attention_mask
turns the model's BlockMask into a dense mask for torch's scaled_dot_product_attention
(the same masking, computed densely). Run with TORCH_COMPILE_DISABLE=1: the forward's
@torch.compile would spend minutes compiling on a CPU; eager runs the same code.
"""

from __future__ import annotations

import json
import sys

import torch
from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
from speculators.models.eagle3.attention import block_mask_to_dense_attention_mask
from speculators.proposals.greedy import GreedyTokenProposalConfig
from speculators.train.data import (
    Eagle3SampleFileDataset,
    create_collate_fn,
    split_files,
    standardize_data_v1,
)
from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2
from speculators.train.noise_transforms import AddUniformNoise
from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution
from torch.utils.data import DataLoader
from transformers import AutoConfig, LlamaConfig
from transformers.modeling_utils import AttentionInterface

TOTAL_SEQ_LEN = 128
DRAFT_VOCAB = 256


def cpu_dense_attention(module, query, key, value, attention_mask, scaling=None, **_kwargs):
    """speculators' flex_attention_forward, with the BlockMask made dense (see above)."""
    mask = block_mask_to_dense_attention_mask(attention_mask, query.device, torch.bool)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


AttentionInterface().register("cpu_dense_attention", cpu_dense_attention)


def main(data_dir: str, verifier: str, steps: int) -> None:
    torch.manual_seed(0)
    token_freq = torch.load(f"{data_dir}/token_freq.pth", weights_only=True)
    vconf = AutoConfig.from_pretrained(verifier)
    d2t, t2d = build_vocab_mappings_from_distribution(token_freq, DRAFT_VOCAB, vconf.vocab_size)
    layer_config = LlamaConfig(
        vocab_size=vconf.vocab_size, hidden_size=vconf.hidden_size,
        intermediate_size=vconf.intermediate_size, num_hidden_layers=1,
        num_attention_heads=vconf.num_attention_heads,
        num_key_value_heads=vconf.num_key_value_heads, hidden_act=vconf.hidden_act,
        max_position_embeddings=vconf.max_position_embeddings,
        initializer_range=vconf.initializer_range, rms_norm_eps=vconf.rms_norm_eps,
        head_dim=getattr(vconf, "head_dim", None))
    # scripts/train.py sets "simple_flex_attention"; see the module docstring
    layer_config._attn_implementation = "cpu_dense_attention"
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config, draft_vocab_size=DRAFT_VOCAB,
        norm_before_residual=True,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(proposal_type="greedy",
                                                        speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=verifier, architectures=["LlamaForCausalLM"])))
    model = Eagle3DraftModel(config=config, t2d=t2d, d2t=d2t)

    train_files, _val_files = split_files(data_dir, ratio=0.9)
    dataset = Eagle3SampleFileDataset(
        file_list=train_files, max_len=TOTAL_SEQ_LEN, standardize_fn=standardize_data_v1,
        transform=AddUniformNoise(std=0.05, tensors=("hidden_states",
                                                     "verifier_last_hidden_states")))
    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=TOTAL_SEQ_LEN, lengths=dataset.approx_lengths, num_replicas=1, rank=0)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=0,
                        collate_fn=create_collate_fn(TOTAL_SEQ_LEN))

    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    losses: list[float] = []
    epoch = 0
    while len(losses) < steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            _draft, loss, _metrics = model(**batch, use_off_policy_tokens=False, ttt_steps=3,
                                           ttt_step_loss_decay=1.0)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            if len(losses) == steps:
                break
        epoch += 1
    print(json.dumps({"losses": losses, "train_files": len(train_files)}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
