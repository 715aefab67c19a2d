"""Build the self-contained demo: a tiny random Llama model, a token dataset, eagle3.toml.

Nothing is downloaded. The model is a LlamaConfig written in code with a fixed seed,
saved as exactly `shards` safetensors files plus `model.safetensors.index.json`, so
`remote/extract.py --backend hf` loads it shard by shard and prints the same bar vLLM
prints. The config runs that extraction locally; `--shard-delay` slows the load so the
bar can be watched. torch and transformers are imported only inside `build_demo`.

For the patch screen to have something real to patch, the demo also makes `venv/`: a
virtual environment that sees this interpreter's packages (torch, transformers) and holds
the real speculators 0.3.0, installed without its dependencies (the patch engine only
reads and writes its files; nothing imports it). The config's `[host] python` is that
venv's python and `[patches] set` names the bundled set. When the venv or the install
fails (offline, no pip), the demo runs without patches and `DemoPaths.patches_note` says
why.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tui.services.files import atomic_write

EXTRACT_SCRIPT = Path(__file__).resolve().parents[2] / "remote" / "extract.py"
MARKER = ".demo-complete"
# The one line for a package the demo (or its job) cannot import.
MISSING_DEPS = "the demo needs {module} in {python}: install it with: {python} -m pip install {module}"
PATCH_SET = "speculators-0.3.0-vllm-0.16"
SPECULATORS = "speculators==0.3.0"
# A file the patch set targets; its presence in the venv means the install finished.
SPEC_PROBE = "speculators/data_generation/vllm_hidden_states_generator.py"
VENV_MARKER = ".eagle3-demo-venv"
PTH_NAME = "eagle3-demo-user-site.pth"  # adds the user's site dirs to the demo venv
JOB_MODULES = ("torch", "safetensors", "transformers")  # what extract.py --backend hf imports
DEMO_ENV = "EAGLE3_DEMO"  # set in the demo runs' environment, so `runs prune --demo` finds them
PIP_TIMEOUT = 300  # seconds for the whole install; pip's own --timeout bounds each request


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
    python: str = ""  # the config's [host] python (the venv's, when patches are on)
    patch_set: str | None = None  # the config's [patches] set, or None
    patches_note: str | None = None  # why the demo has no patches, when they were asked for


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


def _config_text(root: Path, python: str, command: tuple[str, ...],
                 patch_set: str | None = None) -> str:
    argv = ", ".join(_toml_str(a) for a in command)
    patches = f"\n[patches]\nset = {_toml_str(patch_set)}\n" if patch_set else ""
    return (
        "# eagle3-tui demo: a real (tiny) hidden-state extraction on this machine.\n"
        "[host]\n"
        'target = "local"\n'
        f"python = {_toml_str(python)}\n"
        f"runs_dir = {_toml_str(str(root / 'runs'))}\n"
        "\n[run]\n"
        'name = "demo-extract"\n'
        f"command = [{argv}]\n"
        f"cwd = {_toml_str(str(root))}\n"
        f'env = {{ {DEMO_ENV} = "1" }}\n'
        f"match = {_toml_str(str(root / 'out'))}\n"
        f"{patches}"
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


def _make_dirs(path: Path) -> None:
    """`path` and each missing parent, 0755 whatever the umask (an explicit mode for
    everything eagle3-tui creates: under a umask of 002 plain mkdir made them 0775)."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o755)
        except FileExistsError:
            pass


def _write_model(model_dir: Path, spec: DemoSpec) -> None:
    try:
        import torch
        from safetensors.torch import save
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as exc:
        module = (exc.name or "torch").split(".")[0]
        raise DemoError(MISSING_DEPS.format(module=module, python=sys.executable)) from None
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
    _make_dirs(model_dir)
    for old in model_dir.glob("model-*.safetensors"):
        old.unlink()  # a rebuild with another shard count must not leave strays
    weight_map: dict[str, str] = {}
    for n, group in enumerate(groups, 1):
        fname = f"model-{n:05d}-of-{spec.shards:05d}.safetensors"
        atomic_write(model_dir / fname, save({k: state[k] for k in group}, {"format": "pt"}))
        weight_map.update({k: fname for k in group})
    index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
    atomic_write(model_dir / "model.safetensors.index.json",
                  (json.dumps(index, indent=2, sort_keys=True) + "\n").encode())
    atomic_write(model_dir / "config.json", (config.to_json_string() + "\n").encode())


