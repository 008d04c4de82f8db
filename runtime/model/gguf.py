"""The one GGUF reader: header, metadata key/values, tensor infos, zero-copy tensor data.

`read_gguf(path, with_tensors=True, map_data=False) -> GGUFFile`:

- `metadata: dict[str, Any]` — every KV pair as a plain Python value: strings as `str` (invalid
  UTF-8 decoded with "surrogateescape", so `s.encode("utf-8", "surrogateescape")` gives back the
  exact bytes), arrays as `list` (of `str`, `int`, `float`, `bool`, or nested lists), scalars as
  `int` / `float` / `bool`. The same values `gguf.GGUFReader`'s `field.contents()` gives, and what
  `gguf.GGUFWriter.add_key_value` takes back.
- `value_types: dict[str, (GGUFValueType, item GGUFValueType | None)]` — each key's stored type.
- `tensors: list[GGUFTensorInfo]` (name, GGML shape, type, absolute offset), checked against the
  file size; `version`, `alignment`, `data_offset`.
- `data` (with `map_data=True`): the whole file as a copy-on-write uint8 array (writes stay
  private to the process; pages shared with the page cache); `tensor_data(gf, info)` views one
  tensor in it without copying.

Truncated or malformed files raise `ValueError` in the user's terms ("not a GGUF file", "truncated
GGUF: ... expected at least N bytes, it has M", "malformed GGUF: ..."), never a `struct.error`;
a missing file raises `FileNotFoundError`.

Why not `gguf.GGUFReader`: it builds numpy arrays per string (a field part per array element), so
a 151,936-token vocabulary takes 14-30 s to open, against ~0.2-0.5 s here (measured on the
qwen2 vocab and on the lesson's 322 MB model, see docs/DESIGN.md). The `gguf` package still gives
the enums, the quantization block sizes and the writer.
"""
from __future__ import annotations

import math
import mmap
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

__all__ = ["GGUFTensorInfo", "GGUFFile", "KV", "UnreadArray", "read_gguf", "read_gguf_metadata", "tensor_data",
           "light_header", "map_file"]

# a metadata entry as the writer takes it: key, value, type, array item type
KV = tuple[str, Any, GGUFValueType, "GGUFValueType | None"]

_MAGIC = b"GGUF"
_HEADER_SIZE = 24  # magic, version u32, n_tensors u64, n_kv u64
_SCALAR = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d", GGUFValueType.BOOL: "<?",
}
_NP = {
    GGUFValueType.UINT8: np.uint8, GGUFValueType.INT8: np.int8, GGUFValueType.UINT16: np.uint16,
    GGUFValueType.INT16: np.int16, GGUFValueType.UINT32: np.uint32, GGUFValueType.INT32: np.int32,
    GGUFValueType.FLOAT32: np.float32, GGUFValueType.UINT64: np.uint64,
    GGUFValueType.INT64: np.int64, GGUFValueType.FLOAT64: np.float64, GGUFValueType.BOOL: np.bool_,
}
_U32 = struct.Struct("<I").unpack_from
_U64 = struct.Struct("<Q").unpack_from


@dataclass
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # GGML order: shape[0] = ne0 (contiguous dimension)
    qtype: GGMLQuantizationType
    offset: int  # absolute byte offset in the file

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def n_bytes(self) -> int:
        block_size, type_size = GGML_QUANT_SIZES[self.qtype]
        return self.n_elements // block_size * type_size


@dataclass
class GGUFFile:
    metadata: dict[str, Any]
    value_types: dict[str, tuple[GGUFValueType, GGUFValueType | None]]  # key -> (type, array item type)
    tensors: list[GGUFTensorInfo]
    version: int
    alignment: int
    data_offset: int
    data: np.ndarray | None = None  # map_data=True: the file, uint8, copy-on-write mapping


