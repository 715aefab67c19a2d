"""extract.py's output: speculators 0.3.0's training-data files, written atomically.

One data_{i}.pt per sequence holds the bytes torch.save writes for {"input_ids",
"hidden_states", "loss_mask"} (CRC32 fields left 0, as torch does with its compute_crc32
switch off; torch.load never checks them). The archive's small records are laid out by
zip.py for the sample's length, and the whole file is written with one writev,
the tensors' bytes straight from the host buffers: the GIL is free while the bytes move,
and the host tensors need not be cloned into storages of their own. Where torch.save
would write other bytes than zip.py lays out, every file goes through torch.save
itself. tests/test_extract_files.py checks the bytes against plain torch.save.
Every file goes to a temp name that does not end in "pt", is fsynced, then renamed.
Stdlib only at import; torch is imported when files are written."""

from __future__ import annotations

import argparse
import array
import collections
import ctypes
import fcntl
import os
import re
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from remote.extraction.common import Fail, Sample, mask_of
from remote.extraction.zip import Layout, fill

SAMPLE_FILE = "data_%d.pt"
TOKEN_FREQ_FILE = "token_freq.pth"
CONFIG_FILE = "data_config.json"
KEYS = ["input_ids", "hidden_states", "loss_mask"]
TMP_RE = re.compile(r"\.tmp-\d+$")


def tmp_path(final: Path) -> Path:
    """data_7.pt -> data_7.tmp-PID: no name ending in "pt" while incomplete (speculators'
    loader takes every such name), and torch.save names the archive inside after the part
    before the last dot, "data_7", as it does for data_7.pt."""
    return final.with_name("%s.tmp-%d" % (final.name.split(".")[0], os.getpid()))


def fsync_path(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_out_dir(out: Path) -> Any:
    """Hold an exclusive lock on OUT for the whole run; remove temp files of dead runs."""
    out.mkdir(parents=True, exist_ok=True)
    fh = open(out / ".extract.lock", "a")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise Fail("another extract.py is writing to %s (lock held)" % out) from None
    for p in out.iterdir():
        if TMP_RE.search(p.name):
            p.unlink()  # left by a killed run; we hold the lock, so nobody is writing it
    return fh


def own_storage(t: Any) -> Any:
    """`t` alone on its storage: torch.save writes a view's whole storage, and the loader
    estimates each sample's length from its file size."""
    t = t.contiguous()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone()
    return t


def sample_ok(path: Path, s: Sample, n_layers: int, hidden: int, dtype: Any) -> bool:
    """Is the existing data_{i}.pt complete and made from exactly this sequence?"""
    import torch

    try:
        d = torch.load(str(path), mmap=True, weights_only=True, map_location="cpu")
        if not isinstance(d, dict) or list(d) != ["input_ids", "hidden_states", "loss_mask"]:
            return False
        ids, hs, mask = d["input_ids"], d["hidden_states"], d["loss_mask"]
        n = len(s.ids)
        return (ids.dtype == torch.int64 and ids.tolist() == s.ids
                and mask.dtype == torch.int64 and mask.tolist() == mask_of(s)
                and isinstance(hs, list) and len(hs) == n_layers
                and all(h.dtype == dtype and tuple(h.shape) == (n, hidden) for h in hs))
    except Exception:  # unreadable or foreign: recompute it
        return False


def skip_crc32(torch: Any) -> None:
    """Off: torch.save's CRC32 of every record, which torch.load never checks. With it
    on, torch.save's bytes are not what zip.py lays out (CRC fields 0), and every
    file would go through torch.save (torch >= 2.6 has the switch)."""
    try:
        import torch.utils.serialization as ser

        ser.config.save.compute_crc32 = False
    except (ImportError, AttributeError):
        pass


def _memory_of(t: Any) -> memoryview:
    """Contiguous CPU tensor `t`'s bytes, in its own memory (no copy)."""
    size = t.numel() * t.element_size()
    return memoryview((ctypes.c_char * size).from_address(t.data_ptr())).cast("B")


def writev_all(fd: int, pieces: List[Any]) -> None:
    """Write `pieces` (bytes-like) one after the other from the file's start: one
    writev, more only where the kernel writes less (the GIL is free meanwhile)."""
    views = [memoryview(p).cast("B") for p in pieces]
    while views:
        done = os.writev(fd, views[:IOV_MAX])
        while views and done >= len(views[0]):
            done -= len(views.pop(0))
        if views and done:
            views[0] = views[0][done:]


# The zip layout per (dtype, layers, hidden): made once, None where torch.save writes
# something else (zip.py says when), then every file goes through torch.save.
LAYOUTS: Dict[Tuple[str, int, int], Optional[Layout]] = {}
_LAYOUTS_LOCK = threading.Lock()
IOV_MAX = 1024


def _layout(h: Any, n_layers: int) -> Optional[Layout]:
    key = (str(h.dtype), n_layers, h.shape[-1])
    with _LAYOUTS_LOCK:
        if key not in LAYOUTS:
            LAYOUTS[key] = Layout.make(h.dtype, n_layers, h.shape[-1])
        return LAYOUTS[key]


def write_sample(path: Path, s: Sample, hidden_states: List[Any], ready: Any) -> None:
    """One data_{i}.pt, as speculators' own generator saves it; runs in a writer thread.
    `hidden_states`: CPU tensors [seq, hidden] (views of a batch buffer are fine);
    `ready`: a CUDA event the copies into them complete at, or None. The file is laid out
    by zip.py and written with one writev straight from these tensors."""
    import torch

    if ready is not None:
        ready.synchronize()  # the copies to these host tensors are done
    n = len(s.ids)
    ids, mask = array.array("q", s.ids), array.array("q", mask_of(s))
    final = os.fspath(path)
    head, _, base = final.rpartition(os.sep)
    stem = base.split(".")[0]  # torch's archive name
    tmp = "%s%s%s.tmp-%d" % (head, os.sep if head else "", stem, os.getpid())  # tmp_path()
    layout = _layout(hidden_states[0], len(hidden_states))
    try:
        if layout is None or ids.itemsize != 8 or not all(
                h.is_contiguous() and tuple(h.shape) == (n, layout.hidden)
                and h.dtype == hidden_states[0].dtype for h in hidden_states):
            raise ValueError("not laid out here")
        name = stem.encode()
        template = layout.template(n, len(name))
        pieces = fill(template, name) if template else layout.pieces(stem, n)
    except ValueError:
        torch.save(dict(zip(KEYS, (torch.tensor(s.ids, dtype=torch.int64),
                                   [own_storage(h) for h in hidden_states],
                                   torch.tensor(mask_of(s), dtype=torch.int64)))), tmp)
        fsync_path(Path(tmp))
        os.replace(tmp, final)
        return
    tensors = [ids, *[_memory_of(h) for h in hidden_states], mask]
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        writev_all(fd, [p if isinstance(p, bytes) else tensors[p] for p in pieces])
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)


