"""Sliding-window layers keep only their window in the paged KV cache (the KV store's SWA pool,
its blocks handed out by runtime/serving/blocks.py; `--swa-full` keeps every position): the block bookkeeping on a small cache, then gemma3
(the real Gemma 3 270M with its window shrunk to a few blocks, as tests/test_gemma_arch.py does)
through the model and the engine: the same logits and greedy tokens with and without the SWA pool,
bounded SWA memory (what llama.cpp's SWA cache holds), prefix reuse only while the window is held, slot
files. The model tests skip (naming scripts/fetch_models.py) without the model."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from runtime.model.kv_store import NULL_BLOCK, KVStore, SeqKV
from runtime.serving.blocks import BlockManager, KVUsage, swa_blocks_for, swa_cells, swa_pool_blocks

BS = 4


def _swa_cache(window=6, n_swa=8, num_blocks=32) -> BlockManager:
    # layers 0 and 2 local, 1 global
    return BlockManager(KVStore(3, 1, 8, num_blocks, BS, torch.float32, "cpu", [window, 0, window], n_swa))


def _write(kv: BlockManager, seq: SeqKV, start: int, n: int) -> tuple[list, list]:
    kv.reserve(seq, start + n)
    kv.advance_window(seq, start, start + n)
    ks = [torch.randn(n, 1, 8) for _ in range(3)]
    vs = [torch.randn(n, 1, 8) for _ in range(3)]
    kv.store.scatter(seq, start, ks, vs)
    kv.commit(seq, start + n)
    return ks, vs


def test_window_frees_blocks_and_keeps_what_the_window_reads():
    kv = _swa_cache()
    assert kv.store.is_swa == [True, False, True] and kv.store.k[0].shape[0] == 9 and kv.store.k[1].shape[0] == 32
    s = SeqKV()
    written = [_write(kv, s, p, 1) for p in range(30)]  # decode one token at a time
    # the next token (position 30) reads 25..29: blocks 6 and 7; blocks 0..5 are dropped
    assert s.swa_blocks[:6] == [NULL_BLOCK] * 6 and NULL_BLOCK not in s.swa_blocks[6:]
    assert kv.swa_blocks_in_use() == 2 and s.swa_start == 24 and len(s.blocks) == 8
    assert kv.window_ok(s, 30) and kv.window_ok(s, 29) and not kv.window_ok(s, 28) and not kv.can_move(s)
    assert kv.usage() == KVUsage(32, 24, 8, 6)  # the SWA pool's null block is not counted
    ks, vs = kv.store.gather(s, 0, 30)
    for p in range(30):  # global layer: everything; local layers: the held positions, zeros below
        assert torch.equal(ks[1][p], written[p][0][1][0])
        want = written[p][0][0][0] if p >= 24 else torch.zeros(1, 8)
        assert torch.equal(ks[0][p], want)
    # a prefill chunk allocates its rows (window + chunk), the next step frees what it left behind
    _write(kv, s, 30, 9)
    assert kv.swa_blocks_in_use() == 4  # positions 25..38: blocks 6..9
    kv.advance_window(s, 39, 40)
    assert kv.swa_blocks_in_use() == 2
    kv.clear(s)
    assert kv.swa_blocks_in_use() == 0 and s.swa_blocks == [] and s.swa_start == 0


def test_export_import_and_truncate_keep_the_window_rule():
    kv = _swa_cache()
    a = SeqKV()
    for p in range(0, 20, 5):
        _write(kv, a, p, 5)
    state = kv.export(a)
    assert state.swa_start == 8 and bool((state.k[0, :8] == 0).all())
    b = SeqKV()
    kv.import_(b, state)
    assert b.n_tokens == 20 and b.swa_start == 14 and kv.window_ok(b, 20) and kv.window_ok(b, 19)
    ga, gb = kv.store.gather(a, 14, 20), kv.store.gather(b, 14, 20)
    assert all(torch.equal(x, y) for x, y in zip(ga[0] + ga[1], gb[0] + gb[1]))
    # a state without swa_start (a slot file) restores what the next token needs
    c = SeqKV()
    kv.import_(c, dataclasses.replace(state, swa_start=None))
    assert c.swa_start == 15 and kv.window_ok(c, 20) and not kv.window_ok(c, 19)
    # truncating into the dropped part: nothing of the window is left
    kv.truncate(a, 10)
    assert a.swa_start == 8 and not kv.window_ok(a, 10) and kv.window_ok(a, 0)
    kv.truncate(a, 6)
    assert a.swa_start == 6 and not kv.window_ok(a, 6) and a.swa_blocks == [NULL_BLOCK, NULL_BLOCK]
    for s in (a, b, c):
        kv.clear(s)
    assert kv.swa_blocks_in_use() == 0 and kv.pool.n_free == kv.pool.num_blocks


def test_shared_prefix_copies_a_shared_swa_block_before_writing():
    kv = _swa_cache()
    a = SeqKV()
    _write(kv, a, 0, 10)
    b = kv.share_prefix(a, 10)
    assert b.swa_blocks == a.swa_blocks and kv.swa_pool.refs[a.swa_blocks[2]] == 2
    before = kv.store.gather(a, 8, 10)[0][0].clone()
    _write(kv, b, 10, 1)
    assert b.swa_blocks[2] != a.swa_blocks[2] and torch.equal(kv.store.gather(a, 8, 10)[0][0], before)
    assert torch.equal(kv.store.gather(b, 8, 10)[0][0], before)


def test_pool_size_bound():
    # 4 slots of gemma-3-270m's window 512 with -ub 512: 4 * 34 + 32 blocks of 16 (llama.cpp: 2560 cells)
    assert swa_blocks_for(512, 4, 512, 16) == 168
    # llama.cpp's SWA cache cells, GGML_PAD(min(n_ctx_seq, n_swa * (n_seq if unified else 1) + n_ubatch),
    # 256) per stream, and the pool holding at least those (one partial block per sequence more)
    assert swa_cells(512, 1, 512, 4096, False) == 1024 and swa_cells(512, 4, 512, 8192, True) == 2560
    assert swa_cells(8, 2, 512, 2048, False) == 2 * 768 and swa_cells(512, 2, 512, 512, False) == 2 * 512
    assert swa_pool_blocks(512, 4, 512, 8192, True, 16) == 168  # (the windows' bound is larger)
    assert swa_pool_blocks(8, 1, 512, 2048, False, 16) == 768 // 16 + 1


def _retaining(keep_blocks: int) -> BlockManager:
    # window 6 (layers 0 and 2), micro-batches of up to 4 rows, two sequences: `keep_blocks` beyond what
    # their windows and a micro-batch need
    n_swa = swa_blocks_for(6, 2, 4, BS) + keep_blocks
    return BlockManager(KVStore(3, 1, 8, 64, BS, torch.float32, "cpu", [6, 0, 6], n_swa), swa_keep=keep_blocks * BS)


def test_blocks_below_the_window_are_kept_until_the_pool_needs_them():
    """As llama.cpp's SWA cache, which overwrites masked cells only when it needs them: positions
    below the window stay (the prefix stays resumable, window_ok) until the pool is full; then the
    sequence keeping the most of them gives its oldest back; what the windows need is never taken."""
    kv = _retaining(3)
    pool = kv.swa_pool.num_blocks - 1
    assert pool == 2 * 4 + 1 + 3
    a, b = SeqKV(), SeqKV()
    for p in range(40):
        _write(kv, a, p, 1)
    assert kv.swa_blocks_in_use() == 10 and a.swa_start == 0 and kv.window_ok(a, 3)  # all of it
    for p in range(40, 60):
        _write(kv, a, p, 1)
    # the pool is full: a's oldest blocks went, one per new block
    assert kv.swa_blocks_in_use() == pool and a.swa_blocks[:3] == [NULL_BLOCK] * 3 and a.swa_start == 12
    assert kv.window_ok(a, 17) and not kv.window_ok(a, 16)
    for p in range(0, 24, 4):  # b arrives: a, keeping the most, gives its oldest blocks back
        _write(kv, b, p, 4)
    held_a = sum(x != NULL_BLOCK for x in a.swa_blocks)
    held_b = sum(x != NULL_BLOCK for x in b.swa_blocks)
    assert (held_a, held_b) == (6, 6) and b.swa_start == 0 and kv.window_ok(b, 1)
    assert a.swa_start == 36 and kv.window_ok(a, 59)  # (a's window is whole)
    kv.truncate(a, 56)  # a truncation keeps what was held below it
    assert kv.window_ok(a, 56) and a.swa_lo == (56 - 6 + 1) // BS
    kv.clear(a)
    kv.clear(b)
    assert kv.swa_blocks_in_use() == 0


def test_an_import_restores_what_the_pool_may_keep():
    kv = _retaining(3)
    a = SeqKV()
    written = [_write(kv, a, p, 1) for p in range(60)]
    state = kv.export(a)
    assert state.swa_start == a.swa_start == 12
    kv.clear(a)
    b = SeqKV()
    kv.import_(b, state)
    # its window (6) and the pool's 3 spare blocks' positions (12) before it: from 60 - 18 = 42 on
    assert b.swa_start == 42 and kv.window_ok(b, 60) and kv.window_ok(b, 47) and not kv.window_ok(b, 46)
    ks, _ = kv.store.gather(b, 42, 60)
    assert all(torch.equal(ks[0][p - 42], written[p][0][0][0]) for p in range(42, 60))


# ---- gemma3 --------------------------------------------------------------------------------------

WINDOW = 16


@pytest.fixture(scope="module")
def gemma_path():
    from runtime.model.model_files import GEMMA
    from tests.llama_tokens import real_model_path

    return str(real_model_path(GEMMA))


def test_model_logits_equal_with_the_swa_pool_and_match_the_reference(gemma_path):
    """tests/test_gemma_arch.py's prompt and float64 reference (window 5), blocks of 4: the local
    layers drop blocks while the prompt is fed, the logits stay those of the full cache."""
    from runtime.model.loader import load_model
    from runtime.model.decoder import Model, SeqBatch
    from tests import test_gemma_arch as ga

    lm = load_model(gemma_path, progress=lambda m: None)
    lm.config.sliding_window = ga.WINDOW
    m = Model(lm, "cpu", backend="cpu")
    windows = [L.window for L in m.layers]
    full = BlockManager(KVStore(18, m.n_head_kv, m.head_dim, 8, 4, torch.float32))
    swa = BlockManager(KVStore(18, m.n_head_kv, m.head_dim, 8, 4, torch.float32, "cpu", windows, swa_blocks_for(5, 1, 7, 4)))
    out = {}
    for name, kv in (("full", full), ("swa", swa)):
        seq, got = SeqKV(), []
        for start, end in [(0, 7)] + [(i, i + 1) for i in range(7, len(ga.PROMPT))]:
            kv.reserve(seq, end)
            kv.advance_window(seq, start, end)
            logits, _ = m.forward(kv.store, [SeqBatch(seq, ga.PROMPT[start:end], start)])
            got.append(logits[0])
            kv.commit(seq, end)
        out[name] = torch.stack(got)
    assert swa.swa_blocks_in_use() == 2 and seq.swa_blocks[0] == NULL_BLOCK  # keys 7..11 in blocks 1, 2
    assert torch.equal(out["swa"], out["full"])
    rows = torch.unique(out["swa"].topk(20, dim=-1).indices.flatten())
    want = ga.reference_logits(lm, ga.PROMPT, rows)[6:]
    ga.assert_argmax_where_clear(out["swa"][:, rows].double(), want)


def _engine(path, **kw):
    from runtime.serving import Engine, EngineConfig

    # ctx_checkpoints 0: the prompt batches of both caches are the same (llama-server's checkpoint
    # breaks are off with --swa-full), so their tokens must be; no RAM prompt cache: what is reused
    # is what the slot holds
    e = Engine(EngineConfig(model_path=path, verbosity=0, n_ctx=1024, n_parallel=1, n_batch=32, n_ubatch=32,
                            config_overrides={"sliding_window": WINDOW}, ctx_checkpoints=0, cache_ram_mib=0, **kw))
    e.load()
    e.start()
    return e


@pytest.fixture(scope="module")
def engines(gemma_path, tmp_path_factory):
    d = str(tmp_path_factory.mktemp("swa_slots"))
    es = {name: _engine(gemma_path, swa_full=name == "full", slot_save_path=d) for name in ("swa", "full")}
    yield es
    for e in es.values():
        e.stop()


def _run(e, ids, n=120, cache_prompt=True):
    from runtime.tasks import CompletionResult, CompletionTask, SamplingParams

    res = e.submit(CompletionTask(ids, SamplingParams(temperature=0), n_predict=n,
                                  cache_prompt=cache_prompt)).result_sync(timeout=600)
    assert isinstance(res, CompletionResult), res
    return res


PROMPT = "The history of the city of Rome begins with a small settlement on the banks of the river"


def test_engine_memory_bounded_and_tokens_unchanged(engines):
    swa, full = engines["swa"], engines["full"]
    assert swa.blocks.window == WINDOW and full.blocks.window == 0
    assert swa.blocks.store.nbytes < full.blocks.store.nbytes
    ids = swa.tokenizer.encode(PROMPT, add_special=True, parse_special=True)
    a, b = _run(swa, ids), _run(full, ids)
    assert a.tokens == b.tokens and len(a.tokens) == 120
    n_cached = len(ids) + 119
    # the slot keeps every position for the global layers; for the local ones what llama.cpp's SWA
    # cache holds (256 cells here: all of them) in a pool of that size
    assert swa.blocks.pool.num_blocks - swa.blocks.pool.n_free == (n_cached + 15) // 16
    assert swa.blocks.swa_pool.num_blocks - 1 == 256 // 16 + 1
    assert swa.blocks.swa_blocks_in_use() == (n_cached + 15) // 16


def test_prefix_reuse_only_while_the_window_is_held(engines):
    """(A reused prefix gives the tokens the full cache gives when it reuses it: the prefix was fed
    in other chunks than a fresh prompt's, so a fresh run may round differently, with either cache.)"""
    swa, full = engines["swa"], engines["full"]
    tk = swa.tokenizer
    ids = tk.encode(PROMPT, add_special=True, parse_special=True)
    first = _run(swa, ids, n=60)
    assert first.tokens == _run(full, ids, n=60).tokens
    # a continuation (the whole cached prefix, far past the window): reused as with the full cache
    cont = ids + first.tokens + tk.encode(" In the year", add_special=False, parse_special=False)
    again, again_full = _run(swa, cont, n=40), _run(full, cont, n=40)
    assert again.timings.cache_n == again_full.timings.cache_n == len(ids) + 59
    assert again.tokens == again_full.tokens
    # computed afresh: the same with both caches
    fresh = _run(swa, cont, n=40, cache_prompt=False)
    assert fresh.tokens == _run(full, cont, n=40, cache_prompt=False).tokens
    # a prompt sharing only a prefix that ends before the window, within what llama.cpp's SWA cache
    # would still hold (256 cells): the local layers kept it too, reused as with the full cache
    _run(swa, cont, n=40)
    _run(full, cont, n=40)
    early = cont[:len(ids) + 10] + tk.encode(" Carthage", add_special=False, parse_special=False)
    r_swa, r_full = _run(swa, early, n=20), _run(full, early, n=20)
    assert r_swa.timings.cache_n == r_full.timings.cache_n == len(ids) + 10 and r_swa.tokens == r_full.tokens
    # past those cells (a long prompt): the local layers dropped the prefix, so it is computed again
    # (the full cache reuses it), giving the tokens of a fresh run
    long = cont[:len(ids) + 10] + tk.encode((" " + PROMPT) * 16, add_special=False, parse_special=False)
    assert len(long) > 256 + 2 * 16
    _run(swa, long, n=2)
    _run(full, long, n=2)
    r_swa, r_full = _run(swa, early, n=20), _run(full, early, n=20)
    assert r_swa.timings.cache_n == 0 and r_full.timings.cache_n == len(ids) + 10
    assert r_swa.tokens == _run(swa, early, n=20, cache_prompt=False).tokens


def test_slot_file_save_restore_continues_the_same(engines):
    swa, full = engines["swa"], engines["full"]
    tk = swa.tokenizer
    ids = tk.encode("A recipe for bread: take flour, water and salt, then", add_special=True, parse_special=True)
    first = _run(swa, ids, n=50)
    swa.slot_action(0, "save", "swa.bin")
    swa.slot_action(0, "erase")
    swa.slot_action(0, "restore", "swa.bin")
    cont = ids + first.tokens + tk.encode(" Next,", add_special=False, parse_special=False)
    again = _run(swa, cont, n=30)
    assert again.timings.cache_n == len(ids) + 49
    _run(full, ids, n=50)
    assert again.tokens == _run(full, cont, n=30).tokens  # the full cache reusing the same prefix


def test_decode_graph_buffers_carry_the_swa_tables(engines, gemma_path):
    """The CUDA-graph decode path (its static buffers, run eagerly on the CPU) with the SWA pool."""
    e = _engine(gemma_path, cuda_graphs="eager")
    try:
        assert e.runner.graphs is not None and e.runner.graphs.swa and e.blocks.window == WINDOW
        ids = e.tokenizer.encode(PROMPT, add_special=True, parse_special=True)
        assert _run(e, ids, n=60).tokens == _run(engines["full"], ids, n=60, cache_prompt=False).tokens
        assert 0 < e.blocks.swa_blocks_in_use() <= e.blocks.swa_pool.num_blocks - 1
    finally:
        e.stop()


def test_context_checkpoint_restores_the_window():
    """A context checkpoint taken before the batch at c holds the window the SWA layers had then; a
    sequence truncated to c - 1 after its window moved on gets those rows back (llama-server's
    checkpoint restore), and only then counts its window as held."""
    kv = _swa_cache()
    s = SeqKV()
    written = [_write(kv, s, p, 1) for p in range(20)]
    kv.checkpoint(s, [20])  # before the batch starting at position 20
    assert set(s.swa_ckpt) == {20} and s.swa_ckpt[20][0] == s.swa_start == 12
    for p in range(20, 40):
        _write(kv, s, p, 1)
    assert s.swa_start == 32 and kv.window_ok(s, 19)  # (through the checkpoint)
    kv.truncate(s, 19)
    assert s.swa_start == 12 and kv.window_ok(s, 19)  # (from the window's first block, 14 // 4 * 4)
    ks, vs = kv.store.gather(s, 14, 19)  # the next token (19) reads 14..18
    for p in range(14, 19):
        assert torch.equal(ks[0][p - 14], written[p][0][0][0]) and torch.equal(vs[2][p - 14], written[p][1][2][0])
    # positions the checkpoint does not cover, and checkpoints past a truncation, are gone
    kv.truncate(s, 10)
    assert s.swa_ckpt == {} and not kv.window_ok(s, 10)
    kv.clear(s)
    assert kv.swa_blocks_in_use() == 0
