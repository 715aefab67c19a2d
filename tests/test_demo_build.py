"""tui/services/demo.py: the tiny offline demo model, dataset and eagle3.toml, and that they run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import checkout, need
from tui.protocol.records import RunRecord
from tui.services.config import parse_config
from tui.services.demo import MISSING_DEPS, build_demo

ROOT = Path(__file__).resolve().parent.parent

try:
    import safetensors  # noqa: F401
    import torch
    import transformers  # noqa: F401

    HAVE_ML = True
except ImportError:  # pragma: no cover - depends on the environment
    HAVE_ML = False


def need_ml() -> None:
    """torch, transformers and safetensors, or `need.missing` (a failure under ./tests/run)."""
    if not HAVE_ML:
        need.missing("needs torch, transformers and safetensors: pip install 'eagle3-tui[demo]'")


@pytest.fixture
def ml() -> None:
    need_ml()


def test_default_demo_has_64_shards_and_a_runnable_config(ml: None, tmp_path: Path) -> None:
    from safetensors import safe_open
    from transformers import AutoConfig, LlamaForCausalLM

    paths = build_demo(tmp_path / "demo", patches=False)
    shards = sorted(p.name for p in paths.model.glob("*.safetensors"))
    assert shards == [f"model-{i:05d}-of-00064.safetensors" for i in range(1, 65)]
    index = json.loads((paths.model / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    # Every shard really holds the tensors the index says, and together they are the model.
    held = {}
    for name in shards:
        with safe_open(str(paths.model / name), framework="pt") as f:
            held.update({k: name for k in f.keys()})  # noqa: SIM118 - safe_open is not iterable
    assert held == index["weight_map"]
    config = AutoConfig.from_pretrained(str(paths.model))
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (8, 256, 1024)
    with torch.device("meta"):
        expected = set(LlamaForCausalLM(config).state_dict())
    assert set(held) == expected

    lines = paths.data.read_text().splitlines()
    assert len(lines) == 128
    ids = [json.loads(line)["input_ids"] for line in lines]
    assert {len(x) for x in ids} == {256} and max(max(x) for x in ids) < 1024

    cfg = parse_config(paths.config.read_text(), str(paths.config))
    assert cfg.host.target == "local" and cfg.host.python == sys.executable
    assert cfg.patches.set is None and paths.patches_note is None  # not asked for
    # match: only this demo's own job (its out/ dir), never another extract.py on the host
    assert cfg.run.name == "demo-extract" and cfg.run.match == str(paths.out)
    assert cfg.run.cwd == str(paths.root) and paths.root.is_absolute()
    assert cfg.run.command == paths.command == (
        sys.executable, str(ROOT / "remote" / "extract.py"), "--backend", "hf",
        "--model", str(paths.root / "model"), "--data", str(paths.root / "data.jsonl"),
        "--out", str(paths.root / "out"), "--shard-delay", "0.1")


def _mtimes(d: Path) -> dict[str, int]:
    return {str(p.relative_to(d)): p.stat().st_mtime_ns for p in sorted(d.rglob("*"))
            if p.is_file() and p.name != "eagle3.toml"}


def test_rebuild_reuses_a_complete_demo_and_repairs_or_replaces_others(
        ml: None, tmp_path: Path) -> None:
    small = {"shards": 5, "layers": 2, "hidden": 32, "sequences": 3, "seq_len": 8, "patches": False}
    paths = build_demo(tmp_path, **small)
    before = _mtimes(tmp_path)
    assert build_demo(tmp_path, **small) == paths
    assert _mtimes(tmp_path) == before  # nothing rewritten

    (paths.model / "model-00003-of-00005.safetensors").unlink()
    build_demo(tmp_path, **small)
    assert len(list(paths.model.glob("model-*.safetensors"))) == 5

    build_demo(tmp_path, **{**small, "shards": 3, "layers": 3})
    assert sorted(p.name for p in paths.model.glob("model-*.safetensors")) == [
        f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]
    assert json.loads((paths.model / "config.json").read_text())["num_hidden_layers"] == 3


def test_demo_command_extracts(ml: None, tmp_path: Path) -> None:
    """The exact argv written to eagle3.toml runs to completion, shards on the bar."""
    paths = build_demo(tmp_path, shards=7, layers=7, hidden=32, sequences=10, seq_len=12,
                       shard_delay=0.01, patches=False)
    argv = parse_config(paths.config.read_text()).run.command
    proc = subprocess.run(list(argv), cwd=paths.root, check=False, env=checkout.env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    bars = [line for line in proc.stderr.splitlines() if "checkpoint shards" in line]
    assert bars[-1].startswith("Loading safetensors checkpoint shards: 100% Completed | 7/7 [")
    assert len(bars) == 8
    done = proc.stdout.splitlines()[-1]
    assert re.match(r"^\[extract\] done: 10 sequences, 120 tokens in ", done)
    assert (paths.out / "data_config.json").is_file()
    # clear_out gives a newcomer a fresh run instead of a resumed one.
    build_demo(tmp_path, shards=7, layers=7, hidden=32, sequences=10, seq_len=12,
               shard_delay=0.01, clear_out=True, patches=False)
    assert not paths.out.exists()


def test_import_is_light() -> None:
    code = ("import sys, tui.services.demo; heavy = [m for m in ('textual', 'rich', 'torch', 'transformers')"
            " if m in sys.modules]; print(heavy)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=False, env=checkout.env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_missing_torch_is_one_clear_error(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['torch'] = None\n"  # makes `import torch` raise ImportError
            "from pathlib import Path\nfrom tui.services.demo import build_demo, DemoError\n"
            "try:\n    build_demo(Path(sys.argv[1]))\nexcept DemoError as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "d")], cwd=ROOT, env=checkout.env(),
                          check=False, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == MISSING_DEPS.format(module="torch", python=sys.executable), proc.stderr
    assert not (tmp_path / "d" / "venv").exists()  # no pip work before the clear error
    assert proc.stdout.strip() == (f"the demo needs torch in {sys.executable}: install it with: "
                                   f"{sys.executable} -m pip install torch")


def test_no_venv_means_a_demo_without_patches_and_a_one_line_reason(
        ml: None, tmp_path: Path) -> None:
    """A base python that cannot make the venv (here: it does not exist) leaves the demo
    as before -- no [patches], the base python -- with the reason in patches_note."""
    missing = str(tmp_path / "no-such-python")
    paths = build_demo(tmp_path / "d", shards=2, layers=1, hidden=32, sequences=2, seq_len=4,
                       python=missing)
    assert paths.patch_set is None and paths.python == paths.command[0] == missing
    note = paths.patches_note or ""
    assert note.startswith("cannot create a virtual environment (") and missing in note
    assert "\n" not in note
    cfg = parse_config(paths.config.read_text())
    assert cfg.patches.set is None and cfg.host.python == missing
    assert "[patches]" not in paths.config.read_text()


def test_a_demo_stage_reports_its_newest_run(tmp_path: Path) -> None:
    """`demo --train` run twice in one directory: the second reports its own training run
    (the agent lists runs newest first), not the first one's outcome and exit code."""
    from tui.cli.connect import newest_run

    (tmp_path / "eagle3.toml").write_text(
        f'[host]\nruns_dir = "{tmp_path / "runs"}"\npython = "{sys.executable}"\n'
        f'[run]\nname = "demo-train"\ncommand = ["{sys.executable}", "-c", "pass"]\ncwd = "{tmp_path}"\n'
        "gpu_wait = 0\n")

    def e3(*args: str) -> str:
        res = subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert res.returncode == 0, res.stderr
        return res.stdout

    ids = [json.loads(e3("launch", "local", "--json"))["run_id"] for _ in range(2)]
    runs = json.loads(e3("runs", "local", "--json"))["runs"]
    assert {r["run_id"] for r in runs} == set(ids)
    got = newest_run([RunRecord.parse(r) for r in runs], "demo-train")
    assert got is not None and got.run_id == ids[1]
