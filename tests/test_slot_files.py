"""Slot files (runtime/serving/slot_files.py): llama.cpp's sequence-state layout, the filename rule."""
from __future__ import annotations

import pytest
import torch

from runtime.model.kv_store import KVStore, SeqKV
from runtime.serving.blocks import BlockManager
from runtime.serving import SlotError, valid_slot_filename
from runtime.serving.slot_files import SlotFileError, check_action, read_slot_file, write_slot_file


def test_slot_file_roundtrip_and_size(tmp_path):
    kv = BlockManager(KVStore(n_layers=4, n_kv_heads=2, head_dim=32, num_blocks=8, block_size=16, dtype=torch.float16))
    s = SeqKV()
    kv.reserve(s, 28)
    ks = [torch.randn(28, 2, 32) for _ in range(4)]
    kv.store.scatter(s, 0, ks, ks)
    kv.commit(s, 28)
    path = tmp_path / "x.bin"
    n = write_slot_file(str(path), list(range(28)), kv.export(s), seq_id=0, n_stream=2)
    # 1,024 bytes of KV + 4 token id + 12 cell metadata per token and 144 fixed bytes with two
    # slots, as the lesson's llama-server files (29,264 bytes for 28 tokens)
    assert n == path.stat().st_size == 29264
    tokens, state, n_read = read_slot_file(str(path), kv.store, n_stream=2)
    assert tokens == list(range(28)) and n_read == n
    assert torch.equal(state.k, kv.export(s).k) and state.type_k == kv.store.type_k
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"nope" * 10)
    try:
        read_slot_file(str(bad), kv.store)
        raise AssertionError("accepted a bad file")
    except SlotFileError:
        pass


@pytest.mark.parametrize("name,seq_id,n_tok", [("llama-server-b1-0c1e570-slot0-of-2.bin", 0, 6),
                                                ("llama-server-b1-0c1e570-slot1-of-2.bin", 1, 4)])


def test_slot_files_are_byte_identical_to_llama_server(tmp_path, name, seq_id, n_tok):
    """Files saved by llama-server b1-0c1e570 (scripts/build_llama_server.sh) from slot 0 and slot 1
    of a `-np 2` server on the lesson's tiny model (4 layers, 2 KV heads of 32, f16 cache): read
    back, and written again from what was read, byte for byte the same file."""
    from pathlib import Path
    src = Path(__file__).parent / "data" / name
    store = KVStore(n_layers=4, n_kv_heads=2, head_dim=32, num_blocks=8, block_size=16, dtype=torch.float16)
    tokens, state, n_read = read_slot_file(str(src), store, n_stream=2)
    assert len(tokens) == n_tok and n_read == src.stat().st_size == 144 + n_tok * 1040
    out = tmp_path / "again.bin"
    assert write_slot_file(str(out), tokens, state, seq_id=seq_id, n_stream=2) == n_read
    assert out.read_bytes() == src.read_bytes()
    with pytest.raises(SlotFileError):  # a unified cache has one stream
        read_slot_file(str(src), store, n_stream=1)


@pytest.mark.parametrize("name", ["slot0.bin", "review-prefix2.bin", "a b.bin", ".hidden", "x" * 255])
def test_valid_slot_filenames(name):
    assert valid_slot_filename(name)


@pytest.mark.parametrize("name", ["", ".", "..", "../etc/passwd", "a/b", "a\\b", "a..b", "c:x", "a\0b", "tab\tname",
                                  " lead", "trail ", "dot.", "q?", "s*", "p|q", "<x>", '"q"', "x" * 256, "é" * 128])
def test_invalid_slot_filenames(name):
    assert not valid_slot_filename(name)


def test_check_action_errors_in_llama_server_order():
    def err(*args):
        with pytest.raises(SlotError) as ei:
            check_action(*args)
        return ei.value.code, ei.value.message

    assert err("load", 0, 2, "/tmp", "x.bin") == (400, "Invalid action")
    assert err("save", 2, 2, "/tmp", "x.bin") == (400, "Invalid slot ID")
    assert err("save", -1, 2, "/tmp", "x.bin") == (400, "Invalid slot ID")
    assert err("restore", 0, 2, None, "x.bin")[0] == 501
    assert err("save", 0, 2, "/tmp", "../x.bin") == (400, "Invalid filename")
    assert err("save", 0, 2, "/tmp", None) == (400, "Invalid filename")
    check_action("save", 1, 2, "/tmp", "x.bin")
    check_action("erase", 1, 2, None, None)  # erase needs neither a directory nor a name here
