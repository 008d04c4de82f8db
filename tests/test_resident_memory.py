"""Resident memory of the CPU path: what is mapped but never written stays out of the RSS.

- the KV cache: an anonymous mapping, zero-filled by the OS on first touch, so blocks never written
  cost no resident memory; freed blocks are reused last-in first-out (the warm ones first);
- untied token embeddings gathered from the file mapping: the pages a lookup faulted in are dropped
  again (fault-around maps 64 KiB per row, so a long prompt would otherwise leave much of the table
  resident).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kernels
from kernels.cpu import qdot
from kernels.qweight import QWeight
from runtime.model.kv_store import KVStore, SeqKV
from runtime.serving.blocks import BlockManager


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def test_kv_cache_blocks_cost_memory_only_once_written():
    before = _rss_mib()
    # 8 layers x K/V x 2048 blocks x 16 tokens x 8 heads x 64 x 2 bytes = 512 MiB of address space
    store = KVStore(8, 8, 64, 2048, 16, torch.float16, "cpu")
    assert _rss_mib() - before < 32
    assert not store.k[0][:64].any() and not store.v[7][-64:].any()  # zeros
    before = _rss_mib()
    seq = SeqKV()
    BlockManager(store).reserve(seq, 16 * 64)  # 64 blocks written in every layer: 8 x 2 x 64 x 16 KiB = 16 MiB
    for li in range(8):
        store.k[li][seq.blocks] = 1.0
        store.v[li][seq.blocks] = 2.0
    grown = _rss_mib() - before
    assert 12 < grown < 32, grown
    assert float(store.k[3][seq.blocks].float().sum()) == 64 * 16 * 8 * 64


def test_freed_blocks_are_reused_first():
    kv = BlockManager(KVStore(1, 1, 8, 32, 4, torch.float16, "cpu"))
    a, b = SeqKV(), SeqKV()
    kv.reserve(a, 12)
    first = list(a.blocks)
    kv.clear(a)
    kv.reserve(b, 12)
    assert sorted(b.blocks) == sorted(first)


@pytest.mark.skipif(not qdot.available(), reason="the qdot C kernels need a C compiler")
def test_mapped_embedding_lookups_do_not_stay_resident(tmp_path):
    rows, cols, qtype, row_bytes = 65536, 1024, 8, 1024 // 32 * 34  # Q8_0, 68 MiB
    path = tmp_path / "table.bin"
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, size=(rows, cols // 32, 34), dtype=np.uint8)
    blocks[:, :, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)  # scale d of each block
    blocks.tofile(path)
    del blocks
    data = torch.from_numpy(np.memmap(path, dtype=np.uint8, mode="c", shape=(rows, row_bytes)))
    w = QWeight(data, qtype, rows, cols, mapped=True)
    before = _rss_mib()
    ids = torch.from_numpy(rng.permutation(rows)[:1024])
    out = kernels.embedding(ids, w)  # 4 MiB
    assert _rss_mib() - before < 12  # 1024 rows x 64 KiB of fault-around would be most of the table
    expect = kernels.ref.embedding(ids[:64], QWeight(data, qtype, rows, cols))
    assert torch.equal(out[:64], expect)
