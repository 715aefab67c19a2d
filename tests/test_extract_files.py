"""remote/extraction/files.py writes each data_{i}.pt itself (the archive laid out by
remote/extraction/zip.py, written with one writev from the host buffers): the files must be
the very bytes plain torch.save writes, and load as speculators loads them."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import need

torch = need.module("torch", "pip install 'eagle3-tui[demo]'")

ROOT = Path(__file__).resolve().parent.parent
REMOTE = ROOT / "remote"

from remote.extraction import files as extract_files  # noqa: E402
from remote.extraction import zip as extract_zip  # noqa: E402
from remote.extraction.common import Sample  # noqa: E402
from tui.transport.bundle import agent_files  # noqa: E402


@pytest.fixture(autouse=True)
def _crc_off():
    """extract.py turns torch.save's CRC32 off for the whole run; so does the reference."""
    import torch.utils.serialization as ser

    before = ser.config.save.compute_crc32
    ser.config.save.compute_crc32 = False
    yield
    ser.config.save.compute_crc32 = before


def _write_both(ours: Path, ref: Path, lengths: list[int], hidden: int, layers: int,
                dtype: torch.dtype) -> None:
    """Rows of one padded batch buffer (as the CUDA path hands them over: views, not
    clones) written by write_sample, and torch.save of cloned tensors; then compared."""
    ours.mkdir()
    ref.mkdir()
    g = torch.Generator().manual_seed(5)
    bufs = [torch.randn(len(lengths), max(lengths), hidden, generator=g).to(dtype)
            for _ in range(layers)]
    for i, n in enumerate(lengths):
        ids = [(7 * i + 3 * t) % 1000 for t in range(n)]
        mask = None if i % 2 else [t % 3 % 2 for t in range(n)]
        s = Sample(ids, mask)
        rows = [b[i, :n] for b in bufs]
        name = "data_%d.pt" % (i * 37)  # archive names of different lengths
        extract_files.write_sample(ours / name, s, rows, None)
        torch.save({"input_ids": torch.tensor(ids, dtype=torch.int64),
                    "hidden_states": [r.clone() for r in rows],
                    "loss_mask": torch.tensor(mask or [1] * n, dtype=torch.int64)},
                   str(ref / name))
        assert (ours / name).read_bytes() == (ref / name).read_bytes(), name
        d = torch.load(str(ours / name), mmap=True, weights_only=True, map_location="cpu")
        assert list(d) == extract_files.KEYS and d["input_ids"].tolist() == ids
        assert d["loss_mask"].tolist() == (mask or [1] * n)
        for h, r in zip(d["hidden_states"], rows):
            assert torch.equal(h, r) and h.dtype == dtype
            assert h.untyped_storage().nbytes() == n * hidden * h.element_size()
        assert extract_files.sample_ok(ours / name, s, layers, hidden, dtype)
    assert sorted(os.listdir(ours)) == sorted(os.listdir(ref))  # no temp file left


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_sample_files_are_torch_save_bytes(tmp_path: Path, dtype: torch.dtype) -> None:
    """Every length gets its own layout (one- and two-byte ints in the pickle, paddings
    of every record), laid out by hand, not by torch.save."""
    extract_files.LAYOUTS.clear()
    lengths = [37, 1, 512, 200, 37, 63, 64, 65, 255, 256, 300, 1000]
    _write_both(tmp_path / "ours", tmp_path / "ref", lengths, 24, 4, dtype)
    assert list(extract_files.LAYOUTS) == [(str(dtype), 4, 24)]  # made once, reused
    assert isinstance(extract_files.LAYOUTS[(str(dtype), 4, 24)], extract_zip.Layout)


def test_long_sequences_and_other_layer_counts(tmp_path: Path) -> None:
    """Four-byte ints in the pickle (over 65,535 tokens), and any number of layers."""
    _write_both(tmp_path / "ours", tmp_path / "ref", [70000, 3], 5, 6, torch.bfloat16)
    assert extract_files.LAYOUTS[("torch.bfloat16", 6, 5)] is not None


def test_where_torch_writes_other_bytes_torch_save_writes_them(tmp_path: Path) -> None:
    """With torch's CRC32 on, torch.save's bytes are not what extract_zip lays out: the
    layout check finds that, and the files are torch.save's own (CRCs and all)."""
    import torch.utils.serialization as ser

    extract_files.LAYOUTS.clear()
    ser.config.save.compute_crc32 = True
    _write_both(tmp_path / "ours", tmp_path / "ref", [37, 5], 24, 4, torch.bfloat16)
    assert extract_files.LAYOUTS == {("torch.bfloat16", 4, 24): None}
    extract_files.LAYOUTS.clear()


