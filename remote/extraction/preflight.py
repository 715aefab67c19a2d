"""Preflight: does the installed vLLM fit the speculators generator file? In seconds,
without loading weights or touching a GPU. Standard library only (Python >= 3.9); shipped
with the rest of the remote package and called by `extract.py --preflight`.

    python remote/extraction/preflight.py [--generator-file FILE]

It imports vLLM's config, scheduler, KV-cache and executor modules (not the model) and
reads the generator's source with `ast`; each check prints one line,
`[preflight] ok|FAIL <check>: <detail>`, then a summary line. Exit 0 when all pass, 1 when
any fails (the run would die after the load).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

if not __package__:  # started as a file: docs/architecture.md, "Upload layout and imports"
    _HERE = os.path.dirname(os.path.abspath(__file__))  # off sys.path, for the dir above
    _ABOVE = os.path.dirname(os.path.dirname(_HERE))
    sys.path[:] = [_ABOVE] + [p for p in sys.path if os.path.abspath(p) != _HERE]
from remote.base.wire import one_line
from remote.extraction.common import say


def _version_tuple(v: str) -> Optional[Tuple[int, int, int]]:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", v or "")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def _calls(tree: ast.AST, name: str) -> List[ast.Call]:
    """Calls of `name(...)` or `x.name(...)` in the tree."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id == name) or (
                    isinstance(f, ast.Attribute) and f.attr == name):
                out.append(node)
    return out


def _signature_check(tree: ast.AST, name: str, target: Any) -> Tuple[bool, str]:
    """Does every `name(...)` call in the generator fit vLLM's signature of `target`?"""
    calls = _calls(tree, name)
    if not calls:
        return False, "the generator never calls %s(...)" % name
    sig = inspect.signature(target)
    params = [p for p in sig.parameters.values() if p.name != "self"]
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = [p.name for p in named if p.default is p.empty]
    problems = []
    for call in calls:
        if any(k.arg is None for k in call.keywords):
            continue  # **kwargs at the call site: cannot tell statically
        passed = {p.name for p in named[: len(call.args)]} | {
            k.arg for k in call.keywords if k.arg is not None}
        missing = [r for r in required if r not in passed]
        unknown = [] if var_kw else sorted(a for a in passed if a not in sig.parameters)
        if missing:
            problems.append("vLLM requires %s; the call at line %d omits it"
                            % (", ".join(missing), call.lineno))
        if unknown:
            problems.append("vLLM no longer accepts %s; the call at line %d passes it"
                            % (", ".join(unknown), call.lineno))
    if problems:
        return False, "; ".join(problems)
    if var_kw and not named:
        return True, "%d call(s); vLLM's signature takes any keyword (**kwargs)" % len(calls)
    shown = ", ".join(required) if required else "nothing"
    return True, "%d call(s) fit the signature (required: %s)" % (len(calls), shown)


def _indexes_rpc_reply(tree: ast.AST) -> Optional[bool]:
    """Does the generator index `[0]` on the `_get_captured_states` collective_rpc reply?"""
    names: set = set()
    direct = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            f = node.value.func
            if isinstance(f, ast.Attribute) and f.attr == "collective_rpc" and node.value.args and \
                    isinstance(node.value.args[0], ast.Constant) and \
                    node.value.args[0].value == "_get_captured_states":
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        if isinstance(node, ast.Subscript) and _is_zero(node.slice):
            v = node.value
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and \
                    v.func.attr == "collective_rpc":
                direct = True
    if direct:
        return True
    if not names:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
                node.value.id in names and _is_zero(node.slice):
            return True
    return False


def _is_zero(sl: Any) -> bool:
    if isinstance(sl, ast.Index):  # Python 3.8 wraps the slice  # pragma: no cover
        sl = sl.value  # type: ignore[attr-defined]
    return isinstance(sl, ast.Constant) and sl.value == 0


def _generator_file(explicit: Optional[str]) -> Path:
    if explicit:
        return Path(explicit)
    # find_spec on the top-level package locates it without importing it (its
    # __init__ pulls in torch and transformers).
    spec = importlib.util.find_spec("speculators")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("speculators is not installed")
    root = Path(list(spec.submodule_search_locations)[0])
    return root / "data_generation" / "vllm_hidden_states_generator.py"


