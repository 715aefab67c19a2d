"""The real-vLLM tier: the patch set and the preflight against the real vLLM 0.16.0 code.

The environment (tests/real_vllm.py) is vLLM 0.16.0 installed --no-deps into a cached
directory; everything runs in subprocesses that see it first. What does not run here
(GPU worker processes, CUDA kernels, NVML) is replaced by the lines of
tests/real_vllm_shims.py and the worker of tests/real_vllm_worker.py; the generator,
config classes, Scheduler, KV-cache manager, Request, StructuredOutputManager,
MultiprocExecutor's RPC and error wrapping, WorkerProc's busy loop, WorkerWrapperBase's
extension mixing and the InputBatch that orders each step's rows are vLLM's own.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import need, real_vllm, spec_wheel
from tests.test_patch_contract import EXPECTED, SET, batch
from tui.state import patches as P
from tui.state.loganalysis.signatures import SignatureSet, load_signatures
from tui.transport.bundle import agent_files

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "real_vllm_driver.py"
PREFLIGHT = ROOT / "remote" / "extraction" / "preflight.py"
GEN = "data_generation/vllm_hidden_states_generator.py"
NUM_LAYERS, LAYER_IDS = 8, [2, 4, 7]
SMALL, BIG = batch(5, 1), batch(40, 2)  # BIG: > max_num_seqs (32), two scheduler steps
# Where each state's failure is raised on the real code (file:line in vLLM 0.16.0 or in
# the speculators file that calls it).
RAISED_AT = {
    "pristine": "pydantic/",  # SchedulerConfig(...) validation, at the generator's call
    "v1": "speculators/data_generation/vllm_hidden_states_generator.py:136",
    "v2": "vllm/v1/executor/multiproc_executor.py:358",  # "Worker failed with error"
    "v3": "speculators/data_generation/vllm_hidden_states_generator.py:286",
    "v4": "vllm/v1/executor/multiproc_executor.py:358",
}

tier = pytest.mark.real_vllm
pytestmark = pytest.mark.slow(timeout=1200, reason="the first test builds the real vLLM 0.16.0 env (pip, ~0.7 GB; "
                              "a 900 s bound) without its cache, then drives vLLM in subprocesses (600-900 s bounds)")


@pytest.fixture(scope="session")
def site() -> Path:
    return real_vllm.ensure()


@pytest.fixture(scope="module")
def pset() -> P.PatchSet:
    return P.load_set_dir(P.bundled_sets_dir() / SET)




@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local Llama config and word-level tokenizer; no weights (the worker is fake)."""
    tokenizers = need.module("tokenizers", "pip install 'eagle3-tui[demo]' (transformers brings it)")
    d = tmp_path_factory.mktemp("model")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0, "</s>": 1},
                                                           unk_token="<unk>"))
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "unk_token": "<unk>"}))
    (d / "config.json").write_text(json.dumps(
        {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
         "num_hidden_layers": NUM_LAYERS, "hidden_size": 4, "num_attention_heads": 2,
         "num_key_value_heads": 2, "intermediate_size": 8, "vocab_size": 6000,
         "bos_token_id": 0, "eos_token_id": 1, "max_position_embeddings": 4096}))
    return d


def drive(site: Path, tmp: Path, model: Path, states: dict[str, dict[str, bytes]],
          batches: list[list[list[int]]], tp: int, probe: bool = False,
          **env: str) -> dict[str, Any]:
    spec = {"model": str(model), "tp": tp, "layer_ids": LAYER_IDS, "num_layers": NUM_LAYERS,
            "batches": batches, "reorder_probe": probe,
            "states": [{"name": n, "site": str(spec_wheel.speculators_site(tmp / n, f))}
                       for n, f in states.items()]}
    (tmp / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, str(DRIVER), str(tmp / "spec.json")],
                          capture_output=True, text=True, timeout=900,
                          env=real_vllm.env(site, **env), check=False)
    out: dict[str, Any] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            out[r["state"]] = r
        elif line.startswith("PROBE "):
            out["probe"] = json.loads(line[6:])
    assert proc.returncode == 0 and len(out) == len(states) + probe, proc.stderr[-3000:]
    return out


