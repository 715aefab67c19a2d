"""Build the self-contained demo: a tiny random Llama model, a token dataset, eagle3.toml.

Nothing is downloaded. The model is a LlamaConfig written in code with a fixed seed,
saved as exactly `shards` safetensors files plus `model.safetensors.index.json`, so
`remote/extract.py --backend hf` loads it shard by shard and prints the same bar vLLM
prints. The config runs that extraction locally; `--shard-delay` slows the load so the
bar can be watched. torch and transformers are imported only inside `build_demo`.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

EXTRACT_SCRIPT = Path(__file__).resolve().parent.parent / "remote" / "extract.py"
MARKER = ".demo-complete"
MISSING_DEPS = "the demo needs torch and transformers: pip install 'eagle3-tui[demo]'"


class DemoError(RuntimeError):
    """The demo cannot be built; the message is one line for the user."""


@dataclass(frozen=True)
class DemoSpec:
    """Everything that shapes the demo's files; a change means a rebuild."""

    shards: int = 64
    layers: int = 8
    hidden: int = 256
    intermediate: int = 688
    heads: int = 4
    vocab: int = 1024
    sequences: int = 128
    seq_len: int = 256
    seed: int = 0
    shard_delay: float = 0.1


@dataclass(frozen=True)
class DemoPaths:
    """Where build_demo put things (all absolute)."""

    root: Path
    model: Path
    data: Path
    out: Path
    config: Path
    extract: Path
    command: tuple[str, ...]
    busy: bool = False  # a demo run is still writing to out/ (its lock is held)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _toml_str(s: str) -> str:
    # A JSON string is a valid TOML basic string when non-ASCII is kept literal
    # (TOML rejects the surrogate-pair escapes ensure_ascii would produce).
    return json.dumps(s, ensure_ascii=False)


def demo_command(root: Path, python: str, spec: DemoSpec) -> tuple[str, ...]:
    """The extraction argv the demo's eagle3.toml runs."""
    return (
        python, str(EXTRACT_SCRIPT), "--backend", "hf",
        "--model", str(root / "model"), "--data", str(root / "data.jsonl"),
        "--out", str(root / "out"), "--shard-delay", repr(spec.shard_delay),
    )


def _config_text(root: Path, python: str, command: tuple[str, ...]) -> str:
    argv = ", ".join(_toml_str(a) for a in command)
    return (
        "# eagle3-tui demo: a real (tiny) hidden-state extraction on this machine.\n"
        "[host]\n"
        'target = "local"\n'
        f"python = {_toml_str(python)}\n"
        "\n[run]\n"
        'name = "demo-extract"\n'
        f"command = [{argv}]\n"
        f"cwd = {_toml_str(str(root))}\n"
        'match = "extract.py"\n'
    )


def _shard_groups(names: list[str], sizes: dict[str, int], shards: int) -> list[list[str]]:
    """Split tensors, in order, into `shards` non-empty groups of roughly equal bytes."""
    if shards > len(names):
        raise DemoError(f"cannot split {len(names)} tensors into {shards} shards")
    groups: list[list[str]] = []
    left = sum(sizes.values())
    i = 0
    for g in range(shards):
        target = left / (shards - g)
        group = [names[i]]
        acc = sizes[names[i]]
        i += 1
        # Keep adding while under target, leaving at least one tensor per later shard.
        last = g == shards - 1
        while i < len(names) - (shards - g - 1) and (last or acc + sizes[names[i]] / 2 <= target):
            group.append(names[i])
            acc += sizes[names[i]]
            i += 1
        left -= acc
        groups.append(group)
    return groups