def _write_data(path: Path, spec: DemoSpec) -> None:
    rng = random.Random(spec.seed)
    lines = []
    for _ in range(spec.sequences):
        ids = [1] + [rng.randrange(3, spec.vocab) for _ in range(spec.seq_len - 1)]
        lines.append(json.dumps({"input_ids": ids}))
    atomic_write(path, ("\n".join(lines) + "\n").encode())


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
    patches: bool = True,
) -> DemoPaths:
    """Write the demo into `dir` (model/, data.jsonl, eagle3.toml, venv/); reuse it if complete.

    `clear_out` removes a previous run's out/ so the extraction starts from scratch
    (otherwise it resumes and skips every finished batch). `patches` makes venv/ from
    `python` (default: this interpreter) with speculators 0.3.0 in it, for the patch
    screen; when that fails the demo goes on without it (see `patches_note`).
    Raises DemoError.
    """
    root = Path(dir).resolve()
    base = python or sys.executable
    spec = DemoSpec(shards=shards, layers=layers, hidden=hidden, sequences=sequences,
                    seq_len=seq_len, shard_delay=shard_delay, seed=seed)
    if shards < 1 or layers < 1 or sequences < 1 or seq_len < 2:
        raise DemoError("shards, layers and sequences must be >= 1 and seq_len >= 2")
    paths = DemoPaths(root=root, model=root / "model", data=root / "data.jsonl",
                      out=root / "out", config=root / "eagle3.toml", extract=EXTRACT_SCRIPT,
                      command=demo_command(root, base, spec), python=base)
    _make_dirs(root)
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
                raise DemoError(f"a demo run is still writing to {paths.out}: kill it first"
                                f" (eagle3-tui --config {paths.config} kill)")
            shutil.rmtree(paths.out)  # outputs of another model are meaningless now
    if not paths.data.is_file():
        _write_data(paths.data, spec)
    if patches:  # after the model, so a missing torch fails before any pip work
        venv_python, note = ensure_speculators_venv(root / "venv", base)
        if venv_python is None:
            paths = replace(paths, patches_note=note)
        else:
            paths = replace(paths, python=venv_python, patch_set=PATCH_SET,
                            command=demo_command(root, venv_python, spec))
    # Always rewritten: it holds this checkout's paths and this interpreter.
    atomic_write(paths.config,
                  _config_text(root, paths.python, paths.command, paths.patch_set).encode())
    if not complete:
        atomic_write(marker, want.encode())
    if paths.out.exists() and _out_in_use(paths.out):
        return replace(paths, busy=True)  # never delete what a live run is writing
    if clear_out and paths.out.exists():
        shutil.rmtree(paths.out)
    return paths


def ensure_speculators_venv(venv: Path, base: str) -> tuple[str | None, str | None]:
    """Make `venv` hold speculators 0.3.0 and see `base`'s packages; reuse it when done.

    `base` is the interpreter running eagle3-tui (often itself in a venv, a uv venv or a
    pipx venv). A `--system-site-packages` venv would see the *base installation's*
    packages, not the user's venv's, so instead the venv gets a `.pth` file that adds
    every site directory of `base` after its own: torch and transformers come from the
    user's environment, and only speculators (the copy the patch screen patches) is the
    venv's own. Returns `(venv_python, None)`, or `(None, reason)` on failure.
    """
    venv_python = venv / "bin" / "python"
    marker = venv / VENV_MARKER
    sites = site_dirs(base)
    want = json.dumps({"base": base, "sites": sites, "spec": SPECULATORS}, sort_keys=True)
    try:
        if (marker.read_text(encoding="utf-8") == want and venv_python.exists()
                and _venv_has_speculators(venv)):
            return str(venv_python), None
    except OSError:
        pass
    # --without-pip: ensurepip costs seconds and is missing on some distributions; pip
    # comes from the user's environment through the .pth file.
    why = run_step([base, "-m", "venv", "--clear", "--without-pip", str(venv)])
    if why is not None:
        return None, f"cannot create a virtual environment ({why})"
    own = site_dirs(str(venv_python))
    if not own:
        return None, f"cannot find the site-packages of {venv}"
    lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in sites if d not in own)
    atomic_write(Path(own[0]) / PTH_NAME, lines.encode())
    # --ignore-installed: a speculators the user already has must not satisfy this, or
    # the patch screen would rewrite the user's files instead of the venv's.
    args = ["install", "--no-deps", "--quiet", "--ignore-installed", "--retries", "1",
            "--timeout", "20", SPECULATORS]
    if run_step([str(venv_python), "-c", "import pip"]) is None:
        why = run_step([str(venv_python), "-m", "pip", "--disable-pip-version-check", *args])
    elif shutil.which("uv"):  # a uv venv has no pip
        why = run_step(["uv", "pip", "install", "--python", str(venv_python), "--no-deps",
                         "--quiet", SPECULATORS])
    else:
        why = "neither pip nor uv is available to this Python"
    if why is not None:
        return None, f"cannot install {SPECULATORS} ({why})"
    if not _venv_has_speculators(venv):
        return None, f"{SPECULATORS} did not land in {venv}"
    atomic_write(marker, want.encode())
    return str(venv_python), None


def site_dirs(python: str) -> list[str]:
    """The site directories `python` reads packages from, in its own order."""
    code = ("import site, sys, json; d = site.getsitepackages()"
            " + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else []);"
            " print(json.dumps([p for p in sys.path if p in d] + [p for p in d if p not in sys.path]))")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL, check=True).stdout
        return [d for d in json.loads(out) if os.path.isdir(d)]
    except (OSError, subprocess.SubprocessError, ValueError):
        return []


