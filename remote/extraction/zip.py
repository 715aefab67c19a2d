"""The bytes torch.save writes for one training sample, laid out by hand for any length.

files.py writes each data_{i}.pt with one writev: the archive's small records
from here and the tensors' bytes straight from the host buffers. Calling torch.save per
file instead (pickling, its zip writer, then finding where the tensors went) held the
GIL the main thread needs to launch the next forward, and its layout, cached per length,
was new for almost every file when lengths vary.

Hand-written here, copying what torch's writer (PyTorchStreamWriter on miniz) does:
  - the zip container: per record a local header (no sizes; flags 0x0808) whose "FB"
    extra field pads the record's bytes to the storage alignment, the bytes, a data
    descriptor (CRC 0: extract.py turns torch's CRC32 off); then the central directory,
    the zip64 end record and its locator, the end record. Files of 4 GiB or more need
    zip64 fields and are not laid out here.
  - data.pkl: the dict pickled as torch.save pickles it (protocol 2; each tensor as
    torch._utils._rebuild_tensor_v2 of a storage given by persistent id).
Taken from torch itself: the other records (.format_version, .storage_alignment,
byteorder, version, .data/serialization_id), their order and the alignment, read from a
torch.save of a one-token template of the same dtype, layer count and hidden size.
Layout.make() then lays out a 300-token template and compares it with torch.save's bytes;
where torch writes anything else (another torch version, CRC32 on) it returns None and
the caller falls back to torch.save. Stdlib only at import; torch is imported in make()."""

from __future__ import annotations

import collections
import io
import pickle
import struct
import zipfile
from typing import Any, Dict, List, Optional, Tuple, Union

LOCAL = struct.Struct("<IHHHHHIIIHH")
DESCRIPTOR = struct.Struct("<IIII")
CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
ZIP64_END = struct.Struct("<IQHHIIQQQQ")
ZIP64_LOCATOR = struct.Struct("<IIQI")
END = struct.Struct("<IHHHHIIH")
FLAGS = 0x0808  # sizes in a data descriptor after the bytes; names in UTF-8
ZIP32_MAX = 0xFFFFFFFF
# torch's storage classes by dtype, as its pickles name them (the dtypes extract.py writes).
STORAGE_TYPES = {"torch.int64": "LongStorage", "torch.float32": "FloatStorage",
                 "torch.bfloat16": "BFloat16Storage", "torch.float16": "HalfStorage"}
KEYS = ("input_ids", "hidden_states", "loss_mask")
PICKLES_MAX = 1 << 16  # lengths whose data.pkl is kept (~600 bytes each)
TEMPLATES_MAX = 1 << 14  # (length, name length) whose archive template is kept (~2 KB each)
# Two archive names of a length that no other byte of an archive depends on: a template's
# split points are where the first lands, checked against an archive named by the second.
STAND_INS = ("\x7f", "~")
CHECK_LEN = 300  # a second template: two-byte ints in the pickle, other paddings

# A piece of an archive: bytes to write as they are, or k: the bytes of tensor k (in
# storage order: input_ids, the layers, loss_mask), which the caller writes.
Piece = Union[bytes, int]
# The archive of one length for any name of one length: each bytes piece split where the
# archive's name goes (name.join(chunks) gives it back), the tensors' k as they are.
Template = List[Union[Tuple[bytes, ...], int]]


