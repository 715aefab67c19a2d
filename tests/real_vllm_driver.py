"""Subprocess of the real-vLLM tier (tests/test_real_vllm.py): with the tier's environment
first on sys.path, run the real speculators generator (its __init__ and generate()) for
each given state of its files against the real vLLM 0.16.0, and print one JSON line per
state: the exception it ends with (type, message, the file:line in vLLM where it was raised)
or, per batch, whether every request's hidden states equal what the toy model computes
for that request alone.

    python tests/real_vllm_driver.py SPEC.json
SPEC: {"model": dir, "tp": n, "batches": [[[ids...], ...], ...],
       "states": [{"name": "v5", "site": dir holding speculators/}, ...]}
"""

from __future__ import annotations

import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402
import vllm  # noqa: E402

import tests.real_vllm_shims  # noqa: E402,F401 - before anything else of vLLM
from tests.real_vllm_worker import reference  # noqa: E402


def raised_at(exc: BaseException) -> str:
    """Where the exception was raised: the innermost traceback frame, as a path from the
    package directory (vllm/..., speculators/...), and the innermost frame inside vLLM."""
    frames = traceback.extract_tb(exc.__traceback__)

    def short(frame: traceback.FrameSummary) -> str:
        parts = frame.filename.split(os.sep)
        for top in ("vllm", "speculators", "torch", "pydantic", "tests"):
            if top in parts:
                i = len(parts) - parts[::-1].index(top) - 1
                return "/".join(parts[i:]) + f":{frame.lineno}"
        return f"{frame.filename}:{frame.lineno}"

    in_vllm = [short(f) for f in frames if short(f).startswith("vllm/")]
    return short(frames[-1]) + (f" (in vLLM: {in_vllm[-1]})" if in_vllm and
                                not short(frames[-1]).startswith("vllm/") else "")


def run_state(spec: dict, state: dict) -> dict:
    for name in [m for m in sys.modules if m.split(".")[0] == "speculators"]:
        del sys.modules[name]
    sys.path.insert(0, state["site"])
    try:
        from speculators.data_generation.vllm_hidden_states_generator import (
            VllmHiddenStatesGenerator,
        )

        out: dict = {"state": state["name"], "vllm": vllm.__version__}
        try:
            gen = VllmHiddenStatesGenerator(spec["model"], layer_ids=spec["layer_ids"],
                                            tensor_parallel_size=spec["tp"])
            results = [gen.generate(b) for b in spec["batches"]]
        except Exception as exc:  # the failure a user would meet, reported
            return dict(out, ok=False, exc_type=type(exc).__name__, message=str(exc),
                        raised_at=raised_at(exc))
        aligned = []
        for batch, res in zip(spec["batches"], results):
            aligned.append(len(res) == len(batch) and all(
                r["input_ids"].tolist() == p and len(r["hidden_states"]) == len(spec["layer_ids"])
                and all(torch.equal(g.to(torch.float64), w) for g, w in
                        zip(r["hidden_states"], reference(p, spec["layer_ids"], spec["num_layers"])))
                for p, r in zip(batch, res)))
        cfg = gen.vllm_config
        return dict(out, ok=True, aligned=aligned,
                    workers=gen.executor.collective_rpc("runner_report"),
                    config={"async_scheduling": cfg.scheduler_config.async_scheduling,
                            "chunked_prefill": cfg.scheduler_config.enable_chunked_prefill,
                            "prefix_caching": cfg.cache_config.enable_prefix_caching})
    finally:
        sys.path.remove(state["site"])


def main() -> int:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    if spec.get("reorder_probe"):
        from tests.real_vllm_worker import reorder_probe

        sys.stdout.write("PROBE " + json.dumps(reorder_probe()) + "\n")
    for state in spec["states"]:
        sys.stdout.write("RESULT " + json.dumps(run_state(spec, state)) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
