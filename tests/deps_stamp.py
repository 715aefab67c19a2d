"""What ./tests/run's venv was installed for: a hash of pyproject.toml's dependencies,
extras and scripts (not of the whole file: a change to the pytest or ruff settings
reinstalls nothing) and of the lock it installs, requirements/test.lock, printed for
tests/run's stamp `.venv/.eagle3-test-deps`."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def deps_hash(pyproject: Path) -> str:
    lock = pyproject.parent / "requirements" / "test.lock"
    locked = lock.read_bytes() if lock.is_file() else b""
    if sys.version_info >= (3, 11):
        import tomllib

        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        wanted = [project.get(k) for k in ("requires-python", "dependencies", "optional-dependencies", "scripts")]
        return hashlib.sha256(json.dumps(wanted, sort_keys=True).encode() + locked).hexdigest()
    return hashlib.sha256(pyproject.read_bytes() + locked).hexdigest()  # no tomllib: the whole file


if __name__ == "__main__":
    print(deps_hash(Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml")))