@tier
def test_each_version_on_real_vllm(site: Path, tmp_path: Path, model_dir: Path,
                                   pset: P.PatchSet) -> None:
    """Pristine 0.3.0 and every version, TP=2, a 5-prompt batch then a 40-prompt batch the
    scheduler splits over two steps: each earlier state ends with the exception a GPU host
    shows, the latest returns every request's hidden states aligned."""
    pristine = spec_wheel.pristine_files()
    names = ["pristine"] + P.version_order(pset)
    states = {n: pristine if n == "pristine" else P.build_version(pset, n, pristine)
              for n in names}
    res = drive(site, tmp_path, model_dir, states, [SMALL, BIG], tp=2)
    sigs = SignatureSet.build(load_signatures(user_file=None))
    table = []
    for i, (state, exc_type, text) in enumerate(EXPECTED):
        r = res[state]
        assert r["vllm"] == "0.16.0"
        assert not r["ok"] and r["exc_type"] == exc_type and text in r["message"], r
        assert r["raised_at"].startswith(RAISED_AT[state]), r
        hits = [h for h in map(sigs.match, r["message"].splitlines()) if h is not None]
        assert hits and hits[0][0].id in pset.versions[i].fixes, (state, hits)
        table.append(f"{state:8} {exc_type}: {r['message'].splitlines()[0][:90]} @ {r['raised_at']}")
    latest = res[names[-1]]
    assert latest["ok"] and latest["aligned"] == [True, True], latest
    assert latest["config"] == {"async_scheduling": False, "chunked_prefill": False,
                                "prefix_caching": False}
    for w in latest["workers"]:  # both TP ranks: every request freed, no step left open
        assert w["requests"] == [] and not w["state"] and w["steps"] == 3
        assert [len(o) for o in w["orders"]] == [5, 32, 8]
    table.append(f"{names[-1]:8} ok: hidden states aligned for {len(SMALL)} + {len(BIG)} prompts, TP=2")
    print("\n".join(table))


@tier
def test_latest_rows_follow_request_order_on_real_scheduler(
        site: Path, tmp_path: Path, model_dir: Path, pset: P.PatchSet) -> None:
    """Why v5 may match rows to prompts by position on 0.16: every request on this path is
    a fresh prefill (num_computed_tokens == 0: prefix caching and chunked prefill are off),
    and the real reorder (vllm/v1/attention/backends/utils.py:603-610) only moves requests
    that already have computed tokens. With a reorder threshold larger than every prompt
    (as an MLA backend would set one) the real InputBatch keeps the scheduling order, TP=1,
    for several batch shapes, including 1-token prompts between long ones."""
    latest = P.build_version(pset, "latest", spec_wheel.pristine_files())
    mixed = [[9] * 20, [11], [12, 13], [14] * 300, [15], [16] * 17, [17]]
    shapes = [[[7]], mixed, batch(32, 4), batch(33, 5), batch(5, 3, length=1500), SMALL]
    out = drive(site, tmp_path, model_dir, {"latest": latest}, shapes, tp=1, probe=True,
                EAGLE3_TUI_REORDER_THRESHOLD="4096")
    # The same real reorder does move a request that already has computed tokens.
    assert out["probe"] == ["b", "a", "c"]
    res = out["latest"]
    assert res["ok"] and res["aligned"] == [True] * len(shapes), res
    (w,) = res["workers"]
    assert w["requests"] == [] and not w["state"]
    # 1 + 1 + 1 + 2 (33 > max_num_seqs) + 1 (5 x 1500 tokens fit 8192) + 1 steps
    assert [len(o) for o in w["orders"]] == [1, 7, 32, 32, 1, 5, 5]
    for order in w["orders"]:  # scheduling order = request order within every step
        assert order == sorted(order, key=lambda r: int(r.rsplit("_", 1)[1]))


