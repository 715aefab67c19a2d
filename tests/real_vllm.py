"""The real-vLLM test tier's environment: vLLM 0.16.0 installed with `pip install --no-deps
--target` into its own cached directory (never the test venv), plus the light
pure-Python (or small compiled) packages its config, scheduler, KV-cache, executor and
worker modules import. tests/test_real_vllm.py runs everything in subprocesses with
PYTHONPATH set to it, ahead of the venv (vLLM 0.16 needs transformers < 5).

The cache is `$EAGLE3_TUI_TEST_CACHE` (or ~/.cache/eagle3-tui-tests)/vllm-0.16.0-pyXY: the
environment is built once, under a file lock, and reused while its `.complete` marker
exists. The wheel (~500 MB) is deleted once installed, and with a CPU torch so are the
wheel's compiled kernels (1.2 GB; every one of them links libcudart, which a CPU torch
does not bring, so none can load there): the tier reads vLLM's Python, never its
kernels, and the environment stays ~0.7 GB instead of 2.4. Without network and without a
cache the tier is skipped with the reason -- except under CI (`CI` set), where that is a
one-line failure.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests import checkout, need, spec_wheel

VLLM = "vllm==0.16.0"
WHEEL = "vllm-0.16.0-cp38-abi3-manylinux_2_31_x86_64.whl"
# What vLLM 0.16.0's modules on the generator's path import, pinned as tested; installed
# --no-deps so that nothing drags in a CUDA torch (torch comes from the test venv).
DEPS = [
    "transformers==4.57.6", "huggingface_hub==0.36.2", "tokenizers==0.22.2",  # vllm: <5
    "requests==2.34.2", "urllib3==2.8.0", "certifi==2026.10.19.post1",
    "charset_normalizer==3.5.3", "psutil==7.2.2", "msgspec==0.23.0", "cachetools==8.0.2",
    "cloudpickle==3.1.3", "blake3==1.0.11", "pyzmq==27.3.0", "cbor2==6.3.0",
    "pybase64==1.5.1", "gguf==0.19.0", "pillow==13.0.0", "py-cpuinfo==9.0.0",
    "aiohttp==3.14.5", "multidict==7.2.1", "yarl==1.25.1", "propcache==0.5.4",
    "frozenlist==1.8.0", "aiosignal==1.4.0", "aiohappyeyeballs==2.7.1", "attrs==26.1.0",
    "prometheus_client==0.26.0", "openai_harmony==0.0.8", "openai==3.57.0", "sniffio==1.3.1",
    "llguidance==1.9.1", "mistral_common==1.13.1", "jsonschema==4.26.0",
    "referencing==0.37.0", "rpds-py==2026.9.1", "jsonschema_specifications==2025.9.1",
    "pydantic_extra_types==2.11.1", "pycountry==26.2.16", "tiktoken==0.14.0",
    "diskcache==5.6.3", "xgrammar==0.1.29", "einops",
]


def env_dir() -> Path:
    return spec_wheel.cache_dir() / f"vllm-0.16.0-py{sys.version_info[0]}{sys.version_info[1]}"


def _pip(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", *args, "--quiet",
                           "--disable-pip-version-check"], capture_output=True, text=True,
                          timeout=900, check=False)
    if proc.returncode != 0:
        lines = [x for x in (proc.stderr or proc.stdout).splitlines()
                 if x.strip() and not x.startswith("WARNING")]
        raise RuntimeError("pip %s failed: %s" % (args[0], lines[-1] if lines else proc.returncode))


def build(root: Path) -> dict[str, float]:
    """Download the wheel (if not cached) and install everything into root/site."""
    times: dict[str, float] = {}
    root.mkdir(parents=True, exist_ok=True)
    t = time.monotonic()
    if not (root / WHEEL).is_file():
        _pip("download", "--no-deps", VLLM, "-d", str(root))
    times["download"] = time.monotonic() - t
    t = time.monotonic()
    tmp = root / "site.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    _pip("install", "--no-deps", "--no-compile", "--target", str(tmp), str(root / WHEEL), *DEPS)
    shutil.rmtree(root / "site", ignore_errors=True)
    tmp.rename(root / "site")
    (root / WHEEL).unlink()
    times["install"] = time.monotonic() - t
    _drop_kernels_cpu_torch_cannot_load(root / "site")
    return times


def _drop_kernels_cpu_torch_cannot_load(site: Path) -> None:
    """Delete vLLM's CUDA kernels (`*.so` under site/vllm) when this interpreter's torch
    is a CPU build: they need libcudart, so importing one fails either way (an
    ImportError, which vLLM's optional imports already handle)."""
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.version.cuda)"],
                           capture_output=True, text=True, timeout=120, check=False)
    if probe.returncode == 0 and probe.stdout.strip() == "None":
        for lib in (site / "vllm").rglob("*.so"):
            lib.unlink()


def _installed(root: Path) -> str:
    """The requirement list the cached environment was built from (rebuilt on a change)."""
    f = root / "requirements.txt"
    return f.read_text() if f.is_file() else ""


def ensure() -> Path:
    """The environment's site directory, built once (file lock) and reused."""
    root = env_dir()
    wanted = "\n".join([VLLM, *DEPS]) + "\n"
    if (root / ".complete").is_file() and _installed(root) == wanted:
        if (root / WHEEL).is_file():  # an environment built before the wheel was dropped
            (root / WHEEL).unlink(missing_ok=True)
            _drop_kernels_cpu_torch_cannot_load(root / "site")
        return root / "site"
    root.mkdir(parents=True, exist_ok=True)
    with open(root.with_name(root.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / ".complete").is_file() or _installed(root) != wanted:
            (root / ".complete").unlink(missing_ok=True)
            why = ""
            try:
                times = build(root)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                why = f"cannot create the vLLM 0.16.0 test environment in {root}: {exc}"
            if why:
                need.missing(why)
            (root / "requirements.txt").write_text(wanted)
            (root / ".complete").write_text(
                "".join(f"{k} {v:.1f}s\n" for k, v in times.items()))
    return root / "site"


def env(site: Path, **extra: str) -> dict[str, str]:
    """Environment for a subprocess that must see the real vLLM first, then the repo."""
    return checkout.env(first=(site,), VLLM_CACHE_ROOT=str(site.parent / "vllm-cache"),
                        VLLM_LOGGING_LEVEL="WARNING", HF_HUB_OFFLINE="1", **extra)
