"""extract.py's output: speculators 0.3.0's training-data files, written atomically.

One data_{i}.pt per sequence is the file torch.save writes for {"input_ids",
"hidden_states", "loss_mask"} (CRC32 fields left 0, as torch does with its
compute_crc32 switch off; torch.load never checks them). Where torch has
torch.serialization.skip_data (torch >= 2.5), torch.save writes only the archive's small
records (pickle, headers; the storages' space left empty) and the tensors' bytes are
then written into their places with os.pwrite straight from the host buffers, so the GIL
is free while the bytes move and the host tensors need not be cloned into storages of
their own. The bytes equal what plain torch.save writes (tests/test_extract_files.py checks).
Every file goes to a temp name that does not end in "pt", is fsynced, then renamed.
Stdlib only at import; torch is imported when files are written."""

from __future__ import annotations

import argparse
import collections
import ctypes
import fcntl
import mmap
import os
import re
import struct
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from extract_common import Fail, Sample, mask_of

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


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temp file in the same directory, fsync, then os.replace."""
    tmp = tmp_path(path)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)  # make the rename itself durable


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
    """torch.save computes a CRC32 of every record while holding the GIL, which halves
    what the writer threads can save together; torch.load never checks it (torch >= 2.6
    has the switch; older versions keep computing it)."""
    try:
        import torch.utils.serialization as ser

        ser.config.save.compute_crc32 = False
    except (ImportError, AttributeError):
        pass



def _record_spans(path: Path) -> Dict[str, Tuple[int, int]]:
    """{record name: (offset of its bytes, size)} of a torch.save archive, from its
    central directory and each record's local header (whose padding aligns the data)."""
    spans = {}
    with open(path, "rb") as f, zipfile.ZipFile(f) as z:
        for info in z.infolist():
            f.seek(info.header_offset)
            header = f.read(30)
            name_len, extra_len = struct.unpack("<HH", header[26:30])
            spans[info.filename] = (info.header_offset + 30 + name_len + extra_len,
                                    info.file_size)
    return spans


def _pwrite_all(fd: int, t: Any, offset: int) -> None:
    """Write contiguous CPU tensor `t`'s bytes at `offset`, from its own memory (no copy;
    the GIL is released during each write)."""
    size = t.numel() * t.element_size()
    view = memoryview((ctypes.c_char * size).from_address(t.data_ptr())).cast("B")
    done = 0
    while done < size:
        done += os.pwrite(fd, view[done:], offset + done)


# Kept small: the writer threads' Python work holds the GIL the main thread needs to
# launch the next forward. Files of one layout share their records' places (bounded;
# cleared when full); the stand-in tensors of every file are views of one anonymous
# mapping whose pages are never touched (allocating them each time cost more than
# writing the bytes).
_SPANS: Dict[Any, Dict[str, Tuple[int, int]]] = {}
_CACHE_MAX = 256
_ARENA: List[Any] = [None]


def _stand_ins(hidden_states: List[Any]) -> List[Any]:
    """Tensors shaped like `hidden_states`, each on a storage of its own (at its own
    offset of the mapping), for the skip_data save: torch.save reads only their shapes."""
    import torch

    sizes = [h.numel() * h.element_size() for h in hidden_states]
    arena = _ARENA[0]
    if arena is None or len(arena) < sum(sizes):
        arena = _ARENA[0] = mmap.mmap(-1, max(sum(sizes), 1 << 28))  # address space only
    out, offset = [], 0
    for h, size in zip(hidden_states, sizes):
        out.append(torch.frombuffer(arena, dtype=h.dtype, count=h.numel(),
                                    offset=offset).view(h.shape))
        offset += size
    return out


def _spans_of(tmp: Path, tensors: List[Any]) -> Dict[str, Tuple[int, int]]:
    """{"data/K": (offset, size)} of the skip_data archive `tmp` holding `tensors` in
    pickling order. torch.save lays out archives of the same archive-name length, tensor
    shapes and dtypes alike, so the places are parsed once per layout (the file's size is
    part of the key, as a check that the layout did not change)."""
    archive = tmp.name.split(".")[0]
    key = (len(archive), tuple((tuple(t.shape), t.dtype) for t in tensors),
           os.path.getsize(str(tmp)))
    got = _SPANS.get(key)
    if got is None:
        prefix = archive + "/"
        got = {name[len(prefix):]: span for name, span in _record_spans(tmp).items()
               if name.startswith(prefix)}
        if len(_SPANS) >= _CACHE_MAX:
            _SPANS.clear()
        _SPANS[key] = got
    return got


def write_sample(path: Path, s: Sample, hidden_states: List[Any], ready: Any) -> None:
    """One data_{i}.pt, as speculators' own generator saves it; runs in a writer thread.
    `hidden_states`: contiguous CPU tensors [seq, hidden] (views of a batch buffer are
    fine); `ready`: a CUDA event the copies into them complete at, or None."""
    import torch

    if ready is not None:
        ready.synchronize()  # the copies to these host tensors are done
    ids = torch.tensor(s.ids, dtype=torch.int64)
    mask = torch.tensor(mask_of(s), dtype=torch.int64)
    tmp = tmp_path(path)
    skip_data = getattr(torch.serialization, "skip_data", None)
    if skip_data is None or not all(h.is_contiguous() for h in hidden_states):
        torch.save(dict(zip(KEYS, (ids, [own_storage(h) for h in hidden_states], mask))),
                    str(tmp))
        fsync_path(tmp)
        os.replace(tmp, path)
        return
    # Stand-ins of the same shapes and dtypes, each on a storage of its own (the loader
    # estimates lengths from file sizes); never touched, so their pages are never
    # allocated. torch.save numbers the storages in pickling order: ids, layers, mask.
    with skip_data():
        torch.save(dict(zip(KEYS, (ids, _stand_ins(hidden_states), mask))), str(tmp))
    spans = _spans_of(tmp, [ids, *hidden_states, mask])
    fd = os.open(str(tmp), os.O_WRONLY)
    try:
        for k, t in enumerate([ids, *hidden_states, mask]):
            offset, size = spans["data/%d" % k]
            if size != t.numel() * t.element_size():
                raise OSError("record data/%d of %s has %d bytes, not %d"
                              % (k, tmp, size, t.numel() * t.element_size()))
            _pwrite_all(fd, t, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


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