def preflight(site: Path, gen_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PREFLIGHT), "--generator-file", str(gen_file)],
                          capture_output=True, text=True, timeout=600,
                          env=real_vllm.env(site), check=False)


@tier
def test_preflight_on_real_vllm(site: Path, tmp_path: Path, pset: P.PatchSet) -> None:
    """remote/extraction/preflight.py on the real installed 0.16.0: every failure of the pristine
    files named, one line each; the latest version passes."""
    pristine = spec_wheel.pristine_files()
    root = spec_wheel.speculators_site(tmp_path / "pristine", pristine)
    proc = preflight(site, root / "speculators" / GEN)
    print(proc.stdout)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    assert "[preflight] ok import vllm: vllm 0.16.0 at " in proc.stdout
    failed = re.findall(r"^\[preflight\] FAIL ([^:]+): ", proc.stdout, re.M)
    assert set(failed) == {"SchedulerConfig", "prefix caching", "Scheduler.__init__",
                           "get_kv_cache_config_from_groups", "sample_tokens",
                           "collective_rpc reply", "custom_worker embeddings"}
    assert "is_encoder_decoder" in proc.stdout and "block_size" in proc.stdout
    root = spec_wheel.speculators_site(tmp_path / "latest", P.build_version(pset, "latest", pristine))
    proc = preflight(site, root / "speculators" / GEN)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == "[preflight] all 10 checks passed"


def test_preflight_ships_with_the_agent() -> None:
    """The client uploads the remote package; extract.py's --preflight imports its preflight."""
    files = agent_files(ROOT / "remote")
    assert "remote/extraction/preflight.py" in files and "remote/extract.py" in files
    assert b"from remote.extraction import preflight" in files["remote/extract.py"]


# ------------------------------------------------------------------ the stand-in cannot drift

STANDIN = ROOT / "tests" / "standin_vllm" / "vllm"
# Stand-in functions with no twin in vLLM 0.16.0, and why they exist.
STANDIN_ONLY = {
    "config/__init__.py:_Config.__init__": "the pydantic-like dataclass init (real: pydantic dataclasses)",
    "config/__init__.py:_Config._post_init": "the same, the __post_init__ hook",
    "config/__init__.py:CacheConfig._post_init": "the same",
    "config/__init__.py:SchedulerConfig._post_init": "the same",
    "config/__init__.py:ModelConfig._post_init": "the same",
    "config/__init__.py:VllmConfig._post_init": "the same",
    "distributed/__init__.py:set_current_rank": "ranks are threads in the stand-in",
    "distributed/__init__.py:GroupCoordinator.is_first_rank": "a property in vLLM",
    "distributed/__init__.py:GroupCoordinator.is_last_rank": "a property in vLLM",
    "model_executor/models/llama.py:LlamaDecoderLayer.__call__": "nn.Module.__call__ in vLLM",
    "model_executor/models/llama.py:RMSNorm.__call__": "nn.Module.__call__ in vLLM",
    "model_executor/models/llama.py:LlamaModel.__call__": "nn.Module.__call__ in vLLM",
    "model_executor/models/llama.py:LlamaForCausalLM.__call__": "nn.Module.__call__ in vLLM",
    "model_executor/models/llama.py:reference_hidden_states": "the toy model's expected output",
    "model_executor/models/llama.py:LlamaDecoderLayer.__init__": "toy layer; vLLM's takes vllm_config",
    "model_executor/models/llama.py:LlamaModel.__init__": "toy model built from a layer count",
    "model_executor/models/llama.py:LlamaForCausalLM.__init__": "the same",
    "sampling_params.py:SamplingParams.__init__": "a msgspec.Struct in vLLM (fields, no __init__)",
    "v1/worker/gpu_model_runner.py:GPUModelRunner._remove": "the stand-in's slice of InputBatch",
    "v1/worker/gpu_worker.py:make_worker": "builds the in-process workers",
}