class _Parser:
    """Reads the header fields from `buf` (a mapping of the file), checking each against its size."""

    def __init__(self, buf: Any, path: str) -> None:
        self.buf = buf
        self.size = len(buf)
        self.path = path
        self.pos = 0

    def truncated(self, what: str, end: int) -> ValueError:
        return ValueError(f"truncated GGUF: {self.path}: the file ends inside {what}: expected at "
                          f"least {end} bytes, it has {self.size} (an incomplete download or copy?)")

    def malformed(self, what: str) -> ValueError:
        return ValueError(f"malformed GGUF: {self.path}: {what}")

    def need(self, n: int, what: str) -> int:
        """Start of the next `n` bytes; raises if the file ends before them."""
        start = self.pos
        if start + n > self.size:
            raise self.truncated(what, start + n)
        self.pos = start + n
        return start

    def u32(self, what: str) -> int:
        return _U32(self.buf, self.need(4, what))[0]

    def u64(self, what: str) -> int:
        return _U64(self.buf, self.need(8, what))[0]

    def string(self, what: str) -> str:
        n = self.u64(what)
        start = self.need(n, what)
        return self.buf[start:start + n].decode("utf-8", "surrogateescape")

    def value_type(self, raw: int, what: str) -> GGUFValueType:
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise self.malformed(f"{what} has unknown value type {raw}") from None

    def value(self, vtype: GGUFValueType, what: str) -> tuple[Any, GGUFValueType | None]:
        if vtype == GGUFValueType.STRING:
            return self.string(what), None
        if vtype != GGUFValueType.ARRAY:
            fmt = _SCALAR[vtype]
            return struct.unpack_from(fmt, self.buf, self.need(struct.calcsize(fmt), what))[0], None
        itype = self.value_type(self.u32(what), what + " (array items)")
        n = self.u64(what)
        if itype == GGUFValueType.STRING:
            return self.strings(n, what), itype
        if itype in _NP:
            dt = np.dtype(_NP[itype]).newbyteorder("<")
            start = self.need(n * dt.itemsize, what)
            return np.frombuffer(self.buf, dtype=dt, count=n, offset=start).tolist(), itype
        return [self.value(itype, what)[0] for _ in range(n)], itype  # nested arrays: rare

    def strings(self, n: int, what: str) -> list[str]:
        """A string array (151,936 tokens for Qwen2): the hot loop of a load."""
        buf, pos, size, out = self.buf, self.pos, self.size, []
        append = out.append
        for _ in range(n):
            if pos + 8 > size:
                raise self.truncated(what, pos + 8)
            start = pos + 8
            pos = start + _U64(buf, pos)[0]
            append(buf[start:pos].decode("utf-8", "surrogateescape"))
        if pos > size:
            raise self.truncated(what, pos)
        self.pos = pos
        return out

    def parse(self, with_tensors: bool) -> GGUFFile:
        if self.size == 0:
            raise ValueError(f"{self.path}: not a GGUF file (the file is empty)")
        if self.buf[:4] != _MAGIC:
            raise ValueError(f"{self.path}: not a GGUF file (it starts with {bytes(self.buf[:4])!r}, "
                             f"not {_MAGIC!r})")
        self.need(4, "the header")
        version = self.u32("the header")
        if version not in (2, 3):
            raise ValueError(f"{self.path}: unsupported GGUF version {version} "
                             "(big-endian files are not supported)")
        if self.size < _HEADER_SIZE:
            raise self.truncated("the header", _HEADER_SIZE)
        n_tensors = self.u64("the header")
        n_kv = self.u64("the header")
        metadata: dict[str, Any] = {}
        vtypes: dict[str, tuple[GGUFValueType, GGUFValueType | None]] = {}
        for i in range(n_kv):
            key = self.string(f"metadata key #{i}")
            what = f"metadata value {key!r}"
            vtype = self.value_type(self.u32(what), what)
            metadata[key], itype = self.value(vtype, what)
            vtypes[key] = (vtype, itype)
        alignment = int(metadata.get("general.alignment", 32))
        if not with_tensors:
            return GGUFFile(metadata, vtypes, [], version, alignment, 0)
        raw_infos = [self.tensor_info(i) for i in range(n_tensors)]
        data_offset = (self.pos + alignment - 1) // alignment * alignment
        tensors = [GGUFTensorInfo(n, s, q, data_offset + o) for n, s, q, o in raw_infos]
        for t in tensors:
            end = t.offset + t.n_bytes
            if end > self.size:
                raise self.truncated(f"the data of tensor {t.name!r}", end)
        return GGUFFile(metadata, vtypes, tensors, version, alignment, data_offset)

    def tensor_info(self, i: int) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
        name = self.string(f"tensor info #{i}")
        what = f"tensor info {name!r}"
        n_dims = self.u32(what)
        shape = tuple(self.u64(what) for _ in range(n_dims))
        raw = self.u32(what)
        try:
            qtype = GGMLQuantizationType(raw)
        except ValueError:
            raise self.malformed(f"tensor {name!r} has unknown type {raw}") from None
        return name, shape, qtype, self.u64(what)


