"""Slot files (`POST /slots/{id}?action=save|restore|erase`): the actions on an idle slot, the one
slot-filename validator, and the file format (llama.cpp's sequence-state layout).

The actions run on the engine thread between steps (`Engine.slot_action` queues them there) and
change the cache through the block manager (`runtime/serving/blocks.py`: export, import, clear);
`check_action` validates a request on the caller's thread first. Errors are `SlotError(code,
message, type)`, which the API turns into llama-server's error JSON.
"""
from __future__ import annotations

import math
import os
import struct
import time

import numpy as np
import torch
from gguf import GGMLQuantizationType

from runtime.model.kv_store import KVState, KVStore
from runtime.serving.blocks import BlockManager, OutOfBlocks
from runtime.serving.slots import Slot


class SlotError(Exception):
    def __init__(self, code: int, message: str, type: str):
        super().__init__(message)
        self.code, self.message, self.type = code, message, type


class SlotFileError(ValueError):
    pass


_BAD_FILENAME_CHARS = frozenset('/\\:*?"<>|\uff0e\u2215\u2216\ufffd\ufeff')


def valid_slot_filename(name: str) -> bool:
    """llama.cpp's fs_validate_filename (common/common.cpp, no subdirectories), which llama-server
    applies to a slot file name: 1 to 255 UTF-8 bytes, no control character (C0, DEL, C1), none of
    `/ \\ : * ? " < > |` or their look-alikes, no surrogate, no leading or trailing space (0x20
    only), no trailing '.', no "..", not "."."""
    try:
        n_bytes = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate (JSON "\\ud800"): not UTF-8
        return False
    if not name or n_bytes > 255:
        return False
    if any(c <= "\x1f" or "\x7f" <= c <= "\x9f" or c in _BAD_FILENAME_CHARS for c in name):
        return False
    if name[0] == " " or name[-1] in " .":
        return False
    return ".." not in name and name != "."


ACTIONS = ("save", "restore", "erase")
_NO_SPACE = "Unable to restore slot, no available space in KV cache or invalid slot save file"


def check_action(action: str, id_slot: int, n_slots: int, save_path: str | None, filename: str | None) -> None:
    """Raise the SlotError llama-server answers for a malformed action request."""
    if action not in ACTIONS:
        raise SlotError(400, "Invalid action", "invalid_request_error")
    if id_slot < 0 or id_slot >= n_slots:
        raise SlotError(400, "Invalid slot ID", "invalid_request_error")
    if action in ("save", "restore"):
        if not save_path:
            raise SlotError(501, "This server does not support slots action. Start it with `--slot-save-path`",
                            "not_supported_error")
        if not filename or not valid_slot_filename(filename):
            raise SlotError(400, "Invalid filename", "invalid_request_error")


def _idle(s: Slot) -> None:
    if s.busy:
        raise SlotError(400, "Slot is busy", "invalid_request_error")


