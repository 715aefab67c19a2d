"""remote/extraction/preflight.py against real vLLM releases other than 0.16.0 (CI covers 0.16.0 in
tests/test_real_vllm.py; ~500 MB per wheel is too much for every CI run).

    python bench/preflight_versions.py 0.11.0 0.16.0 0.17.1

For each version: the wheel is downloaded once (pip download --no-deps) into the test
cache, only its vllm/**.py files are unpacked (no compiled parts), and preflight runs with
them first on PYTHONPATH, ahead of the tier's environment for the light dependencies
(tests/real_vllm.py builds it). Checked: pristine speculators 0.3.0 and the set's latest
version. Prints every check line, then one line per version and state.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import real_vllm, spec_wheel  # noqa: E402
from tui.state import patches as P  # noqa: E402

GEN = "data_generation/vllm_hidden_states_generator.py"


def sources(version: str) -> Path:
    """vllm/**.py of the release, unpacked once into the test cache."""
    out = spec_wheel.cache_dir() / f"vllm-src-{version}"
    if (out / ".complete").is_file():
        return out
    wheels = spec_wheel.cache_dir() / "vllm-wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = list(wheels.glob(f"vllm-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        f"vllm=={version}", "-d", str(wheels)], check=True, timeout=900)
        found = list(wheels.glob(f"vllm-{version}-*.whl"))
    with zipfile.ZipFile(found[0]) as z:
        for name in z.namelist():
            if name.startswith("vllm/") and name.endswith(".py"):
                z.extract(name, out)
    # vLLM 0.11's scheduler and executor modules import these at module level (0.16's
    # don't, so the tier's environment lacks them); fastapi pinned before its
    # opentelemetry dependency.
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(out), "setproctitle", "fastapi==0.115.12", "starlette==0.46.2"],
                   check=True, timeout=300)
    (out / ".complete").write_text("")
    return out


def main(versions: list[str]) -> int:
    site = real_vllm.ensure()
    pset = P.load_set_dir(P.bundled_sets_dir() / "speculators-0.3.0-vllm-0.16")
    pristine = spec_wheel.pristine_files()
    latest = P.version_order(pset)[-1]
    summary = []
    with tempfile.TemporaryDirectory() as tmp:
        gens = {}
        for state, files in (("pristine", pristine),
                             (latest, P.build_version(pset, latest, pristine))):
            d = Path(tmp) / state / "data_generation"
            d.mkdir(parents=True)
            for rel, data in files.items():
                (d.parent / rel).write_bytes(data)
            gens[state] = d.parent / GEN
        for version in versions:
            src = [] if version == "0.16.0" else [str(sources(version))]
            env = real_vllm.env(site)
            env["PYTHONPATH"] = ":".join(src + [env["PYTHONPATH"]])
            for state, gen in gens.items():
                t = time.monotonic()
                proc = subprocess.run([sys.executable, str(ROOT / "remote" / "extraction" / "preflight.py"),
                                       "--generator-file", str(gen)], capture_output=True,
                                      text=True, timeout=900, env=env, check=False)
                lines = [x for x in proc.stdout.splitlines() if x.startswith("[preflight]")]
                print(f"== vllm {version}, speculators {state} "
                      f"(exit {proc.returncode}, {time.monotonic() - t:.1f} s)")
                print("\n".join(lines) or proc.stderr[-2000:])
                fails = [re.sub(r"^\[preflight\] FAIL ", "", x) for x in lines if " FAIL " in x]
                summary.append(f"vllm {version} + {state}: " + (
                    "all checks pass" if proc.returncode == 0 and not fails else
                    f"{len(fails)} skew(s)"))
                summary += [f"    {x}" for x in fails]
    print("\n".join(["", "summary:"] + summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["0.11.0", "0.16.0", "0.17.1"]))
