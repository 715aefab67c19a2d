"""A cached virtual environment holding the real speculators 0.3.0 package, for training.

speculators 0.3.0's package __init__ imports its model registry, which needs the
transformers it was released against (4.x: `transformers.modeling_attn_mask_utils` is
gone in 5). The test environment keeps its own transformers, so the training smoke test
runs in this separate environment: torch 2.13.0 (the pinned CPU build), transformers
>= 4.56, < 5, speculators 0.3.0 (--no-deps: its deepspeed, accelerate and vLLM needs are
not needed to build and train the draft model on CPU) and the few packages its model
code imports (datasets: its vocab_mapping module imports it).

torch is not installed a second time: like the demo's venv (tui/services/demo.py), the
environment gets a `.pth` file that adds the test venv's site directories after its own,
so the test venv's torch 2.13.0 satisfies the pin (a CPU torch is ~1 GB, a CUDA one ~5 GB)
while the environment's own transformers 4.x and friends come first on its path.

It lives in `$EAGLE3_TUI_TEST_CACHE` or `~/.cache/eagle3-tui-tests` (see spec_wheel),
built once under a file lock (parallel test runs wait for one build) and reused while
its marker matches. Without network the tests that need it skip with the reason --
except under CI (`CI` set), where that is a failure.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests import need
from tests.spec_wheel import cache_dir
from tui.services.demo import site_dirs

PACKAGES = ["torch==2.13.0", "transformers>=4.56,<5", "pydantic>=2", "pydantic-settings",
            "loguru", "numpy", "safetensors", "tqdm", "pyyaml", "huggingface_hub", "datasets>=4"]
SPECULATORS = "speculators==0.3.0"
MARKER = ".eagle3-train-env"
PTH_NAME = "eagle3-test-venv.pth"
TIMEOUT = 900  # seconds for the whole build (pip downloads torch the first time in CI)


def _fail(why: str) -> None:
    need.missing(why)


def train_python() -> Path:
    """The environment's python, building the environment first if needed."""
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    env = root / "speculators-0.3.0-train"
    python = env / "bin" / "python"
    sites = site_dirs(sys.executable)
    want = json.dumps({"base": sys.version.split()[0], "packages": PACKAGES, "sites": sites,
                       "speculators": SPECULATORS}, sort_keys=True)
    with open(root / "speculators-0.3.0-train.lock", "w") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # another test run may be building it
        try:
            if (env / MARKER).read_text() == want and python.exists():
                return python
        except OSError:
            pass
        shutil.rmtree(env, ignore_errors=True)
        pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
               "--disable-pip-version-check"]
        steps = [[sys.executable, "-m", "venv", "--without-pip", str(env)],
                 "pth",
                 pip + PACKAGES,
                 pip + ["--no-deps", SPECULATORS]]
        for argv in steps:
            if argv == "pth":  # the test venv's packages after the environment's own
                own = site_dirs(str(python))
                lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in sites if d not in own)
                (Path(own[0]) / PTH_NAME).write_text(lines)
                continue
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT,
                                      stdin=subprocess.DEVNULL, check=False)
            except subprocess.TimeoutExpired:
                _fail(f"building the speculators 0.3.0 training environment timed out: {argv[:6]}")
            if proc.returncode != 0:
                last = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
                _fail(f"cannot build the speculators 0.3.0 training environment: {last}")
        (env / MARKER).write_text(want)
    return python
