"""extract.py's default output, read by the real speculators 0.3.0 and trained on.

1. The loader: speculators' train/data.py, noise_transforms.py and
   distributed_batch_sampler.py from the real 0.3.0 wheel, imported directly (the
   package __init__ pulls in its model registry, which does not import with transformers
   5), set up exactly as its scripts/train.py does: split_files 90/10, the sample-file
   dataset with AddUniformNoise on the training part, the multipack batch sampler over
   the approximate lengths, the collate function. Every sample and every batch is checked
   against an independent forward pass of the tiny Llama.
2. Training: speculators 0.3.0's Eagle-3 draft model, built as scripts/train.py builds
   it, trained on that loader for a few dozen steps on CPU, in a cached environment with
   the real speculators package (tests/spec_train_env.py): the loss is finite and falls.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import need

try:
    import torch
    import transformers
except ImportError as exc:  # pragma: no cover - depends on the environment
    need.missing(f"needs torch and transformers ({exc}): pip install 'eagle3-tui[demo]'")

from tests import spec_wheel
from tests.spec_train_env import train_python
from tui.services.demo import build_demo

ROOT = Path(__file__).resolve().parent.parent
EXTRACT = ROOT / "remote" / "extract.py"
pytestmark = pytest.mark.slow(timeout=1200, reason="the first test builds speculators' training venv (pip downloads "
                              "torch in CI; a 900 s bound) and extracts with a real model on the CPU")
TOTAL_SEQ_LEN = 96  # scripts/train.py --total-seq-len, small enough to pack several
NOISE_STD = 0.05  # scripts/train.py's NOISE_STD
LAYERS = [2, 4, 5, 7]  # speculators' default for 8 layers
LENGTHS = [9, 23, 14, 31, 6, 18, 27, 11, 40, 16, 8, 21, 35, 12, 19, 25, 7, 29, 15, 10]


@pytest.fixture(scope="module")
def extracted(tmp_path_factory: pytest.TempPathFactory):
    """A tiny 8-layer Llama, input lines with and without loss masks, extract.py with
    its defaults (hf backend, CPU)."""
    root = tmp_path_factory.mktemp("specdata")
    paths = build_demo(root / "demo", shards=4, layers=8, hidden=64, sequences=2, seq_len=8,
                       shard_delay=0.0, patches=False)
    rows = []
    for i, n in enumerate(LENGTHS):
        ids = [(11 * i + 17 * t) % 1000 + 3 for t in range(n)]
        mask = [int(t >= n // 3) for t in range(n)] if i % 3 == 0 else None
        rows.append((ids, mask))
    data = root / "data.jsonl"
    data.write_text("".join(
        json.dumps({"input_ids": ids, **({"loss_mask": m} if m else {})}) + "\n"
        for ids, m in rows))
    out = root / "out"
    proc = subprocess.run([sys.executable, str(EXTRACT), "--model", str(paths.model),
                           "--data", str(data), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return paths.model, out, rows


@pytest.fixture(scope="module")
def spec_train(tmp_path_factory: pytest.TempPathFactory):
    """speculators.train.{data,noise_transforms,distributed_batch_sampler} from the real
    0.3.0 wheel, under an empty package __init__; removed from sys.modules afterwards."""
    import zipfile

    site = tmp_path_factory.mktemp("spec-site")
    (site / "speculators" / "train").mkdir(parents=True)
    (site / "speculators" / "__init__.py").write_text("")
    with zipfile.ZipFile(spec_wheel.wheel_path()) as z:
        for name in ("__init__", "data", "noise_transforms", "distributed_batch_sampler"):
            rel = f"speculators/train/{name}.py"
            (site / rel).write_bytes(z.read(rel))
    sys.path.insert(0, str(site))
    try:
        import speculators.train.data as data
        import speculators.train.distributed_batch_sampler as sampler
        import speculators.train.noise_transforms as noise

        assert Path(data.__file__).is_relative_to(site)
        yield data, noise, sampler
    finally:
        sys.path.remove(str(site))
        for name in [m for m in sys.modules if m.split(".")[0] == "speculators"]:
            del sys.modules[name]


def reference(model_dir: Path, rows) -> list[dict[str, torch.Tensor]]:
    """Per sequence, computed alone: the aux layers' outputs (transformers' own
    output_hidden_states) and the last decoder layer's output before the final norm (that
    layer run by hand on the previous layer's output)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir)).float().eval()
    base = model.model
    refs = []
    for ids, _ in rows:
        x = torch.tensor([ids])
        with torch.no_grad():
            hs = model(x, output_hidden_states=True).hidden_states
            pos = torch.arange(len(ids))[None]
            last = base.layers[7](hs[7], attention_mask=None, position_ids=pos,
                                  position_embeddings=base.rotary_emb(hs[7], pos))
            last = last[0] if isinstance(last, tuple) else last
            # the hand-run layer really is the model's last layer: norm(it) == final output
            assert torch.allclose(base.norm(last), hs[8], atol=1e-5)
        refs.append({"aux": torch.cat([hs[L + 1][0] for L in LAYERS[:-1]], dim=-1),
                     "last": last[0]})
    return refs


