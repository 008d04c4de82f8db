"""Pure scheduler policies: prefix match, --cache-reuse plan, RAM prompt cache, stop strings, slot files."""
from __future__ import annotations

import pytest
import torch

from runtime.kv_cache import KVCache, SeqKV
from runtime.scheduler import (PromptCache, SlotFileError, TextState, cache_reuse_plan, common_prefix,
                               read_slot_file, write_slot_file)


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def test_cache_reuse_plan_lesson_example_10():
    # cached: 5 header tokens + 38 prompt tokens + 1 generated; new prompt: the 38 without the header
    body = list(range(100, 138))
    cache = [1, 2, 3, 4, 5] + body + [999]
    moves, n_past = cache_reuse_plan(cache, body, 0, 8)
    assert moves == [(5, 0, 38)] and n_past == 38
    # a chunk shorter than the threshold is not reused
    moves, n_past = cache_reuse_plan([1, 2, 3] + body[:5], body[:5] + [7], 0, 8)
    assert moves == [] and n_past == 0


def _state(n):
    return {"k": torch.zeros(1, n, 1, 4), "v": torch.zeros(1, n, 1, 4)}


def test_prompt_cache_save_dedup_and_take_best():
    pc = PromptCache(limit_bytes=None)
    a = list(range(40))
    assert pc.save(a, lambda: _state(40))
    assert not pc.save(a[:20], lambda: _state(20))  # already a prefix of a saved prompt
    b = list(range(1000, 1008))
    pc.save(b, lambda: _state(8))
    # the new prompt shares 30 tokens with `a`: it beats an unrelated slot content
    new = a[:30] + [5000] * 8
    e = pc.take_best(b, new)
    assert e is not None and e.tokens == a
    assert [x.tokens for x in pc.entries] == [b]  # a hit moves the state out of the cache
    # entries keeping less than a quarter of themselves are never used
    pc.save(list(range(100)), lambda: _state(100))
    assert pc.take_best([], list(range(20)) + [7]) is None


def test_prompt_cache_evicts_oldest_over_limit():
    per = _state(10)
    size = sum(t.numel() * t.element_size() for t in per.values())
    pc = PromptCache(limit_bytes=2 * size)
    for i in range(4):
        pc.save([i * 100 + j for j in range(10)], lambda: _state(10))
        pc.update()
    assert len(pc.entries) == 2 and pc.entries[0].tokens[0] == 200


def test_text_state_stop_strings_and_utf8():
    t = TextState(["STOP"])
    assert t.push(b"hello ") == (None, "hello ")
    assert t.push(b"ST") == (None, "")  # could be the start of STOP: held back
    assert t.push(b"x") == (None, "STx")
    w, d = t.push(b" STOP more")
    assert w == "STOP" and d == " " and t.final() == "hello STx " and t.stopping_word == "STOP"
    u = TextState([])
    euro = "€".encode()
    assert u.push(euro[:1]) == (None, "")
    assert u.push(euro[1:]) == (None, "€")


def test_slot_file_roundtrip_and_size(tmp_path):
    kv = KVCache(n_layers=4, n_kv_heads=2, head_dim=32, num_blocks=8, block_size=16, dtype=torch.float16)
    s = SeqKV()
    kv.reserve(s, 28)
    ks = [torch.randn(28, 2, 32) for _ in range(4)]
    kv.scatter(s, 0, ks, ks)
    s.n_tokens = 28
    path = tmp_path / "x.bin"
    n = write_slot_file(str(path), list(range(28)), kv.export(s), seq_id=0, n_stream=2)
    # 1,024 bytes of KV + 4 token id + 12 cell metadata per token and 144 fixed bytes with two
    # slots, as the lesson's llama-server files (29,264 bytes for 28 tokens)
    assert n == path.stat().st_size == 29264
    tokens, state, n_read = read_slot_file(str(path), kv, n_stream=2)
    assert tokens == list(range(28)) and n_read == n
    assert torch.equal(state["k"], kv.export(s)["k"])
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"nope" * 10)
    try:
        read_slot_file(str(bad), kv)
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
    kv = KVCache(n_layers=4, n_kv_heads=2, head_dim=32, num_blocks=8, block_size=16, dtype=torch.float16)
    tokens, state, n_read = read_slot_file(str(src), kv, n_stream=2)
    assert len(tokens) == n_tok and n_read == src.stat().st_size == 144 + n_tok * 1040
    out = tmp_path / "again.bin"
    assert write_slot_file(str(out), tokens, state, seq_id=seq_id, n_stream=2) == n_read
    assert out.read_bytes() == src.read_bytes()
    with pytest.raises(SlotFileError):  # a unified cache has one stream
        read_slot_file(str(src), kv, n_stream=1)


def test_indent_rule_cuts_a_less_indented_line():
    t = TextState([])
    pieces = ["def f():\n", "    return 1\n", "x = 2"]
    stops = []
    for p in pieces:
        t.push(p.encode())
        stops.append(t.indent_stop(4))
    assert stops == [False, False, True]
    assert t.text == "def f():\n    return 1\n"  # the unindented line is cut
    u = TextState([])
    for p in pieces[:2]:
        u.push(p.encode())
        assert not u.indent_stop(0)
