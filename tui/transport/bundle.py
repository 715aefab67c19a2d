"""What the client ships to a host as the agent: the `remote` package's files, nvidia-ml-py's
`pynvml.py` beside them, and their content hash (the agent directory's name on the host).
Both links start the agent from it; hostpython.py's start command names `AGENT_MAIN`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from pathlib import Path

from .errors import AgentStartFailed


def default_agent_dir() -> Path:
    """The directory of the `remote` package (repo checkout or installed wheel)."""
    import remote  # the host-side package ships with the client as data

    return Path(remote.__file__).resolve().parent


# nvidia-ml-py's own `pynvml` module travels with the agent under this name: a login's
# python3 rarely has it (vLLM installs it into its own venv), and without it the agent
# reads GPUs by starting nvidia-smi twice a snapshot. The host's own pynvml comes first.
UPLOADED_PYNVML = "uploaded_pynvml.py"


@functools.lru_cache(maxsize=1)
def client_pynvml() -> bytes | None:
    """The client's installed nvidia-ml-py `pynvml.py` (pure Python over the driver's
    libnvidia-ml.so.1), or None where it is not installed."""
    try:
        path = importlib.metadata.distribution("nvidia-ml-py").locate_file("pynvml.py")
        return Path(str(path)).read_bytes()
    except (importlib.metadata.PackageNotFoundError, OSError):
        return None


# The upload keeps the package's shape: `remote/**/*.py` under the agent directory, its
# rooms (`remote/base/`, `remote/run/`, …) with their `__init__.py`, so the host imports
# them as `remote.run.kill`, as the tests and the client do.
AGENT_PACKAGE = "remote"
AGENT_ENTRY = "agent/main.py"  # the agent, started as a file, relative to the package
AGENT_MAIN = f"{AGENT_PACKAGE}/{AGENT_ENTRY}"  # the same, relative to the agent directory


def _sources(agent_dir: Path) -> list[Path]:
    """The package's `*.py`, its subpackages' included, in a stable order (no `__pycache__`)."""
    return sorted(p for p in agent_dir.rglob("*.py") if "__pycache__" not in p.relative_to(agent_dir).parts)


def agent_files(agent_dir: Path) -> dict[str, bytes]:
    """Every `*.py` of the agent package by its path in the upload (`remote/agent/main.py`),
    and nvidia-ml-py's pynvml beside the package (part of the content hash: another
    nvidia-ml-py is another agent version)."""
    files = {f"{AGENT_PACKAGE}/{p.relative_to(agent_dir).as_posix()}": p.read_bytes() for p in _sources(agent_dir)}
    if AGENT_MAIN not in files:
        raise AgentStartFailed(f"no {AGENT_ENTRY} in {agent_dir}")
    nvml = client_pynvml()
    if nvml is not None:
        files[UPLOADED_PYNVML] = nvml
    return files


def agent_sha(files: dict[str, bytes]) -> str:
    """sha256 over the sorted (name, content) pairs, as in docs/architecture.md."""
    h = hashlib.sha256()
    for name in sorted(files):
        # Length-prefix each part so ("ab", "c") and ("a", "bc") hash differently.
        for part in (name.encode(), files[name]):
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
    return h.hexdigest()


_bundles: dict[Path, tuple[tuple[tuple[str, int, int], ...], dict[str, bytes], str]] = {}


def agent_bundle(agent_dir: Path) -> tuple[dict[str, bytes], str]:
    """`agent_files` and their `agent_sha`, read and hashed again only when a file of
    the package changed (name, size or mtime): a fleet starts hundreds of agents from
    the same files (nvidia-ml-py's is read once per process, as `client_pynvml` is)."""
    key = tuple((str(f), st.st_size, st.st_mtime_ns) for f in _sources(agent_dir) for st in [f.stat()])
    hit = _bundles.get(agent_dir)
    if hit is None or hit[0] != key:
        files = agent_files(agent_dir)
        hit = _bundles[agent_dir] = (key, files, agent_sha(files))
    return hit[1], hit[2]