def preflight(generator_file: Optional[str]) -> int:
    """Check vLLM against the speculators generator file, fast; 0 if all fit, else 1."""
    results: List[Tuple[bool, str, str]] = []

    def check(name: str, fn: Any) -> None:
        try:
            ok, detail = fn()
        except Exception as exc:  # an import or inspection fault is a failed check
            ok, detail = False, one_line(exc)
        results.append((ok, name, detail))
        say("[preflight] %s %s: %s" % ("ok" if ok else "FAIL", name, detail))

    state: Dict[str, Any] = {}

    def find() -> Tuple[bool, str]:
        path = _generator_file(generator_file)
        state["gen_path"] = path
        state["tree"] = ast.parse(path.read_text(encoding="utf-8"), str(path))
        return True, str(path)

    def vllm_version() -> Tuple[bool, str]:
        import vllm

        state["vllm"] = getattr(vllm, "__version__", "unknown")
        return True, "vllm %s at %s" % (state["vllm"], os.path.dirname(vllm.__file__))

    check("speculators generator", find)
    check("import vllm", vllm_version)
    tree = state.get("tree")
    if tree is None or "vllm" not in state:
        failed = [n for ok, n, _ in results if not ok]
        say("[preflight] FAILED %d check(s): %s" % (len(failed), ", ".join(failed)))
        return 1

    def sched_config() -> Tuple[bool, str]:
        from vllm.config import SchedulerConfig

        return _signature_check(tree, "SchedulerConfig", SchedulerConfig)

    def scheduler() -> Tuple[bool, str]:
        from vllm.v1.core.sched.scheduler import Scheduler

        return _signature_check(tree, "Scheduler", Scheduler)

    def kv_config() -> Tuple[bool, str]:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups

        return _signature_check(tree, "get_kv_cache_config_from_groups",
                                get_kv_cache_config_from_groups)

    def prefix_caching() -> Tuple[bool, str]:
        from vllm.config import CacheConfig

        p = inspect.signature(CacheConfig).parameters.get("enable_prefix_caching")
        default = None if p is None or p.default is p.empty else p.default
        passed_false = any(
            k.arg == "enable_prefix_caching" and isinstance(k.value, ast.Constant)
            and k.value.value is False
            for c in _calls(tree, "CacheConfig") for k in c.keywords)
        if passed_false:
            return True, "the generator passes enable_prefix_caching=False"
        if default:
            return False, ("vLLM enables prefix caching by default; the generator does not pass "
                           "enable_prefix_caching=False (block_hasher assertion, skipped tokens)")
        return True, "vLLM's default is %r" % (default,)

    def two_phase() -> Tuple[bool, str]:
        from vllm.v1.executor.multiproc_executor import MultiprocExecutor

        has = hasattr(MultiprocExecutor, "sample_tokens")
        calls = bool(_calls(tree, "sample_tokens"))
        if has and not calls:
            return False, ("vLLM steps in two phases (execute_model, then sample_tokens); the "
                           "generator never calls sample_tokens (State error after the load)")
        if calls and not has:
            return False, "the generator calls sample_tokens, which this vLLM lacks"
        return True, ("two-phase step handled" if has else "one-phase vLLM, no sample_tokens")

    def reply_shape() -> Tuple[bool, str]:
        from vllm.v1.executor.multiproc_executor import MultiprocExecutor

        ver = _version_tuple(state["vllm"])
        if ver is not None:
            unwrapped = ver >= (0, 11, 1)
            basis = "vllm %s" % state["vllm"]
        else:
            src = inspect.getsource(MultiprocExecutor.collective_rpc)
            unwrapped = bool(re.search(r"responses\[0\]\s+if", src))
            basis = "collective_rpc source"
        indexed = _indexes_rpc_reply(tree)
        if indexed is None:
            return False, "cannot find the _get_captured_states collective_rpc in the generator"
        if unwrapped and indexed:
            return False, ("collective_rpc(unique_reply_rank=0) returns the value itself (%s); the "
                           "generator still indexes [0], taking layer 0's rows as layers" % basis)
        if not unwrapped and not indexed:
            return False, ("collective_rpc returns a list (%s); the generator does not index [0]"
                           % basis)
        return True, "reply shape handled (%s)" % basis

    worker_path = state["gen_path"].with_name("custom_worker.py")
    wtree = ast.parse(worker_path.read_text(encoding="utf-8")) if worker_path.is_file() else None

    def imports() -> Tuple[bool, str]:
        missing, count = [], 0
        for t in (tree, wtree):
            for node in ast.walk(t) if t is not None else ():
                if not isinstance(node, ast.ImportFrom):
                    continue
                module = node.module or ""
                if module.split(".")[0] == "vllm":
                    mod = importlib.import_module(module)
                    for alias in node.names:
                        count += 1
                        if not hasattr(mod, alias.name):
                            missing.append("%s.%s" % (module, alias.name))
        if missing:
            return False, "this vLLM lacks %s" % ", ".join(missing)
        return True, "all %d names the speculators files import from vllm exist" % count

    def embeddings() -> Tuple[bool, str]:
        if wtree is None:
            return True, "no custom_worker.py beside the generator; not checked"
        from vllm.model_executor.models.llama import LlamaModel

        for name in ("get_input_embeddings", "embed_input_ids"):
            if _calls(wtree, name) and not hasattr(LlamaModel, name):
                return False, ("custom_worker calls %s, which vLLM's LlamaModel lacks "
                               "(get_input_embeddings was renamed embed_input_ids in 0.11.1)"
                               % name)
        return True, "custom_worker's embedding call exists on LlamaModel"

    check("imports", imports)
    check("SchedulerConfig", sched_config)
    check("Scheduler.__init__", scheduler)
    check("get_kv_cache_config_from_groups", kv_config)
    check("prefix caching", prefix_caching)
    check("sample_tokens", two_phase)
    check("collective_rpc reply", reply_shape)
    check("custom_worker embeddings", embeddings)
    failed = [n for ok, n, _ in results if not ok]
    if failed:
        say("[preflight] FAILED %d of %d checks: %s"
            % (len(failed), len(results), ", ".join(failed)))
        return 1
    say("[preflight] all %d checks passed" % len(results))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="preflight.py", description=__doc__.split("\n")[0])
    p.add_argument("--generator-file",
                   help="speculators generator source to check (default: the installed one)")
    return preflight(p.parse_args(argv).generator_file)


if __name__ == "__main__":
    sys.exit(main())
