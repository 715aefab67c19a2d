"""remote/extraction/hf.py hands transformers a ready 4-D attention mask (so that on CUDA
nothing is read back from the GPU per batch): a padded batch's layer outputs equal each
sequence's own forward pass, for both attentions that take it (sdpa, eager)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import need

torch = need.module("torch", "pip install 'eagle3-tui[demo]'")
transformers = need.module("transformers", "pip install 'eagle3-tui[demo]'")

from remote.extraction.common import Sample  # noqa: E402
from remote.extraction.hf import HfBackend  # noqa: E402


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_padded_batch_equals_lone_forwards(impl: str) -> None:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=100, attn_implementation=impl)
    model = transformers.LlamaForCausalLM(cfg).eval()
    layers = [1, 2]  # not the last: transformers' own last hidden state is after the norm
    backend = HfBackend(Path("unused"), layers, "cpu", "float32", 0.0)
    backend.model = model
    assert isinstance(backend._mask([9, 5, 1], 9), torch.Tensor)  # the 4-D path is taken
    samples = [Sample([(7 * n + t) % 100 for t in range(n)], None) for n in (9, 5, 1)]
    out, ready = backend.extract(samples)
    assert ready is None
    for s, got in zip(samples, out):
        with torch.inference_mode():
            ref = model.model(torch.tensor([s.ids]), output_hidden_states=True).hidden_states
        for k, L in enumerate(layers):
            assert got[k].shape == (len(s.ids), 64)
            torch.testing.assert_close(got[k], ref[L + 1][0], rtol=1e-5, atol=1e-5)