def zip_pieces(archive: str, records: List[Tuple[str, Union[bytes, Tuple[int, int]]]],
               align: int) -> List[Piece]:
    """The archive holding `records` (each: its name under archive/, then its bytes, or
    (k, size) for tensor k's bytes) as torch's writer lays it out; adjacent bytes joined."""
    out: List[Piece] = []
    buf = bytearray()
    central = bytearray()
    offset = 0
    for suffix, payload in records:
        name = ("%s/%s" % (archive, suffix)).encode()
        size = payload[1] if isinstance(payload, tuple) else len(payload)
        pad = -(offset + LOCAL.size + len(name) + 4) % align
        central += CENTRAL.pack(0x02014B50, 0, 0, FLAGS, 0, 0, 0, 0, size, size,
                                len(name), 0, 0, 0, 0, 0, offset) + name
        buf += LOCAL.pack(0x04034B50, 0, FLAGS, 0, 0, 0, 0, 0, 0, len(name), 4 + pad)
        buf += name + b"FB" + struct.pack("<H", pad) + b"Z" * pad
        if isinstance(payload, tuple):
            out += [bytes(buf), payload[0]]
            buf = bytearray()
        else:
            buf += payload
        buf += DESCRIPTOR.pack(0x08074B50, 0, size, size)
        offset += LOCAL.size + len(name) + 4 + pad + size + DESCRIPTOR.size
    n = len(records)
    buf += central
    buf += ZIP64_END.pack(0x06064B50, 44, 0x031E, 45, 0, 0, n, n, len(central), offset)
    buf += ZIP64_LOCATOR.pack(0x07064B50, 0, offset + len(central), 1)
    buf += END.pack(0x06054B50, 0, 0, n, n, len(central), offset, 0)
    out.append(bytes(buf))
    return out


class _Storage:
    """A storage in the pickle: torch.save writes each as a persistent id."""

    __slots__ = ("pid",)

    def __init__(self, pid: Tuple[Any, ...]) -> None:
        self.pid = pid


class _Tensor:
    """A tensor in the pickle, reduced as torch reduces a plain CPU tensor."""

    __slots__ = ("reduced",)

    def __init__(self, rebuild: Any, args: Tuple[Any, ...]) -> None:
        self.reduced = (rebuild, args)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.reduced


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        return obj.pid if isinstance(obj, _Storage) else None


def _records(archive_bytes: bytes) -> List[Tuple[str, bytes]]:
    """(name under the archive's folder, bytes) of each record, in file order."""
    out = []
    with zipfile.ZipFile(io.BytesIO(archive_bytes)) as z:
        for info in z.infolist():
            start = info.header_offset
            name_len, extra_len = struct.unpack("<HH", archive_bytes[start + 26:start + 30])
            start += 30 + name_len + extra_len
            out.append((info.filename.split("/", 1)[1], archive_bytes[start:start + info.file_size]))
    return out


