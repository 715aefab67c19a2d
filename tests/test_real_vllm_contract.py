"""The real-vLLM tier, continued: why each line of the latest patch version is there, and
remote/extract.py's vllm backend and preflight, all on the real vLLM 0.16.0 code (issue 16).

These ran against the stand-in (tests/standin_vllm) until session 20; the real tier
(tests/real_vllm.py: vLLM 0.16.0 installed --no-deps into a cached environment, with
only the GPU worker of tests/real_vllm_worker.py and the lines of
tests/real_vllm_shims.py not vLLM's) now runs them against the real Scheduler,
KV-cache manager, executor and config classes. extract.py runs as a subprocess whose
sitecustomize imports the shims, so it meets the same fake GPU worker.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import real_vllm, spec_wheel
from tests.test_real_vllm import GEN, NUM_LAYERS, SMALL, drive, model_dir, pset, site
from tui.state import patches as P

__all__ = ["model_dir", "pset", "site"]  # fixtures shared with tests/test_real_vllm.py

ROOT = Path(__file__).resolve().parent.parent
EXTRACT = ROOT / "remote" / "extract.py"
tier = pytest.mark.real_vllm
pytestmark = pytest.mark.slow(timeout=1200, reason="the first test builds the real vLLM 0.16.0 env (pip, ~0.7 GB; "
                              "a 900 s bound) without its cache, then drives vLLM in subprocesses (600-900 s bounds)")


def _without(files: dict[str, bytes], needle: str) -> dict[str, bytes]:
    """The files with the one line of the generator containing `needle` removed."""
    lines = files[GEN].decode().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if needle in line]
    assert len(hits) == 1, needle
    del lines[hits[0]]
    return {**files, GEN: "".join(lines).encode()}


@tier
def test_each_line_of_the_latest_is_needed_on_real_vllm(site: Path, tmp_path: Path, model_dir: Path,
                                                         pset: P.PatchSet) -> None:
    """Remove one line of the latest version at a time: the real code fails the way a GPU
    host would (prefix caching, block_size), or leaks every request in the workers (the
    final step that carries finished_req_ids)."""
    latest = P.build_version(pset, "latest", spec_wheel.pristine_files())
    text = latest[GEN].decode()
    no_final = text.replace("        if scheduler_output.finished_req_ids:\n"
                            "            self._step(scheduler_output)\n", "")
    assert no_final != text
    states = {"no-prefix-caching": _without(latest, "enable_prefix_caching=False"),
              "no-block-size": _without(latest, "block_size=self.vllm_config"),
              "no-final-step": {**latest, GEN: no_final.encode()}}
    res = drive(site, tmp_path, model_dir, states, [SMALL], tp=1)
    r = res["no-prefix-caching"]
    assert not r["ok"] and r["exc_type"] == "AssertionError", r
    assert r["raised_at"].startswith("vllm/v1/core/block_pool.py:"), r
    r = res["no-block-size"]
    assert not r["ok"] and r["exc_type"] == "TypeError" and "block_size" in r["message"], r
    r = res["no-final-step"]
    assert r["ok"] and r["aligned"] == [True], r
    (w,) = r["workers"]
    assert sorted(w["requests"]) == sorted(f"req_0_{i}" for i in range(len(SMALL)))


@tier
def test_chunked_prefill_would_misalign_and_the_guard_says_so(
        site: Path, tmp_path: Path, model_dir: Path, pset: P.PatchSet) -> None:
    """5 prompts of 2000 tokens exceed the 8192-token step budget: with chunked prefill
    off (the latest version) the real scheduler takes them whole, over two steps, and the
    rows align; with it on, prompts are split across steps and the generator's guard
    refuses the captured rows."""
    from tests.test_real_vllm import batch

    latest = P.build_version(pset, "latest", spec_wheel.pristine_files())
    states = {"latest": latest, "chunked": _without(latest, "enable_chunked_prefill=False")}
    res = drive(site, tmp_path, model_dir, states, [batch(5, 3, length=2000)], tp=1)
    assert res["latest"]["ok"] and res["latest"]["aligned"] == [True], res["latest"]
    r = res["chunked"]
    assert not r["ok"] and "Captured hidden states do not match the batch" in r["message"], r


# ------------------------------------------------------------------ remote/extract.py

def _site(root: Path, version: str) -> Path:
    """The real speculators 0.3.0 files at `version`, plus a sitecustomize that loads the
    real tier's shims (no GPU here) before extract.py imports vLLM."""
    pristine = spec_wheel.pristine_files()
    pset_ = P.load_set_dir(P.bundled_sets_dir() / "speculators-0.3.0-vllm-0.16")
    files = pristine if version == "pristine" else P.build_version(pset_, version, pristine)
    spec_wheel.speculators_site(root, files)
    (root / "sitecustomize.py").write_text("import tests.real_vllm_shims  # noqa: F401\n")
    return root