def test_templates_give_the_bytes_laid_out_per_file(tmp_path: Path) -> None:
    """A template per (length, name length), filled with each file's name, gives the bytes
    the per-file layout gave for every name (digits of any count) and length class; the
    files are torch.save's, and one template serves every name of its length."""
    extract_files.LAYOUTS.clear()
    layout = extract_zip.Layout.make(torch.bfloat16, 4, 24)
    assert layout is not None
    for n in (1, 37, 255, 256, 300, 65535, 65536):
        for i in (0, 9, 10, 4711, 123456789):
            name = "data_%d" % i
            filled = extract_zip.fill(layout.template(n, len(name)), name.encode())
            assert filled == layout.pieces(name, n), (n, name)
    assert (300, len("data_4711")) in layout._templates
    _write_both(tmp_path / "ours", tmp_path / "ref", [37, 37, 37, 5, 300], 24, 4,
                torch.bfloat16)
    made = extract_files.LAYOUTS[("torch.bfloat16", 4, 24)]
    # data_0, data_37, data_74, data_111, data_148: data_37 and data_74 share a template
    assert sorted(made._templates) == [(5, 8), (37, 6), (37, 7), (300, 8)]


def test_a_stand_in_name_found_elsewhere_lays_out_each_file(tmp_path: Path,
                                                            monkeypatch) -> None:
    """A template's split points are where the stand-in name landed: where the stand-in
    also occurs in other bytes ("P" in every zip signature), the check against a second
    stand-in finds it, and the file is laid out for its own name (same bytes)."""
    monkeypatch.setattr(extract_zip, "STAND_INS", ("P", "Q"))
    extract_files.LAYOUTS.clear()
    layout = extract_zip.Layout.make(torch.bfloat16, 4, 24)
    assert layout.template(37, 1) is None
    assert layout.template(37, 6) is not None  # "PPPPPP" occurs nowhere else
    (tmp_path / "d").mkdir()
    ours, ref = tmp_path / "d" / "x.pt", tmp_path / "ref.pt"
    rows = [torch.randn(37, 24).to(torch.bfloat16) for _ in range(4)]
    extract_files.write_sample(ours, Sample(list(range(37)), None), rows, None)
    assert extract_files.LAYOUTS[("torch.bfloat16", 4, 24)]._templates[(37, 1)] is None
    torch.save({"input_ids": torch.arange(37), "hidden_states": rows,
                "loss_mask": torch.ones(37, dtype=torch.int64)}, str(tmp_path / "d" / "x.tmp"))
    os.replace(tmp_path / "d" / "x.tmp", ref)
    assert ours.read_bytes() == ref.read_bytes()
    extract_files.LAYOUTS.clear()


def test_writev_all_finishes_a_short_write(tmp_path: Path, monkeypatch) -> None:
    """The kernel may write less than asked; the rest follows where it stopped."""
    real = os.writev
    monkeypatch.setattr(os, "writev", lambda fd, bufs: real(fd, [bytes(bufs[0])[:3]]))
    fd = os.open(str(tmp_path / "f"), os.O_WRONLY | os.O_CREAT)
    try:
        extract_files.writev_all(fd, [b"abcdefgh", b"", memoryview(b"ij"), bytearray(b"k")])
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"abcdefghijk"


def test_extract_modules_ship_with_the_agent() -> None:
    """The client uploads the remote package; every module extract.py and its modules
    import is among those files, with each package's __init__.py, so the job runs from the
    upload directory."""
    files = agent_files(REMOTE)
    seen, todo = set(), ["remote.extract"]
    while todo:
        name = todo.pop()
        seen.add(name)
        parts = name.split(".")
        for i in range(1, len(parts)):  # importing remote.x.y runs remote/__init__, remote/x/__init__
            assert "/".join(parts[:i]) + "/__init__.py" in files, name
        tree = ast.parse(files["/".join(parts) + ".py"])
        for node in ast.walk(tree):  # `from remote.x import y`: y is a module or a name of remote.x
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("remote"):
                for mod in [node.module] + ["%s.%s" % (node.module, a.name) for a in node.names]:
                    if mod.replace(".", "/") + ".py" in files and mod not in seen:
                        todo.append(mod)
    assert {"remote.extraction." + m for m in ("common", "files", "input", "hf", "vllm", "zip", "preflight")} <= seen
    assert {m.split(".")[1] for m in seen} <= {"extract", "extraction", "base"}  # the job's rooms only
    assert all(len(files[m.replace(".", "/") + ".py"].splitlines()) < 500 for m in seen)


def test_extract_modules_import_with_the_standard_library_only() -> None:
    """The job's modules load torch, transformers and vLLM only when used: --help,
    --preflight and bad-input errors work on a host Python without them."""
    code = ("import sys; sys.path.insert(0, %r); from remote import extract; "
            "from remote.extraction import common, files, hf, input, preflight, vllm, zip; "
            "print(sorted({m.split('.')[0] for m in "
            "sys.modules} & {'torch', 'transformers', 'safetensors', 'vllm', 'speculators', "
            "'numpy'}))" % str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