def check_job(paths: DemoPaths) -> None:
    """Raise DemoError naming the first package the demo job's interpreter cannot import."""
    missing = job_imports_missing(paths.python)
    if missing:
        raise DemoError(MISSING_DEPS.format(module=missing, python=paths.python))


def job_imports_missing(python: str, modules: tuple[str, ...] = JOB_MODULES) -> str | None:
    """The first of `modules` that `python` cannot import, or None when all import."""
    code = ("import importlib.util, sys\n"
            "for m in sys.argv[1:]:\n"
            "    if importlib.util.find_spec(m) is None:\n"
            "        print(m); break\n")
    try:
        proc = subprocess.run([python, "-c", code, *modules], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"python ({exc})"
    if proc.returncode != 0:
        return "python (it does not run)"
    return proc.stdout.strip() or None


def demo_intro(root: Path) -> tuple[str, bool]:
    """What `eagle3-tui demo` says before it builds, and whether the earlier run's outputs
    are cleared: the first time it builds everything; again, it reuses the model, dataset
    and venv, and the run starts fresh after a finished run or resumes from the samples of
    one that stopped part-way (as `r` does)."""
    out = root / "out"
    finished = (out / "data_config.json").is_file()  # written last: that run finished
    if not (root / MARKER).is_file():
        return f"preparing the demo in {root}/ (the first time takes ~10 s)…", finished
    reuse = f"reusing the demo's model, dataset and venv in {root}/; the run "
    if finished:
        return reuse + f"starts fresh (the finished run's outputs in {out}/ are cleared)", True
    samples = len(list(out.glob("data_*.pt"))) if out.is_dir() else 0
    if samples:
        return reuse + f"resumes from the {samples} samples already in {out}/", False
    return reuse + "starts fresh", False


# Run by `python`: torch's version, its CUDA version (torch/version.py, read as text:
# importing torch takes seconds), whether it requires CUDA packages, and the bytes its
# files take on disk, with those of the CUDA stack a CUDA build brings (the installed
# nvidia-*, cuda-* and triton distributions; not nvidia-ml-py, eagle3-tui's own NVML).
_TORCH_INFO = """\
import importlib.metadata as m, json, os, re
try:
    d = m.distribution('torch')
except m.PackageNotFoundError:
    print('null')
    raise SystemExit
def size(dist):
    total = 0
    for f in dist.files or []:
        try:
            total += os.lstat(dist.locate_file(f)).st_size
        except OSError:
            pass
    return total
cuda = None
try:
    with open(d.locate_file('torch/version.py'), encoding='utf-8') as f:
        v = re.search(r"^cuda(?:: [^=]*)? = '([0-9.]+)'", f.read(65536), re.M)
    cuda = v.group(1) if v else None
except OSError:
    pass
needs = any(r.startswith(('nvidia-', 'cuda-')) for r in d.requires or [])
total = size(d)
if cuda or needs:
    for other in m.distributions():
        name = (other.metadata['Name'] or '').lower().replace('_', '-')
        if name.startswith(('nvidia-', 'cuda-')) and name != 'nvidia-ml-py' or name == 'triton':
            total += size(other)
print(json.dumps([d.version, cuda, needs, total]))
"""


def torch_of(python: str) -> str:
    """Which torch `python` runs the demo's job on, and what it takes on disk, for one
    line: "torch 2.13.0+cpu (CPU build, 757 MB installed)", "torch 2.13.0 (CUDA 12.8
    build, 1 NVIDIA GPU here, 4.8 GB installed with the nvidia-*, cuda-* …)", or a CUDA
    build on a machine without a GPU."""
    try:
        out = subprocess.run([python, "-c", _TORCH_INFO], capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL, check=True).stdout
        info = json.loads(out)
        if info is None:
            return "no torch: it is not installed here"
        version, cuda_version, needs_nvidia, total = info
    except (OSError, subprocess.SubprocessError, ValueError, TypeError):
        return "torch (its version could not be read)"
    cuda = bool(cuda_version or needs_nvidia) or "+cu" in version
    disk = f"{total / 1e9:.1f} GB" if total >= 1e9 else f"{total / 1e6:.0f} MB"
    if not cuda:
        return f"torch {version} (CPU build, {disk} installed)"
    build = f"CUDA {cuda_version} build" if cuda_version else "CUDA build"
    disk += " installed with the nvidia-*, cuda-* and triton packages"
    try:
        gpus = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        gpus = 0
    if gpus:
        return f"torch {version} ({build}, {gpus} NVIDIA GPU{'s' if gpus > 1 else ''} here, {disk})"
    return (f"torch {version}, a {build} on a machine without an NVIDIA GPU ({disk}): it runs on the CPU "
            f"(the CPU build takes a fifth of the disk: see the README's two commands)")


def run_step(argv: list[str]) -> str | None:
    """Run one set-up command; None when it worked, else the last line it printed."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if proc.returncode == 0:
        return None
    lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit status {proc.returncode}"


def _venv_has_speculators(venv: Path) -> bool:
    return any(venv.glob(f"lib/python*/site-packages/{SPEC_PROBE}"))


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
