"""The demo's second stage: train a drafter on the extraction's output (``demo --train``).

After the demo's extraction, this launches speculators 0.3.0's own ``Trainer`` (through
``tui/data/demo_train_drafter.py``) on its output, on the CPU, through the normal launch
path, with its own config (``eagle3-train.toml`` beside the demo's ``eagle3.toml``), so
the dashboard (or ``--headless``) shows a training run: steps, loss, validation, saves.

speculators 0.3.0 needs transformers < 5 (its model code imports modules transformers 5
removed), so the job runs in its own environment, ``train-venv/``: transformers 4.x,
its huggingface_hub and tokenizers, speculators itself and the few packages its
training modules import. torch and the rest come from the user's environment through a
``.pth`` file after the venv's own site directory (the packages installed here shadow
the user's newer ones only inside this venv). Built once, reused while its marker
matches; without network the training stage is unavailable and says why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tui.services.demo import DemoError, DemoPaths, run_step, site_dirs
from tui.services.files import atomic_write

__all__ = ["TRAIN_SCRIPT", "TrainPaths", "build_train", "ensure_train_venv"]

TRAIN_SCRIPT = Path(__file__).resolve().parent.parent / "data" / "demo_train_drafter.py"
TRAIN_PACKAGES = ["transformers>=4.56,<5", "huggingface_hub<1", "tokenizers<0.23", "pydantic>=2",
                  "pydantic-settings", "loguru", "rich"]
SPECULATORS = "speculators==0.3.0"
MARKER = ".eagle3-train-venv"
PTH_NAME = "eagle3-demo-base.pth"
EPOCHS = 2
MAX_FILES = 12  # samples trained on: ~12 steps an epoch, well under a minute on a free CPU


@dataclass(frozen=True)
class TrainPaths:
    config: Path  # eagle3-train.toml
    save: Path  # the drafter's checkpoints
    python: str  # the training environment's interpreter


def _toml(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


def ensure_train_venv(venv: Path, base: str) -> str:
    """``venv``'s python, with speculators 0.3.0 and transformers < 5 importable; raises
    DemoError with the reason when it cannot be made (no network, no pip)."""
    python = venv / "bin" / "python"
    sites = site_dirs(base)
    want = json.dumps({"base": base, "sites": sites, "packages": TRAIN_PACKAGES, "spec": SPECULATORS},
                      sort_keys=True)
    try:
        if (venv / MARKER).read_text(encoding="utf-8") == want and python.exists():
            return str(python)
    except OSError:
        pass
    why = run_step([base, "-m", "venv", "--clear", "--without-pip", str(venv)])
    if why is not None:
        raise DemoError(f"cannot create the training environment {venv} ({why})")
    own = site_dirs(str(python))
    if not own:
        raise DemoError(f"cannot find the site-packages of {venv}")
    lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in sites if d not in own)
    atomic_write(Path(own[0]) / PTH_NAME, lines.encode())
    pip = [base, "-m", "pip", "--python", str(python), "--disable-pip-version-check", "install", "--quiet",
           "--retries", "1", "--timeout", "30"]
    for args in (TRAIN_PACKAGES, ["--no-deps", SPECULATORS]):
        why = run_step(pip + args)
        if why is not None:
            raise DemoError(f"cannot install the training environment's packages ({why})")
    why = run_step([str(python), "-c", "import speculators.train.trainer, transformers"])
    if why is not None:
        raise DemoError(f"the training environment cannot import speculators' trainer ({why})")
    atomic_write(venv / MARKER, want.encode())
    return str(python)


def build_train(paths: DemoPaths, base: str, epochs: int = EPOCHS, max_files: int = MAX_FILES) -> TrainPaths:
    """The training stage's environment and config for a demo whose extraction finished."""
    if not (paths.out / "data_config.json").is_file():
        raise DemoError(f"no finished extraction in {paths.out}: run the demo's extraction first")
    python = ensure_train_venv(paths.root / "train-venv", base)
    save = paths.root / "drafter"
    config = paths.root / "eagle3-train.toml"
    command = [python, str(TRAIN_SCRIPT), str(paths.out), str(paths.model), str(save), str(epochs), str(max_files)]
    text = (
        "# eagle3-tui demo --train: speculators 0.3.0's Trainer on the demo's extraction output (CPU).\n"
        "[host]\n"
        'target = "local"\n'
        f"python = {_toml(base)}\n"
        f"runs_dir = {_toml(str(paths.root / 'runs'))}\n\n"
        "[run]\n"
        'name = "demo-train"\n'
        f"command = [{', '.join(_toml(c) for c in command)}]\n"
        f"cwd = {_toml(str(paths.root))}\n"
        'env = { EAGLE3_DEMO = "1", TORCH_COMPILE_DISABLE = "1", PYTHONPATH = "" }\n'
        f"match = {_toml(str(save))}\n"
    )
    atomic_write(config, text.encode())
    return TrainPaths(config=config, save=save, python=python)