def _module_file(site: Path, module: str) -> Path | None:
    base = site.joinpath(*module.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _find_def(site: Path, module: str, qual: list[str], seen: int = 0) -> Any:
    """The FunctionDef of `qual` (name or Class.method) in vLLM's `module`, following
    re-exports and base classes through `from vllm... import` lines."""
    path = _module_file(site, module)
    if path is None or seen > 8:
        return None
    tree = ast.parse(path.read_text(encoding="utf-8"))
    def absolute(n: ast.ImportFrom) -> str:
        if not n.level:
            return n.module or ""
        pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        return ".".join(pkg[: len(pkg) - n.level + 1] + ([n.module] if n.module else []))

    froms = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
             and absolute(n).startswith("vllm")]
    imports = {a.asname or a.name: (absolute(n), a.name) for n in froms for a in n.names}
    stars = [absolute(n) for n in froms if any(a.name == "*" for a in n.names)]
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and [node.name] == qual:
            return node
        if isinstance(node, ast.ClassDef) and node.name == qual[0] and len(qual) == 2:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        item.name == qual[1]:
                    return item
            for b in node.bases:
                name = b.id if isinstance(b, ast.Name) else None
                if name in imports:
                    found = _find_def(site, imports[name][0], [imports[name][1], qual[1]], seen + 1)
                elif name is not None:
                    found = _find_def(site, module, [name, qual[1]], seen + 1)
                else:
                    found = None
                if found is not None:
                    return found
    if qual[0] in imports:
        mod, name = imports[qual[0]]
        return _find_def(site, mod, [name] + qual[1:], seen + 1)
    for mod in stars:
        found = _find_def(site, mod, qual, seen + 1)
        if found is not None:
            return found
    return None


def _shape(fn: Any) -> str:
    """A function's signature as text: parameter names and kinds, and which have defaults."""
    a = fn.args
    pos = a.posonlyargs + a.args
    first_default = len(pos) - len(a.defaults)
    parts = [p.arg + ("=" if i >= first_default else "") for i, p in enumerate(pos)]
    if a.posonlyargs:
        parts.insert(len(a.posonlyargs), "/")
    parts += ["*" + a.vararg.arg] if a.vararg else (["*"] if a.kwonlyargs else [])
    parts += [k.arg + ("=" if d is not None else "") for k, d in zip(a.kwonlyargs, a.kw_defaults)]
    parts += ["**" + a.kwarg.arg] if a.kwarg else []
    return "(" + ", ".join(parts) + ")"


def standin_drift(site: Path, standin: Path = STANDIN) -> list[str]:
    problems = []
    for f in sorted(standin.rglob("*.py")):
        rel = f.relative_to(standin).as_posix()
        module = "vllm." + rel[:-3].replace("/", ".").removesuffix(".__init__")
        tree = ast.parse(f.read_text(encoding="utf-8"))
        defs = [([n.name], n) for n in tree.body if isinstance(n, ast.FunctionDef)]
        defs += [([c.name, n.name], n) for c in tree.body if isinstance(c, ast.ClassDef)
                 for n in c.body if isinstance(n, ast.FunctionDef)]
        for qual, node in defs:
            key = f"{rel}:{'.'.join(qual)}"
            if key in STANDIN_ONLY:
                continue
            real = _find_def(site, module, qual)
            if real is None:
                problems.append(f"{key}: not in vLLM 0.16.0 (add it to STANDIN_ONLY with why)")
            elif _shape(node) != _shape(real):
                problems.append(f"{key}: stand-in {_shape(node)} != vLLM 0.16.0 {_shape(real)}")
    return problems


@tier
def test_standin_signatures_match_the_real_wheel(site: Path) -> None:
    """Every function of tests/standin_vllm has the signature of its vLLM 0.16.0 twin, read
    by AST from the installed wheel (or is listed in STANDIN_ONLY with the reason)."""
    problems = standin_drift(site)
    assert not problems, "the stand-in drifted from vLLM 0.16.0:\n" + "\n".join(problems)
