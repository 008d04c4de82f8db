"""The integer-dot panels of a GGUF file's quantized matrices, computed before the model is built
and before torch is imported (this module, `qdot_lib.py` and `native.py` need neither torch nor the
backend's other modules).

The server's start-up runs this on a thread while its main thread imports torch and the web stack
(runtime/launch/preload.py): the repack is one C call per matrix with the GIL released, so it runs on the
second core under ~1.3 s of imports instead of after them. The result is exactly what
`matmul.prepare_weights` computes for the same group (`_qdot_pack`: the members' panels side by side
in one buffer, in group order); a `QWeight` carrying its `Packed` (`QWeight.repacked`) is taken as
it is there. Groups qdot cannot take whole (a type it lacks, mixed widths) are left out: the model
prepares those as before.
"""
from __future__ import annotations

import ctypes
import mmap
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from . import qdot_lib


@dataclass(frozen=True)
class Matrix:
    """One quantized matrix of the source: GGML type id, `rows` (output features) x `cols`, and the
    byte offset of its first block in the source buffer (rows of `cols / block * type_size` bytes)."""
    name: str
    qtype: int
    rows: int
    cols: int
    offset: int


@dataclass(frozen=True)
class Packed:
    """A matrix's x8 panels: `buf[offset:offset + nbytes]`, member `index` of a group of `size`
    matrices sharing `buf` (uint8, page-aligned, an anonymous mapping of its own)."""
    buf: np.ndarray
    offset: int
    nbytes: int
    index: int
    size: int
    qtype: int
    rows: int
    cols: int


def packable(group: Sequence[Matrix]) -> bool:
    """Whether `matmul.prepare_weights` makes one qdot group of these matrices."""
    return qdot_lib.groupable([(m.qtype, m.cols) for m in group])


def prepack(source: np.ndarray, groups: Sequence[Sequence[Matrix]], n_threads: int = 1,
            release_source: bool = False) -> dict[str, Packed]:
    """Repack every `packable` group of `source` (uint8 [file bytes], e.g. the GGUF mapping) ->
    {matrix name: Packed}; {} without the compiled kernels. `release_source`: drop each matrix's
    source pages afterwards (only for a never-written file mapping, as `qdot.prepare`)."""
    lib = qdot_lib.lib()
    if lib is None:
        return {}
    if source.dtype != np.uint8 or source.ndim != 1:
        raise ValueError("prepack: the source must be a flat uint8 buffer")
    base, end = source.ctypes.data, source.nbytes
    out: dict[str, Packed] = {}
    todo: list[tuple[Matrix, int, int]] = []  # (matrix, source row bytes, destination address)
    for group in groups:
        if not packable(group):
            continue
        sizes = [qdot_lib.repacked_bytes(m.qtype, m.rows, m.cols) for m in group]
        buf = np.frombuffer(mmap.mmap(-1, sum(sizes), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), dtype=np.uint8)
        off = 0
        for i, (m, n) in enumerate(zip(group, sizes)):
            bs, ts, _ = qdot_lib.TYPES[m.qtype]
            row_bytes = m.cols // bs * ts
            if m.offset < 0 or m.offset + m.rows * row_bytes > end:
                raise ValueError(f"prepack: {m.name} lies outside the source ({end} bytes)")
            todo.append((m, row_bytes, buf.ctypes.data + off))
            out[m.name] = Packed(buf, off, n, i, len(group), m.qtype, m.rows, m.cols)
            off += n
    if todo:  # one C call for all: the GIL is released once, not once per matrix
        n = len(todo)
        ints = lambda xs: (ctypes.c_int * n)(*xs)  # noqa: E731
        rc = lib.qd_repack_many(n, ints(m.qtype for m, _, _ in todo),
                                (ctypes.c_void_p * n)(*(base + m.offset for m, _, _ in todo)),
                                (ctypes.c_long * n)(*(rb for _, rb, _ in todo)), ints(m.rows for m, _, _ in todo),
                                ints(m.cols for m, _, _ in todo), (ctypes.c_void_p * n)(*(d for _, _, d in todo)),
                                n_threads, int(release_source))
        if rc:
            raise RuntimeError(f"prepack: repacking {todo[rc - 1][0].name} failed")
    return out