def test_real_loader_reads_every_sample_exactly(extracted, spec_train) -> None:
    model_dir, out, rows = extracted
    data, noise, sampler_mod = spec_train
    refs = reference(model_dir, rows)
    # scripts/train.py: split_files(args.data_path, ratio=0.9)
    train_files, val_files = data.split_files(str(out), ratio=0.9)
    assert (len(train_files), len(val_files)) == (18, 2)
    assert sorted(p.name for p in train_files + val_files) == sorted(
        f"data_{i}.pt" for i in range(len(rows)))
    for files, add_noise in ((train_files, True), (val_files, False)):
        transform = noise.AddUniformNoise(
            std=NOISE_STD, tensors=("hidden_states", "verifier_last_hidden_states")
        ) if add_noise else None
        ds = data.Eagle3SampleFileDataset(file_list=files, max_len=TOTAL_SEQ_LEN,
                                          transform=transform,
                                          standardize_fn=data.standardize_data_v1)
        assert len(ds) == len(files)
        tol = NOISE_STD + 1e-5 if add_noise else 1e-4
        items = []
        for j, f in enumerate(files):
            i = int(Path(f).stem[5:])
            ids, mask = rows[i]
            n = len(ids)
            item = ds[j]
            items.append(item)
            # shift_batch drops the first token of ids/mask/targets, the last of the inputs
            assert item["input_ids"].dtype == torch.int64
            assert item["input_ids"].tolist() == ids[1:]
            assert item["loss_mask"].dtype == torch.int64
            assert item["loss_mask"].tolist() == (mask or [1] * n)[1:]
            assert item["lengths"].tolist() == [n - 1]
            assert item["position_ids"].tolist() == list(range(1, n))
            assert item["hidden_states"].dtype == torch.float32
            assert item["hidden_states"].shape == (n - 1, 3 * 64)
            assert item["verifier_last_hidden_states"].shape == (n - 1, 64)
            assert (item["hidden_states"] - refs[i]["aux"][:-1]).abs().max() <= tol
            assert (item["verifier_last_hidden_states"] - refs[i]["last"][1:]).abs().max() <= tol
            if add_noise:  # the transform did run
                assert not torch.equal(item["hidden_states"], refs[i]["aux"][:-1])
        # The loader estimates lengths from file sizes, so each sample must be on its own
        # storage: the size grows by exactly 4 layers x 64 x 4 bytes + 2 x 8 per token
        # (records are aligned to 64 bytes: 6 records, at most 63 bytes of padding each).
        true = [len(rows[int(Path(f).stem[5:])][0]) for f in files]
        rest = [Path(f).stat().st_size - 1040 * n for f, n in zip(files, true)]
        assert max(rest) - min(rest) <= 6 * 64, rest
        for a, n_a in zip(ds.approx_lengths, true):
            for b, n_b in zip(ds.approx_lengths, true):
                assert n_a >= n_b or a <= b
        # scripts/train.py's sampler and collate
        batch_sampler = sampler_mod.MultipackDistributedBatchSamplerV2(
            batch_max_length=TOTAL_SEQ_LEN, lengths=ds.approx_lengths, num_replicas=1, rank=0)
        collate = data.create_collate_fn(TOTAL_SEQ_LEN)
        seen = []
        for idx in batch_sampler:
            batch = collate([ds[k] for k in idx]) if add_noise else collate([items[k] for k in idx])
            assert batch["input_ids"].shape == (1, TOTAL_SEQ_LEN)
            assert batch["hidden_states"].shape == (1, TOTAL_SEQ_LEN, 3 * 64)
            assert batch["verifier_last_hidden_states"].shape == (1, TOTAL_SEQ_LEN, 64)
            lens, cum = [], 0  # the collate keeps lengths while they fit, cutting the last
            for k in idx:
                n = len(rows[int(Path(files[k]).stem[5:])][0]) - 1
                if n + cum >= TOTAL_SEQ_LEN:
                    lens.append(TOTAL_SEQ_LEN - cum)
                    break
                lens.append(n)
                cum += n
            assert batch["lengths"].tolist() == lens
            want_ids = [t for k in idx for t in rows[int(Path(files[k]).stem[5:])][0][1:]]
            want_ids = want_ids[:TOTAL_SEQ_LEN]
            assert batch["input_ids"][0].tolist() == want_ids + [0] * (TOTAL_SEQ_LEN - len(want_ids))
            if not add_noise:
                want = torch.cat([items[k]["hidden_states"] for k in idx])[:TOTAL_SEQ_LEN]
                assert torch.equal(batch["hidden_states"][0, : len(want)], want)
            seen += list(idx)
        assert sorted(seen) == list(range(len(files)))  # every sample in some batch


def test_real_speculators_trains_an_eagle3_drafter_on_it(extracted) -> None:
    model_dir, out, _ = extracted
    python = train_python()
    env = dict(os.environ, TORCH_COMPILE_DISABLE="1", PYTHONPATH="")
    proc = subprocess.run([str(python), str(ROOT / "tests" / "speculators_train_smoke.py"),
                           str(out), str(model_dir), "30"], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    losses = result["losses"]
    assert result["train_files"] == 18 and len(losses) == 30
    assert all(math.isfinite(x) for x in losses), losses
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.5 * first, losses


def test_a_demo_run_loads_in_the_real_loader(spec_train, tmp_path: Path) -> None:
    """The demo's own eagle3.toml command, as launched: its output is training data."""
    from tui.services.config import parse_config

    data, _, _ = spec_train
    paths = build_demo(tmp_path / "demo", shards=8, layers=8, hidden=32, sequences=12,
                       seq_len=16, shard_delay=0.0, patches=False)
    argv = parse_config(paths.config.read_text()).run.command
    proc = subprocess.run(list(argv), cwd=paths.root, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    train_files, val_files = data.split_files(str(paths.out), ratio=0.9)
    assert len(train_files) + len(val_files) == 12
    ds = data.Eagle3SampleFileDataset(datapath=str(paths.out), max_len=64)
    assert len(ds) == 12
    for j in range(len(ds)):
        item = ds[j]
        assert item["hidden_states"].shape == (15, 3 * 32)
        assert item["verifier_last_hidden_states"].shape == (15, 32)
        assert item["loss_mask"].tolist() == [1] * 15