class Layout:
    """The archives of samples whose layers have one dtype and hidden size."""

    def __init__(self, torch: Any, dtype: Any, n_layers: int, hidden: int,
                 records: List[Tuple[str, bytes]]) -> None:
        self.hidden, self.n_layers = hidden, n_layers
        self.itemsize = torch.empty((), dtype=dtype).element_size()
        self.records = records
        self.align = int(dict(records)[".storage_alignment"])
        self.long = getattr(torch, STORAGE_TYPES["torch.int64"])
        self.layer_type = getattr(torch, STORAGE_TYPES[str(dtype)])
        self.rebuild = torch._utils._rebuild_tensor_v2
        self._pickles: Dict[int, bytes] = {}
        self._templates: Dict[Tuple[int, int], Optional[Template]] = {}

    @classmethod
    def make(cls, dtype: Any, n_layers: int, hidden: int) -> Optional["Layout"]:
        """The layout for these samples, if torch writes what it lays out (see above)."""
        import torch

        if str(dtype) not in STORAGE_TYPES:
            return None

        def saved(n: int) -> bytes:
            buf = io.BytesIO()  # archive name "archive"
            torch.save({"input_ids": torch.zeros(n, dtype=torch.int64),
                        "hidden_states": [torch.zeros(n, hidden, dtype=dtype)
                                          for _ in range(n_layers)],
                        "loss_mask": torch.zeros(n, dtype=torch.int64)}, buf)
            return buf.getvalue()

        try:
            layout = cls(torch, dtype, n_layers, hidden, _records(saved(1)))
            pieces = layout.pieces("archive", CHECK_LEN)
        except (KeyError, ValueError, zipfile.BadZipFile, IndexError):
            return None
        sizes = layout.sizes(CHECK_LEN)
        ours = b"".join(p if isinstance(p, bytes) else bytes(sizes[p]) for p in pieces)
        return layout if ours == saved(CHECK_LEN) else None

    def sizes(self, n: int) -> List[int]:
        """Bytes of each tensor of an n-token sample, in storage order."""
        return [8 * n] + [n * self.hidden * self.itemsize] * self.n_layers + [8 * n]

    def pickle(self, n: int) -> bytes:
        """data.pkl of an n-token sample (kept per length: pickling costs ~60 us of GIL)."""
        got = self._pickles.get(n)
        if got is None:
            if len(self._pickles) >= PICKLES_MAX:
                self._pickles.clear()
            got = self._pickles[n] = self._pickle(n)
        return got

    def _pickle(self, n: int) -> bytes:
        """Every tuple is a new object, as torch's are: the pickler writes a repeated
        object as a reference to the first."""
        hooks = collections.OrderedDict
        key = iter(range(self.n_layers + 2))

        def tensor(kind: Any, shape: Tuple[int, ...], stride: Tuple[int, ...]) -> _Tensor:
            numel = shape[0] * (shape[1] if len(shape) > 1 else 1)
            storage = _Storage(("storage", kind, str(next(key)), "cpu", numel))
            return _Tensor(self.rebuild, (storage, 0, shape, stride, False, hooks()))

        one, hidden = 1, self.hidden
        obj = {KEYS[0]: tensor(self.long, (n,), (one,)),
               KEYS[1]: [tensor(self.layer_type, (n, hidden), (hidden, one))
                         for _ in range(self.n_layers)]}
        obj[KEYS[2]] = tensor(self.long, (n,), (one,))
        buf = io.BytesIO()
        _Pickler(buf, protocol=2).dump(obj)
        return buf.getvalue()

    def template(self, n: int, name_len: int) -> Optional[Template]:
        """The archives of n-token samples named with `name_len` bytes, to be filled with
        a name by fill(): the layout is made once per (length, name length), not per file
        (zip_pieces takes ~100 us of GIL a file, fill ~2 us). None where a stand-in name
        also occurs elsewhere in the bytes (then the caller lays out each file)."""
        key = (n, name_len)
        if key in self._templates:  # the writer threads share it; another may clear it
            return self._templates.get(key)
        if len(self._templates) >= TEMPLATES_MAX:
            self._templates.clear()
        first, second = (self.pieces(c * name_len, n) for c in STAND_INS)
        name = STAND_INS[0].encode() * name_len
        got: Template = [p if isinstance(p, int) else tuple(p.split(name)) for p in first]
        other = STAND_INS[1].encode() * name_len
        exact = len(got) == len(second) and all(
            (t if isinstance(t, int) else other.join(t)) == p for t, p in zip(got, second))
        self._templates[key] = got if exact else None
        return got if exact else None

    def pieces(self, archive: str, n: int) -> List[Piece]:
        """The archive `archive` of an n-token sample, as pieces (see zip_pieces)."""
        sizes = self.sizes(n)
        if sum(sizes) >= ZIP32_MAX - (1 << 20):  # the other records: far less than 1 MiB
            raise ValueError("%d bytes of tensors need zip64 fields" % sum(sizes))
        records: List[Tuple[str, Any]] = []
        for name, data in self.records:
            if name == "data.pkl":
                records.append((name, self.pickle(n)))
            elif name.startswith("data/"):
                k = int(name[5:])
                records.append((name, (k, sizes[k])))
            else:
                records.append((name, data))
        return zip_pieces(archive, records, self.align)


def fill(template: Template, name: bytes) -> List[Piece]:
    """The pieces of the archive named `name` from its length's template."""
    return [t if isinstance(t, int) else name.join(t) for t in template]