def _write_model(model_dir: Path, spec: DemoSpec) -> None:
    try:
        import torch
        from safetensors.torch import save
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        raise DemoError(MISSING_DEPS) from None
    config = LlamaConfig(
        vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads, max_position_embeddings=max(2048, spec.seq_len),
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    names = list(state)
    sizes = {k: v.numel() * v.element_size() for k, v in state.items()}
    groups = _shard_groups(names, sizes, spec.shards)
    model_dir.mkdir(parents=True, exist_ok=True)
    for old in model_dir.glob("model-*.safetensors"):
        old.unlink()  # a rebuild with another shard count must not leave strays
    weight_map: dict[str, str] = {}
    for n, group in enumerate(groups, 1):
        fname = f"model-{n:05d}-of-{spec.shards:05d}.safetensors"
        _atomic_write(model_dir / fname, save({k: state[k] for k in group}, {"format": "pt"}))
        weight_map.update({k: fname for k in group})
    index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
    _atomic_write(model_dir / "model.safetensors.index.json",
                  (json.dumps(index, indent=2, sort_keys=True) + "\n").encode())
    _atomic_write(model_dir / "config.json", (config.to_json_string() + "\n").encode())


def _write_data(path: Path, spec: DemoSpec) -> None:
    rng = random.Random(spec.seed)
    lines = []
    for _ in range(spec.sequences):
        ids = [1] + [rng.randrange(3, spec.vocab) for _ in range(spec.seq_len - 1)]
        lines.append(json.dumps({"input_ids": ids}))
    _atomic_write(path, ("\n".join(lines) + "\n").encode())


def build_demo(
    dir: Path,
    *,
    shards: int = 64,
    layers: int = 8,
    hidden: int = 256,
    sequences: int = 128,
    seq_len: int = 256,
    shard_delay: float = 0.1,
    seed: int = 0,
    python: str | None = None,
    clear_out: bool = False,
) -> DemoPaths:
    """Write the demo into `dir` (model/, data.jsonl, eagle3.toml); reuse it if complete.

    `clear_out` removes a previous run's out/ so the extraction starts from scratch
    (otherwise it resumes and skips every finished batch). Raises DemoError.
    """
    root = Path(dir).resolve()
    python = python or sys.executable
    spec = DemoSpec(shards=shards, layers=layers, hidden=hidden, sequences=sequences,
                    seq_len=seq_len, shard_delay=shard_delay, seed=seed)
    if shards < 1 or layers < 1 or sequences < 1 or seq_len < 2:
        raise DemoError("shards, layers and sequences must be >= 1 and seq_len >= 2")
    command = demo_command(root, python, spec)
    paths = DemoPaths(root=root, model=root / "model", data=root / "data.jsonl",
                      out=root / "out", config=root / "eagle3.toml", extract=EXTRACT_SCRIPT,
                      command=command)
    root.mkdir(parents=True, exist_ok=True)
    marker = root / MARKER
    want = json.dumps(asdict(spec), sort_keys=True)
    complete = False
    try:
        complete = marker.read_text(encoding="utf-8") == want and _model_complete(paths.model)
    except OSError:
        pass
    if not complete:
        marker.unlink(missing_ok=True)
        _write_model(paths.model, spec)
        _write_data(paths.data, spec)
        if paths.out.exists():
            if _out_in_use(paths.out):
                raise DemoError(f"a demo run is still writing to {paths.out}: kill it first (eagle3-tui --config {paths.config} kill)")
            shutil.rmtree(paths.out)  # outputs of another model are meaningless now
    if not paths.data.is_file():
        _write_data(paths.data, spec)
    # Always rewritten: it holds this checkout's paths and this interpreter.
    _atomic_write(paths.config, _config_text(root, python, command).encode())
    if not complete:
        _atomic_write(marker, want.encode())
    if paths.out.exists() and _out_in_use(paths.out):
        return replace(paths, busy=True)  # never delete what a live run is writing
    if clear_out and paths.out.exists():
        shutil.rmtree(paths.out)
    return paths


def _out_in_use(out: Path) -> bool:
    """True while an extract.py run holds out/.extract.lock."""
    lock = out / ".extract.lock"
    if not lock.exists():
        return False
    with open(lock, "a") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    return False


def _model_complete(model_dir: Path) -> bool:
    """config.json, the index, and every shard the index names exist."""
    try:
        index = json.loads((model_dir / "model.safetensors.index.json").read_text(encoding="utf-8"))
        files = set(index["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return (model_dir / "config.json").is_file() and all((model_dir / f).is_file() for f in files)