def save_token_freq(path: Path, samples: Sequence[Sample]) -> int:
    """{token id: count} over the tokens whose loss_mask is 1, as speculators'
    save_token_frequency_distribution writes it; keys ascending (byte-stable)."""
    import torch

    counts: collections.Counter[int] = collections.Counter()
    for s in samples:
        counts.update(t for t, m in zip(s.ids, mask_of(s)) if m)
    tmp = tmp_path(path)
    torch.save({t: counts[t] for t in sorted(counts)}, str(tmp))
    fsync_path(tmp)
    os.replace(tmp, path)
    return sum(counts.values())


def data_config(args: argparse.Namespace, model_dir: Path, cfg: Dict[str, Any],
                 layers: List[int], dtype_name: str, samples: Sequence[Sample],
                 truncated: int, masked_tokens: int) -> Dict[str, Any]:
    """What speculators' generator writes as data_config.json, in its layout where the
    fields are the same (no timestamp: the output must be byte-identical across runs)."""
    hidden = cfg["hidden_size"]
    return {
        "version": "2.0",
        "generator": "eagle3-tui remote/extract.py --backend %s" % args.backend,
        "model": {"target_model_path": str(model_dir), "tensor_parallel_size": args.tp,
                  "hidden_size": hidden, "num_hidden_layers": cfg["num_hidden_layers"]},
        "data": {"train_data_path": str(Path(args.data).resolve()),
                 "seq_length": args.max_seq_len, "num_samples": len(samples),
                 "num_tokens": sum(len(s.ids) for s in samples), "truncated": truncated,
                 "loss_mask_from_input": any(s.mask is not None for s in samples)},
        "hidden_states": {"layer_ids": layers, "dtype": dtype_name,
                          "trainable": not args.raw or (
                              len(layers) == 4 and layers[-1] == cfg["num_hidden_layers"] - 1),
                          "description": "decoder-layer outputs before the final norm "
                                         "(hidden + residual): aux layers, then the last"},
        "token_freq": {"file": TOKEN_FREQ_FILE, "masked_tokens": masked_tokens},
        "format": {
            "file_pattern": "data_{idx}.pt",
            "data_format_version": 1,
            "schema": {
                "input_ids": {"dtype": "torch.long", "shape": "[seq_len]"},
                "hidden_states": {"dtype": "list[torch.%s]" % dtype_name,
                                  "shape": "list of [seq_len, %d]" % hidden,
                                  "num_tensors": len(layers)},
                "loss_mask": {"dtype": "torch.long", "shape": "[seq_len]",
                              "description": "1 for tokens to train on (all ones when the "
                                             "input has no loss_mask)"},
            },
        },
    }