def save_slot(blocks: BlockManager, s: Slot, directory: str, filename: str, n_stream: int) -> dict:
    _idle(s)
    t0 = time.perf_counter()
    state = blocks.export(s.seq, len(s.tokens))
    store = blocks.store
    n_written = write_slot_file(os.path.join(directory, filename), s.tokens, state, s.id, n_stream,
                                store.recurrent_layers if store.rs is not None else None, store.cell_ext)
    return {"id_slot": s.id, "filename": filename, "n_saved": len(s.tokens), "n_written": n_written,
            "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}


def restore_slot(blocks: BlockManager, s: Slot, directory: str, filename: str, n_stream: int) -> dict:
    _idle(s)
    t0 = time.perf_counter()
    path = os.path.join(directory, filename)
    if not os.path.isfile(path):
        raise SlotError(400, "failed to restore slot", "invalid_request_error")
    try:
        tokens, state, n_read = read_slot_file(path, blocks.store, n_stream)
    except SlotFileError as e:
        raise SlotError(400, f"{_NO_SPACE}: {e}", "invalid_request_error")
    if len(tokens) > s.n_ctx:
        raise SlotError(400, _NO_SPACE, "invalid_request_error")
    try:
        blocks.import_(s.seq, state)
    except OutOfBlocks:
        blocks.clear(s.seq)
        s.tokens = []
        raise SlotError(400, _NO_SPACE, "invalid_request_error")
    s.tokens, s.checkpoints = list(tokens), []  # a slot file holds no context checkpoints
    return {"id_slot": s.id, "filename": filename, "n_restored": len(tokens), "n_read": n_read,
            "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}


def erase_slot(blocks: BlockManager, s: Slot) -> dict:
    _idle(s)
    n = len(s.tokens)
    blocks.clear(s.seq)
    s.tokens = []
    return {"id_slot": s.id, "n_erased": n}


# ---- the file format ---------------------------------------------------------------------------

SEQ_MAGIC = 0x67677371  # 'ggsq', llama.cpp's LLAMA_STATE_SEQ_MAGIC
SEQ_VERSION = 3  # LLAMA_STATE_SEQ_VERSION of b1-0c1e570
TOKENS_NULL = -1  # LLAMA_TOKEN_NULL: marks a packed server_tokens state instead of a plain token list
TOKENS_STATE_VERSION = 1  # SERVER_TOKENS_STATE_VERSION


def write_slot_file(path: str, tokens: list[int], state: KVState, seq_id: int = 0, n_stream: int = 1,
                    recurrent_layers: list[bool] | None = None, cell_ext: bool = False) -> int:
    """A slot file as llama-server b1-0c1e570 writes it (checked byte for byte against its output):
    header (magic, version, word count), the slot's tokens packed as server_tokens::serialize does
    (LLAMA_TOKEN_NULL, state version, token count, ids, media count 0), then the KV section of
    llama_kv_cache::state_write: n_stream, and per stream a cell count; the sequence's own stream
    (stream seq_id when every slot has its own, else 0) holds per-cell (pos, n_seq_id, seq_id),
    v_trans, n_layer, per layer K (type, row bytes, rows), per layer V: the state's own rows and
    ggml types. Returns the bytes written. M-RoPE models (`cell_ext`: llama.cpp's has_cell_ext)
    write a cell as (pos, n_seq_id, x, y, token, seq_id). Hybrid models (`recurrent_layers` given):
    the K/V of the attention layers only, then the recurrent section (`recurrent_section`), as
    llama_memory_hybrid::state_write."""
    k, v = state.k, state.v  # [L, n, row bytes] uint8
    if recurrent_layers is not None:
        attn = [i for i, r in enumerate(recurrent_layers) if not r]
        k, v = k[attn], v[attn]
    n_layer, n = k.shape[0], state.n_tokens
    packed = [TOKENS_NULL, TOKENS_STATE_VERSION, len(tokens), *tokens, 0]
    parts = [struct.pack("<III", SEQ_MAGIC, SEQ_VERSION, len(packed)), np.asarray(packed, dtype=np.int32).tobytes(),
             struct.pack("<I", n_stream)]
    own = seq_id if n_stream > 1 else 0
    for stream in range(n_stream):
        if stream != own:
            parts.append(struct.pack("<I", 0))
            continue
        parts.append(struct.pack("<I", n))
        if n == 0:
            continue
        if cell_ext:  # M-RoPE models: each cell's llama_kv_cell_ext (x, y, token) before its seq id
            cells = np.zeros((n, 6), dtype=np.int32)
            cells[:, 2] = cells[:, 3] = np.arange(n)  # a text token's 2D position: its position
            cells[:, 4] = np.maximum(np.asarray(tokens[:n], dtype=np.int64), -1)  # (media: LLAMA_TOKEN_NULL)
        else:
            cells = np.zeros((n, 3), dtype=np.int32)
        cells[:, 0] = np.arange(n)
        cells[:, 1] = 1
        cells[:, -1] = seq_id
        parts.append(cells.tobytes())
        parts.append(struct.pack("<II", 0, n_layer))
        for rows, gtype in ((k, state.type_k), (v, state.type_v)):  # [L, n, row bytes] uint8
            for layer in range(n_layer):
                parts.append(struct.pack("<iQ", gtype, rows.shape[2]))
                parts.append(rows[layer].contiguous().numpy().tobytes())
    if recurrent_layers is not None:
        parts.append(recurrent_section(state, n, recurrent_layers))
    data = b"".join(parts)
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def recurrent_section(state: KVState, n: int, recurrent_layers: list[bool]) -> bytes:
    """llama_memory_recurrent::state_write for one sequence: its cell count (1, or 0 when empty),
    the cell's (pos = n - 1, n_seq_id 0), s_trans 0, n_layer (all layers), per recurrent layer the
    conv state (type f32, row bytes, the row: channel-major, the K - 1 taps of each channel
    together, as ggml's [K - 1, C] tensor), then per recurrent layer the delta-net state (type, row
    bytes, [H, S, S] as stored)."""
    conv, ssm = state.rs  # [Lr, K - 1, C], [Lr, H, S, S] float32
    cells = 1 if n > 0 else 0
    parts = [struct.pack("<I", cells)]
    if cells:
        parts.append(struct.pack("<iI", n - 1, 0))
    parts.append(struct.pack("<II", 0, len(recurrent_layers)))
    for r in conv:
        row = r.transpose(0, 1).contiguous().float()
        parts.append(struct.pack("<iQ", 0, row.numel() * 4))
        if cells:
            parts.append(row.numpy().tobytes())
    for r in ssm:
        row = r.contiguous().float()
        parts.append(struct.pack("<iQ", 0, row.numel() * 4))
        if cells:
            parts.append(row.numpy().tobytes())
    return b"".join(parts)


def _read_recurrent(data: bytes, off: int, n: int, store: KVStore) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
    """The recurrent section of a hybrid model's slot file (`recurrent_section`) for a store
    shaped like `store.rs`: (conv, ssm) (zeros for an empty sequence), the offset after it."""
    shape = store.rs.shape
    conv = torch.zeros(shape.n_layers, shape.conv_rows, shape.conv_channels)
    ssm = torch.zeros(shape.n_layers, shape.n_heads, shape.head_dim, shape.head_dim)
    (cells,) = struct.unpack_from("<I", data, off)
    off += 4
    if cells != (1 if n > 0 else 0):
        raise SlotFileError("recurrent cell count mismatch")
    off += 8 * cells
    s_trans, n_layer = struct.unpack_from("<II", data, off)
    off += 8
    if s_trans != 0 or n_layer != len(store.recurrent_layers):
        raise SlotFileError("recurrent layer count mismatch")
    for dst, rows in ((conv, (shape.conv_channels, shape.conv_rows)),
                      (ssm, (shape.n_heads, shape.head_dim, shape.head_dim))):
        for li in range(shape.n_layers):
            gtype, row_bytes = struct.unpack_from("<iQ", data, off)
            off += 12
            if gtype != 0 or row_bytes != 4 * math.prod(rows):
                raise SlotFileError("recurrent state shape mismatch")
            if cells:
                if off + row_bytes > len(data):
                    raise SlotFileError("truncated file")
                t = torch.frombuffer(bytearray(data[off:off + row_bytes]), dtype=torch.float32).view(rows)
                dst[li] = t.transpose(0, 1) if dst is conv else t
                off += row_bytes
    return (conv, ssm), off


def _unpack_tokens(words: list[int]) -> list[int]:
    """server_tokens::deserialize: a packed state, or a plain token list (older llama-server)."""
    if not words or words[0] != TOKENS_NULL:
        return words
    if len(words) < 4 or words[1] != TOKENS_STATE_VERSION:
        raise SlotFileError("Unsupported server tokens state version")
    n = words[2]
    if n < 0 or 3 + n + 1 > len(words):
        raise SlotFileError("Unexpected end of server tokens state")
    if words[3 + n] != 0:
        raise SlotFileError("Cannot restore media tokens without an mmproj")
    return words[3:3 + n]


def read_slot_file(path: str, store: KVStore, n_stream: int = 1) -> tuple[list[int], KVState, int]:
    """Read a slot file (as `write_slot_file` or llama-server writes it) for a cache shaped like
    `store` whose slots use `n_stream` streams; the cells of the one stream that has any are
    restored, as rows of the types the file names (any the store takes in)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        magic, version, n_words = struct.unpack_from("<III", data, 0)
        if magic != SEQ_MAGIC or version != SEQ_VERSION:
            raise SlotFileError("bad magic or version")
        off = 12
        tokens = _unpack_tokens(np.frombuffer(data, dtype=np.int32, count=n_words, offset=off).tolist())
        off += 4 * n_words
        (file_streams,) = struct.unpack_from("<I", data, off)
        off += 4
        if file_streams != n_stream:
            raise SlotFileError("n_stream mismatch")
        hybrid = store.rs is not None
        attn = [i for i in range(store.n_layers) if not (hybrid and store.recurrent_layers[i])]
        out = None
        n = 0
        for _ in range(file_streams):
            (count,) = struct.unpack_from("<I", data, off)
            off += 4
            if count == 0:
                continue
            if out is not None:
                raise SlotFileError("cells of more than one stream")
            n = count
            off += (24 if store.cell_ext else 12) * n
            v_trans, n_layer = struct.unpack_from("<II", data, off)
            off += 8
            if n_layer != len(attn) or v_trans != 0:
                raise SlotFileError("layer count mismatch")
            parts = []  # K then V: (rows [L, n, row bytes] uint8, ggml type)
            for _ in range(2):
                layers, types = [], set()
                for _ in attn:
                    gtype, row_bytes = struct.unpack_from("<iQ", data, off)
                    off += 12
                    if row_bytes != store.row_bytes(gtype) or types - {gtype}:
                        raise SlotFileError("KV shape mismatch")
                    if off + n * row_bytes > len(data):
                        raise SlotFileError("truncated file")
                    layers.append(torch.frombuffer(bytearray(data[off: off + n * row_bytes]), dtype=torch.uint8).view(n, row_bytes))
                    off += n * row_bytes
                    types.add(gtype)
                full = [torch.zeros_like(layers[0])] * store.n_layers  # (a recurrent layer holds no K/V)
                for i, t in zip(attn, layers):
                    full[i] = t
                parts.append((torch.stack(full), GGMLQuantizationType(gtype)))
            (k, type_k), (v, type_v) = parts
            out = KVState(k, v, type_k, type_v)
        if out is None:
            k, v = (torch.empty((store.n_layers, 0, store.row_bytes(t)), dtype=torch.uint8)
                    for t in (store.type_k, store.type_v))
            out = KVState(k, v, store.type_k, store.type_v)
        if hybrid:
            out.rs, off = _read_recurrent(data, off, n, store)
        if n != len(tokens):
            raise SlotFileError("token count mismatch")
    except (struct.error, ValueError) as e:
        if isinstance(e, SlotFileError):
            raise
        # struct.error / ValueError from numpy: the file stops before its header says it should
        what = "empty file" if not data else f"truncated or not a slot file ({len(data)} bytes)"
        raise SlotFileError(what) from e
    return tokens, out, len(data)