def _open_mapping(path: Path, access: int) -> mmap.mmap:
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise ValueError(f"{path}: not a GGUF file (the file is empty)")
            return mmap.mmap(f.fileno(), 0, access=access)
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory, not a GGUF file") from None


def read_gguf(path: str | os.PathLike, with_tensors: bool = True, map_data: bool = False) -> GGUFFile:
    """Parse a GGUF file's header: metadata (plain Python values), their types, tensor infos.

    `map_data=True` keeps the file mapped (copy-on-write) as `GGUFFile.data` for `tensor_data`."""
    path = Path(path)
    mm = _open_mapping(path, mmap.ACCESS_COPY if map_data else mmap.ACCESS_READ)
    try:
        gf = _Parser(mm, str(path)).parse(with_tensors)
    except BaseException:
        mm.close()
        raise
    if map_data:
        gf.data = np.frombuffer(mm, dtype=np.uint8)  # keeps `mm` alive as long as a view exists
    else:
        mm.close()
    return gf


class UnreadArray(Sequence):
    """A metadata array a `light_header` left out: its length at once, its items read from the file
    on first use (the tokenizer arrays, which a forked start-up turns into the tokenizer itself)."""

    def __init__(self, path: str, key: str, n: int) -> None:
        self.path, self.key, self.n = path, key, n
        self._items: list | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if self._items is None:
            self._items = read_gguf_metadata(self.path)[self.key]
        return self._items[i]

    def __getstate__(self) -> dict:
        return {"path": self.path, "key": self.key, "n": self.n, "_items": None}

    def __repr__(self) -> str:
        return f"UnreadArray({self.key!r}, {self.n} items)"


def light_header(gf: GGUFFile, path: str | os.PathLike, min_items: int = 4096) -> GGUFFile:
    """`gf` without its data and with every metadata array of `min_items` or more as an
    `UnreadArray`: small to pickle (a Qwen2 header: ~30 KB instead of ~8 MB)."""
    md = {k: UnreadArray(str(path), k, len(v)) if isinstance(v, list) and len(v) >= min_items else v
          for k, v in gf.metadata.items()}
    return GGUFFile(md, gf.value_types, gf.tensors, gf.version, gf.alignment, gf.data_offset)


def map_file(gf: GGUFFile, path: str | os.PathLike) -> GGUFFile:
    """`gf` (a header of `path`, e.g. a `light_header` read elsewhere) with the file mapped as
    `read_gguf(..., map_data=True)` maps it; raises if the file is now shorter than its tensors."""
    mm = _open_mapping(Path(path), mmap.ACCESS_COPY)
    end = max((t.offset + t.n_bytes for t in gf.tensors), default=0)
    if len(mm) < end:
        size = len(mm)
        mm.close()
        raise ValueError(f"truncated GGUF: {path}: expected at least {end} bytes, it has {size}")
    gf.data = np.frombuffer(mm, dtype=np.uint8)
    return gf


def read_gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """All KV metadata of a GGUF file as plain Python values (see the module docstring)."""
    return read_gguf(path, with_tensors=False).metadata


def tensor_data(gf: GGUFFile, info: GGUFTensorInfo) -> np.ndarray:
    """A tensor's bytes in the mapping of `read_gguf(..., map_data=True)`, without a copy, viewed
    with its GGML shape reversed (row-major): float32 / float16 / int16 (BF16 bits) elements, or
    uint8 `[..., row_bytes]` for quantized types."""
    if gf.data is None:
        raise ValueError("tensor_data needs read_gguf(path, map_data=True)")
    raw = gf.data[info.offset:info.offset + info.n_bytes]
    shape = tuple(reversed(info.shape))
    if info.qtype == GGMLQuantizationType.F32:
        return raw.view(np.float32).reshape(shape)
    if info.qtype == GGMLQuantizationType.F16:
        return raw.view(np.float16).reshape(shape)
    if info.qtype == GGMLQuantizationType.BF16:
        return raw.view(np.int16).reshape(shape)
    block_size, type_size = GGML_QUANT_SIZES[info.qtype]
    return raw.reshape(*shape[:-1], info.shape[0] // block_size * type_size)