def _run(vsite: Path, site_: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = real_vllm.env(site_)
    env["PYTHONPATH"] = str(vsite) + ":" + env["PYTHONPATH"]
    return subprocess.run([sys.executable, str(EXTRACT), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


# The checks each patch version still fails on the real vLLM 0.16.0, in the order users meet them.
STILL_FAILING = {
    "v1": {"Scheduler.__init__", "get_kv_cache_config_from_groups", "sample_tokens",
           "collective_rpc reply", "custom_worker embeddings"},
    "v2": {"sample_tokens", "collective_rpc reply", "custom_worker embeddings"},
    "v3": {"sample_tokens", "collective_rpc reply"},
    "v4": {"sample_tokens"},
}


@tier
def test_preflight_names_what_each_version_still_breaks_on_real_vllm(site: Path, tmp_path: Path) -> None:
    """extract.py --preflight against the real installed 0.16.0 for the versions between
    pristine and latest (those two: tests/test_real_vllm.py)."""
    for version, want in STILL_FAILING.items():
        vsite = _site(tmp_path / version, version)
        proc = _run(vsite, site, "--preflight", "--generator-file", str(vsite / "speculators" / GEN))
        lines = [x for x in proc.stdout.splitlines() if x.startswith("[preflight]")]  # vLLM logs too
        assert all(re.match(r"^\[preflight\] (ok|FAIL) [^:]+: .+$", x) for x in lines[:-1]), proc.stdout
        failed = {m[1] for x in lines if (m := re.match(r"^\[preflight\] FAIL ([^:]+):", x))}
        assert "ok import vllm: vllm 0.16.0 at " in proc.stdout, proc.stdout + proc.stderr[-2000:]
        assert failed == want, (version, proc.stdout)
        assert proc.returncode == 1 and lines[-1].startswith("[preflight] FAILED")


def _model(d: Path) -> Path:
    from tokenizers import Tokenizer, models

    d.mkdir()
    Tokenizer(models.WordLevel({"<unk>": 0, "</s>": 1}, unk_token="<unk>")).save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "unk_token": "<unk>"}))
    (d / "config.json").write_text(json.dumps(
        {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": NUM_LAYERS,
         "hidden_size": 4, "vocab_size": 6000, "num_attention_heads": 2, "num_key_value_heads": 2,
         "intermediate_size": 8, "bos_token_id": 0, "eos_token_id": 1, "max_position_embeddings": 4096}))
    return d


# float32 files against the float64 toy model: equal to float32 precision (a misaligned row
# differs by whole tokens or positions, far beyond it)
CHECK = r"""
import json, sys, torch
from tests.real_vllm_worker import reference
out, prompts, layers, n = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
bad = []
for i, ids in enumerate(prompts):
    d = torch.load(f"{out}/data_{i}.pt", weights_only=True)
    want = reference(ids, layers, n)
    if d["input_ids"].tolist() != ids or len(d["hidden_states"]) != len(want) or not all(
            torch.allclose(h.to(torch.float64), w, rtol=1e-6, atol=0) for h, w in zip(d["hidden_states"], want)):
        bad.append(i)
print(json.dumps(bad))
"""


@tier
def test_vllm_backend_on_real_vllm(site: Path, tmp_path: Path) -> None:
    """extract.py --backend vllm drives the latest-patched real generator on real vLLM,
    TP=2, 11 prompts in batches of 4: one file per prompt, in input order, each layer equal
    to what the toy model computes for that prompt alone."""
    vsite = _site(tmp_path / "site", "v5")
    model = _model(tmp_path / "model")
    prompts = [[2 + (j * 131 + k * 7) % 5000 for k in range(5 + (j * 7) % 29)] for j in range(11)]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"input_ids": p}) + "\n" for p in prompts))
    out = tmp_path / "out"
    proc = _run(vsite, site, "--backend", "vllm", "--model", str(model), "--data", str(data),
                "--out", str(out), "--tp", "2", "--batch-size", "4", "--dtype", "float32")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "[preflight] all " in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("[extract] done: 11 sequences")
    config = json.loads((out / "data_config.json").read_text())
    layers = config["hidden_states"]["layer_ids"]
    assert layers == [2, 4, 5, 7] and config["model"]["hidden_size"] == 4
    assert config["generator"].endswith("--backend vllm")
    assert sorted(p.name for p in out.glob("data_*.pt")) == sorted(f"data_{i}.pt" for i in range(11))
    check = subprocess.run([sys.executable, "-c", CHECK, str(out), json.dumps(prompts), json.dumps(layers),
                            str(NUM_LAYERS)], capture_output=True, text=True, timeout=300,
                           env=real_vllm.env(site), check=False)
    assert check.returncode == 0 and json.loads(check.stdout) == [], check.stdout + check.stderr[-2000:]


@tier
def test_vllm_backend_refuses_to_load_when_preflight_fails_on_real_vllm(site: Path, tmp_path: Path) -> None:
    vsite = _site(tmp_path / "site", "v4")
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"input_ids": [5, 6, 7]}) + "\n")
    proc = _run(vsite, site, "--backend", "vllm", "--model", str(_model(tmp_path / "model")),
                "--data", str(data), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    assert "[preflight] FAIL sample_tokens" in proc.stdout
    assert not list((tmp_path / "out").glob("data_*"))
