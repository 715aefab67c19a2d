"""Contract test: the REAL speculators 0.3.0 generator, pristine and at every version of
the bundled patch set, run against the vLLM 0.16 stand-in (tests/standin_vllm).

The files come from the real wheel (tests/spec_wheel.py); each version is built by the
patch engine. What is stubbed, and why:
- `speculators/__init__.py` is an empty stand-in: the real one imports the whole
  library (models, configs), which the generator does not need.
- `torch.cuda.mem_get_info` returns fixed numbers: there is no GPU here.
- `vllm` is the stand-in package (see its README): no GPUs, no NCCL, a toy model.
transformers is real (a tiny local Llama config and a word-level tokenizer).

The pristine file fails with the first error a user meets; each version gets further;
the last returns hidden states that match, per sequence and per layer, what the toy
model computes for each sequence alone -- including a 40-request batch that needs two
scheduler steps (and whose ids would misorder under a string sort).

This is the offline, seconds-long twin of tests/test_real_vllm.py, which runs the same
states against the real vLLM 0.16.0 (a ~500 MB wheel in a cached environment). Why each
line of the latest version is needed, the vllm backend of remote/extract.py and its
preflight per version run only on the real code now (tests/test_real_vllm_contract.py).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import need

torch = need.module("torch", "pip install torch==2.13.0 (the CPU build is enough)")
need.module("transformers", "pip install 'eagle3-tui[demo]'")
tokenizers = need.module("tokenizers", "pip install 'eagle3-tui[demo]' (transformers brings it)")

from tests import spec_wheel  # noqa: E402 - after the modules it needs
from tui.state import patches as P  # noqa: E402
from tui.state.loganalysis.signatures import SignatureSet, load_signatures  # noqa: E402

STANDIN = Path(__file__).resolve().parent / "standin_vllm"
SET = "speculators-0.3.0-vllm-0.16"
NUM_LAYERS = 8
LAYER_IDS = [2, 4, 7]
GEN = "data_generation/vllm_hidden_states_generator.py"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local 'model': a Llama config.json and a word-level tokenizer; no weights."""
    d = tmp_path_factory.mktemp("model")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0, "</s>": 1},
                                                           unk_token="<unk>"))
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "unk_token": "<unk>"}))
    (d / "config.json").write_text(json.dumps(
        {"model_type": "llama", "num_hidden_layers": NUM_LAYERS, "hidden_size": 4,
         "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 8,
         "vocab_size": 2, "bos_token_id": 0, "eos_token_id": 1,
         "max_position_embeddings": 4096}))
    return d


@pytest.fixture(scope="module")
def pset() -> P.PatchSet:
    return P.load_set_dir(P.bundled_sets_dir() / SET)


@pytest.fixture(scope="module")
def pristine() -> dict[str, bytes]:
    return spec_wheel.pristine_files()


@pytest.fixture
def runner(tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """`run(files, batches, tp)`: import the given speculators files fresh, with the stand-in
    `vllm` first on sys.path, build the generator and call generate() per batch."""
    def purge() -> None:
        for name in [m for m in sys.modules if m.split(".")[0] in ("vllm", "speculators")]:
            del sys.modules[name]

    def run(files: dict[str, bytes], batches: list[list[list[int]]], tp: int = 1) -> Any:
        purge()
        root = tmp_path / f"site{len(list(tmp_path.iterdir()))}"
        spec_wheel.speculators_site(root, files)
        monkeypatch.syspath_prepend(str(root))
        monkeypatch.syspath_prepend(str(STANDIN))
        import vllm
        from speculators.data_generation.vllm_hidden_states_generator import (
            VllmHiddenStatesGenerator,
        )

        assert vllm.__version__.endswith("+standin")  # the stand-in, never a real vLLM
        gen = VllmHiddenStatesGenerator(str(model_dir), layer_ids=LAYER_IDS,
                                        tensor_parallel_size=tp)
        gen.results = [gen.generate(b) for b in batches]
        return gen

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (16 << 30, 80 << 30))
    yield run
    purge()


def batch(n: int, seed: int, length: int | None = None) -> list[list[int]]:
    """n distinct prompts; lengths vary across the 16-token block size unless fixed."""
    return [[2 + (seed * 997 + j * 131 + k * 7) % 5000 for k in range(length or 5 + (j * 7) % 29)]
            for j in range(n)]


SMALL = batch(5, 1)  # one scheduler step
BIG = batch(40, 2)  # > max_num_seqs (32): two steps; ids req_1_0..req_1_39


def check_aligned(prompts: list[list[int]], results: list[dict]) -> None:
    from vllm.model_executor.models.llama import reference_hidden_states

    assert len(results) == len(prompts)
    for prompt, res in zip(prompts, results):
        assert res["input_ids"].tolist() == prompt
        want = reference_hidden_states(prompt, LAYER_IDS, NUM_LAYERS)
        assert len(res["hidden_states"]) == len(LAYER_IDS)
        for got, exp in zip(res["hidden_states"], want):
            assert torch.equal(got, exp)


# The error each state ends with, in the order a user meets them.
EXPECTED = [
    ("pristine", "ValidationError", "1 validation error for SchedulerConfig\nis_encoder_decoder\n  Field required"),
    ("v1", "TypeError", "get_kv_cache_config_from_groups() got an unexpected keyword argument 'kv_cache_specs'"),
    ("v2", "RuntimeError", "Worker failed with error ''LlamaModel' object has no attribute 'get_input_embeddings''"),
    ("v3", "RuntimeError", "Boolean value of Tensor with more than one value is ambiguous"),
    ("v4", "RuntimeError",
     "Worker failed with error 'State error: sample_tokens() must be called after execute_model() returns None.'"),
]


def test_each_version_gets_further(runner: Any, pset: P.PatchSet,
                                   pristine: dict[str, bytes]) -> None:
    assert [name for name, _, _ in EXPECTED] == ["pristine"] + P.version_order(pset)[:-1]
    sigs = SignatureSet.build(load_signatures(user_file=None))
    for i, (state, exc_type, text) in enumerate(EXPECTED):
        files = P.build_version(pset, state, pristine)
        with pytest.raises(Exception) as info:
            runner(files, [SMALL, BIG])
        assert type(info.value).__name__ == exc_type, (state, info.value)
        assert text in str(info.value), (state, str(info.value))
        # The failure is recognised, and the next version says it fixes it.
        # (Signatures match log lines, so try the message line by line.)
        hits = [h for h in map(sigs.match, str(info.value).splitlines()) if h is not None]
        assert hits, (state, str(info.value))
        assert hits[0][0].id in pset.versions[i].fixes, (state, hits[0][0].id, pset.versions[i].name)


def test_latest_returns_aligned_hidden_states(runner: Any, pset: P.PatchSet,
                                              pristine: dict[str, bytes]) -> None:
    gen = runner(P.build_version(pset, "latest", pristine), [SMALL, BIG, SMALL], tp=2)
    for prompts, results in zip([SMALL, BIG, SMALL], gen.results):
        check_aligned(prompts, results)
    sched = gen.vllm_config.scheduler_config
    assert sched.async_scheduling is False and sched.enable_chunked_prefill is False
    assert gen.vllm_config.cache_config.enable_prefix_caching is False
    for worker in gen.executor.workers:
        # Every finished request reached the workers: no request table left behind.
        assert worker.model_runner.requests == {}
        assert worker.model_runner.execute_model_state is None
    assert gen.executor.workers[0].model_runner.steps == 1 + 2 + 1
