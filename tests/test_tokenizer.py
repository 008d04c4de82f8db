"""runtime.tokenizer against llama.cpp's tokenizer test vectors and the lesson's examples."""
from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np
import pytest

from runtime.tokenizer import (
    VOCAB_TYPE_BPE,
    VOCAB_TYPE_SPM,
    IncrementalDecoder,
    Tokenizer,
    load_tokenizer,
    tokenizer_from_gguf_metadata,
)

SHARED = Path(__file__).resolve().parents[2] / "shared"
VOCAB = SHARED / "vocab"
VOCAB_NAMES = ["deepseek-coder", "deepseek-llm", "gpt-2", "llama-bpe", "llama-spm", "phi-3", "qwen2",
               "starcoder"]


def _need_vocab(name: str) -> Path:
    p = VOCAB / f"ggml-vocab-{name}.gguf"
    if not p.exists():
        pytest.skip(f"{p} not available")
    return p


@functools.lru_cache(maxsize=None)
def _tok(name: str) -> Tokenizer:
    return load_tokenizer(_need_vocab(name))


def _cases(name: str) -> list[tuple[str, list[int]]]:
    p = _need_vocab(name)
    texts = Path(str(p) + ".inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    lines = Path(str(p) + ".out").read_text(encoding="utf-8").split("\n")
    # the .inp file ends with a separator: one text per .out line
    texts = texts[:-1] if texts[-1] == "" else texts
    assert len(lines) >= len(texts)
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines)]


# ---------------------------------------------------------------------------------------------
# llama.cpp test vectors (acceptance)

@pytest.mark.parametrize("name", VOCAB_NAMES)
def test_vocab_vectors_encode(name):
    tok = _tok(name)
    cases = _cases(name)
    assert len(cases) > 40
    bad = [(text, want, tok.encode(text)) for text, want in cases
           if tok.encode(text, add_special=False, parse_special=False) != want]
    assert not bad, bad[:3]


@pytest.mark.parametrize("name", VOCAB_NAMES)
def test_vocab_vectors_decode_round_trip(name):
    tok = _tok(name)
    bad = [(text, tok.decode(ids)) for text, ids in _cases(name) if tok.decode(ids) != text]
    assert not bad, bad[:3]


def test_vocab_types_and_specials():
    assert _tok("qwen2").vocab_type == VOCAB_TYPE_BPE
    assert _tok("llama-spm").vocab_type == VOCAB_TYPE_SPM
    assert _tok("phi-3").vocab_type == VOCAB_TYPE_SPM
    # add_bos: absent key + llama3 pre-tokenizer -> True; qwen2 -> False; SPM default/key -> True
    assert _tok("llama-bpe").add_bos and _tok("llama-bpe").bos_id == 128000
    assert not _tok("qwen2").add_bos
    assert _tok("llama-spm").add_bos and not _tok("llama-spm").add_eos
    assert _tok("llama-bpe").encode("Hi", add_special=True)[0] == 128000
    assert _tok("llama-bpe").encode("Hi", add_special=True)[1:] == _tok("llama-bpe").encode("Hi")
    assert _tok("qwen2").encode("Hi", add_special=True) == _tok("qwen2").encode("Hi")
    spm = _tok("llama-spm")
    assert spm.encode("Hello", add_special=True) == [1, 15043]


# ---------------------------------------------------------------------------------------------
# qwen2: the lesson's /tokenize examples

def test_qwen2_lesson_examples():
    tok = _tok("qwen2")
    assert tok.n_vocab == 151936
    ids = tok.encode("public static void main")
    assert ids == [888, 1099, 737, 1887]
    assert [tok.piece(i) for i in ids] == [b"public", b" static", b" void", b" main"]
    assert tok.encode("<|im_start|>user", parse_special=True) == [151644, 872]
    assert tok.encode("<|im_start|>user", parse_special=False) == [27, 91, 318, 4906, 91, 29, 872]
    assert tok.piece(151644) == b"<|im_start|>"
    assert tok.decode([888, 1099, 737, 1887]) == "public static void main"


def test_qwen2_eog_and_metadata():
    tok = _tok("qwen2")
    assert tok.bos_id == 151643 and tok.eos_id == 151643
    # <|endoftext|>, <|im_end|>, and '</s>' (control-looking, overridden as llama.cpp warns)
    assert tok.eot_ids == {151643, 151645, 128247}
    assert tok.is_eog(151645) and not tok.is_eog(151644)
    assert tok.token_type(151644) == 3 and tok.token_type(888) == 1
    assert tok.token_type(128247) == 3
    assert any("128247 '</s>'" in w for w in tok.warnings)
    assert tok.chat_template is not None and "<|im_start|>" in tok.chat_template
    assert 151644 in tok.control_ids() and 888 not in tok.control_ids()


def test_llama3_eog():
    tok = _tok("llama-bpe")
    eot = tok.token_id("<|eot_id|>")
    assert eot is not None and eot in tok.eot_ids and 128001 in tok.eot_ids
    assert tok.encode("<|eot_id|>", parse_special=True) == [eot]
    assert eot not in tok.encode("<|eot_id|>", parse_special=False)


def test_special_rendering_and_decode_flags():
    tok = _tok("qwen2")
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>", parse_special=True)
    assert ids[0] == 151644 and ids[-1] == 151645
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>"
    assert tok.decode(ids, special=False) == "user\nhi"
    assert tok.piece(151645, special=False) == b""
    # special tokens in the middle of text, and adjacent to each other
    text = "a<|im_end|><|im_start|>b"
    ids = tok.encode(text, parse_special=True)
    assert ids[1:3] == [151645, 151644]
    assert tok.decode(ids) == text


def test_token_pieces_cached_and_consistent():
    tok = _tok("qwen2")
    pieces = tok.token_pieces()
    assert pieces is tok.token_pieces()
    assert len(pieces) == tok.n_vocab
    assert pieces[1099] == b" static" and pieces[151644] == b"<|im_start|>"
    assert all(isinstance(p, bytes) for p in pieces[:1000])


# ---------------------------------------------------------------------------------------------
# SPM details

def test_spm_parse_special_and_space_prefix():
    tok = _tok("llama-spm")
    # a fragment after a special token gets the space prefix again
    assert tok.encode("<s>Hello", parse_special=True) == [1, 15043]
    assert 1 not in tok.encode("<s>Hello", parse_special=False)
    # decode drops one leading space of the first piece (llama_detokenize)
    assert tok.decode([15043]) == "Hello"
    assert tok.decode([15043], remove_leading_space=False) == " Hello"
    assert tok.piece(15043) == b" Hello"
    # after a BOS the space stays (llama_detokenize strips the first token only)
    assert tok.decode([1, 15043]) == "<s> Hello"
    assert tok.decode([1, 15043], special=False) == " Hello"


def test_spm_byte_fallback_pieces_and_incremental_decoding():
    tok = _tok("llama-spm")
    ids = tok.encode("🦙")
    # "▁" then the 4 UTF-8 bytes of the emoji as <0xXX> tokens
    byte_ids = [i for i in ids if tok.token_type(i) == 6]
    assert [tok.piece(i) for i in byte_ids] == [bytes([b]) for b in "🦙".encode()]
    dec = IncrementalDecoder(tok)
    outs = [dec.push(i) for i in ids]
    assert "".join(outs) + dec.flush() == " 🦙"
    assert all("\ufffd" not in o for o in outs)
    assert outs[-1].endswith("🦙") and all("🦙" not in o for o in outs[:-1])


def test_phi3_rstrip_and_user_defined():
    tok = _tok("phi-3")
    assert tok.eot_ids == {2, 32000, 32007}
    user, end = tok.token_id("<|user|>"), tok.token_id("<|end|>")
    ids = tok.encode("<|user|>\nHi<|end|>", parse_special=True)
    # phi-3 special tokens strip the whitespace that follows them
    assert ids == [user] + tok.encode("Hi") + [end]
    # '</s>' is user-defined in this vocab, but llama.cpp makes it control (an EOG text), so it
    # is only split out with parse_special
    assert tok.token_type(2) == 3
    assert any("2 '</s>'" in w for w in tok.warnings)
    assert 2 not in tok.encode("a</s>b", parse_special=False)
    assert 2 in tok.encode("a</s>b", parse_special=True)
    assert 32007 not in tok.encode("<|end|>", parse_special=False)


# ---------------------------------------------------------------------------------------------
# incremental decoding (byte-level BPE)

def test_incremental_decoder_holds_back_partial_utf8():
    tok = _tok("qwen2")
    text = "héllo 🦙 世界 ok"
    ids = tok.encode(text)
    assert any(_invalid_utf8(tok.piece(i)) for i in ids)  # some piece splits a character
    dec = IncrementalDecoder(tok)
    outs = [dec.push(i) for i in ids]
    assert "".join(outs) + dec.flush() == text
    assert all("\ufffd" not in o for o in outs)


def test_incremental_decoder_invalid_and_flush():
    tok = _tok("qwen2")
    dec = IncrementalDecoder(tok)
    assert dec.push_bytes(b"a\xf0\x9f") == "a"
    assert dec.pending == b"\xf0\x9f"
    assert dec.flush() == "\ufffd"
    # a byte that can never start a character is replaced at once, not held back
    assert dec.push_bytes(b"\xff") == "\ufffd"
    assert dec.push_bytes(b"\xe4\xb8") == "" and dec.push_bytes(b"\x96x") == "\u4e16x"


def _invalid_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


# ---------------------------------------------------------------------------------------------
# performance

def test_qwen2_encode_speed():
    tok = _tok("qwen2")
    text = " ".join(f"word{i} and, more: text {i * 7}!" for i in range(400))
    ids = tok.encode(text)
    assert len(ids) > 2000
    times = []
    for _ in range(5):
        t = time.perf_counter()
        tok.encode(text)
        times.append(time.perf_counter() - t)
    # a few ms on an idle core; generous bound for busy CI machines
    assert min(times) < 0.05, times


def test_qwen2_load_speed():
    p = _need_vocab("qwen2")
    t = time.perf_counter()
    load_tokenizer(p)
    assert time.perf_counter() - t < 6.0  # ~0.6 s on an idle machine


def _write_vocab_gguf(path: Path, kv: dict) -> None:
    import gguf
    w = gguf.GGUFWriter(str(path), "llama")
    for k, v in kv.items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        elif k == "tokenizer.ggml.scores":
            w.add_array(k, [float(x) for x in v])
        else:
            w.add_array(k, list(v))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_synthetic_spm_vocab(tmp_path):
    """A hand-made SPM vocab: merges follow the scores, unknown characters fall back to bytes."""
    pytest.importorskip("gguf")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    normal = ["\u2581", "a", "b", "c", "ab", "bc", "\u2581a", "abc", "\u2581abc"]
    scores = [0.0] * len(tokens) + [-1.0, -2.0, -2.0, -2.0, -5.0, -3.0, -4.0, -7.0, -8.0]
    tokens += normal
    types += [1] * len(normal)
    idx = {t: i for i, t in enumerate(tokens)}
    path = tmp_path / "spm.gguf"
    _write_vocab_gguf(path, {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    })
    tok = load_tokenizer(path)
    assert tok.vocab_type == VOCAB_TYPE_SPM
    # "▁abc": bc (-3) first, then ▁a (-4), then ▁a+bc -> ▁abc (-8)
    assert tok.encode("abc") == [idx["\u2581abc"]]
    # "▁ab": ▁a (-4) beats ab (-5), and "▁ab" is not a token
    assert tok.encode("ab") == [idx["\u2581a"], idx["b"]]
    # "▁bc": only bc merges
    assert tok.encode("bc") == [idx["\u2581"], idx["bc"]]
    # 'z' is not a token: byte fallback
    assert tok.encode("z") == [idx["\u2581"], idx["<0x7A>"]]
    assert tok.decode(tok.encode("ab z")) == "ab z"
    assert tok.encode("x", add_special=True)[0] == 1


def test_unknown_pre_tokenizer_rejected():
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "no-such-pre",
          "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.merges": []}
    with pytest.raises(ValueError, match="pre-tokenizer"):
        tokenizer_from_gguf_metadata(md)


def test_encode_empty():
    tok = _tok("qwen2")
    assert tok.encode("") == []
    assert _tok("llama-spm").encode("", add_special=True) == [1]
    assert tok.decode([]) == ""
    assert np.asarray(tok.encode("x")).dtype.kind == "i"


def test_lone_surrogates_become_replacement_char():
    tok = _tok("gpt-2")
    assert tok.encode("a\ud83db") == tok.encode("a\ufffdb")


# ---------------------------------------------------------------------------------------------
# start-up fast paths: whole-vocabulary passes equal the per-token code they shortcut

def _per_token_pieces(texts, attrs, vocab_type):
    from runtime.tokenizer import vocab as v
    saved = v._byte_level_pieces
    v._byte_level_pieces = lambda *a: None
    try:
        return v.token_pieces(texts, attrs, vocab_type)
    finally:
        v._byte_level_pieces = saved


def _per_token_texts_and_vocab(raw):
    from runtime.tokenizer import from_gguf as f
    saved = f._texts_and_vocab_fast
    f._texts_and_vocab_fast = lambda raw: None
    try:
        return f._texts_and_vocab(raw)
    finally:
        f._texts_and_vocab_fast = saved


def _per_merge_split(lines):
    from runtime.tokenizer.from_gguf import _split_merges
    return _split_merges(lines)


@pytest.mark.parametrize("name", VOCAB_NAMES)
def test_load_fast_paths_equal_per_token_paths(name):
    from runtime.model.gguf import read_gguf_metadata
    from runtime.tokenizer import from_gguf as f
    from runtime.tokenizer.vocab import ATTR_UNDEFINED, TYPE_TO_ATTR, token_pieces

    md = read_gguf_metadata(_need_vocab(name))
    raw = md["tokenizer.ggml.tokens"]
    texts, vocab = f._texts_and_vocab(raw)
    assert f._texts_and_vocab_fast(raw) is not None or not all(type(t) is str and t for t in raw)
    slow_texts, slow_vocab = _per_token_texts_and_vocab(raw)
    assert texts == slow_texts and vocab == slow_vocab
    types = md["tokenizer.ggml.token_type"]
    attrs = f._attrs_of_types(types)
    assert attrs == [TYPE_TO_ATTR.get(int(t), ATTR_UNDEFINED) for t in types]
    pieces = token_pieces(texts, attrs, _tok(name).vocab_type)
    assert pieces == _per_token_pieces(texts, attrs, _tok(name).vocab_type)
    merges = md.get("tokenizer.ggml.merges", [])
    assert f._parse_merges(merges) == _per_merge_split(list(merges))


def test_load_fast_paths_odd_inputs():
    """The cases the fast paths hand back to the per-token code: repeated texts keep their first id,
    an empty text, merges with a leading space or none, types outside the table, a text with a
    char outside the byte alphabet."""
    from runtime.tokenizer import from_gguf as f
    from runtime.tokenizer.vocab import ATTR_NORMAL, ATTR_UNDEFINED, VOCAB_TYPE_BPE, token_pieces

    texts, vocab = f._texts_and_vocab(["a", "b", "a", "c"])
    assert texts == [b"a", b"b", b"a", b"c"] and vocab == {"a": 0, "b": 1, "c": 3}
    texts, vocab = f._texts_and_vocab(["a", "", "c"])
    assert texts == [b"a", b"[EMPTY_1]", b"c"] and vocab["[EMPTY_1]"] == 1
    merges = ["a b", " x y", "nospace", "c d e"]
    assert f._parse_merges(merges) == _per_merge_split(merges) == [("a", "b"), (" x", "y"), ("c", "d e")]
    assert f._parse_merges(["a b", "c\nd e"]) == [("a", "b"), ("c\nd", "e")]
    assert f._attrs_of_types([1, 99, -3, 3]) == [ATTR_NORMAL, ATTR_UNDEFINED, ATTR_UNDEFINED, 1 << 3]
    odd = [b"ab", "x\u4e00".encode(), "\u010a".encode(), b"c\nd"]
    attrs = [ATTR_NORMAL] * 4
    assert token_pieces(odd, attrs, VOCAB_TYPE_BPE) == _per_token_pieces(odd, attrs, VOCAB_TYPE_BPE)


def test_spm_merges_are_cached_and_reused(tmp_path, monkeypatch):
    """The ranked SPM merges (a search over every split of every token: ~1.4 s for Gemma 3's
    262k tokens) are kept under $TRITIUM_CACHE/tokenizers and read back at the next build, with
    the same merges; a damaged file is recomputed and rewritten; another vocabulary gets its own."""
    from runtime.model.gguf import read_gguf_metadata
    from runtime.tokenizer import from_gguf as f

    monkeypatch.setenv("TRITIUM_CACHE", str(tmp_path))
    md = read_gguf_metadata(_need_vocab("llama-spm"))
    texts, vocab = f._texts_and_vocab(md["tokenizer.ggml.tokens"])
    scores = np.asarray(md["tokenizer.ggml.scores"], dtype=np.float32)
    def spm_merges(sc, tx=None):  # the ranked merges an SPM recipe builds its encoder with
        return f._merge_strings(vocab, f._spm_merge_ids(vocab, sc, tx))

    first = spm_merges(scores, texts)
    assert first == spm_merges(scores)  # uncached: the same search
    files = list((tmp_path / "tokenizers").glob("spm-merges-*.npy"))
    assert len(files) == 1 and len(first) > 1000

    calls = []
    real = f._spm_search
    monkeypatch.setattr(f, "_spm_search", lambda *a: calls.append(1) or real(*a))
    assert spm_merges(scores, texts) == first and not calls  # read back, no search
    files[0].write_bytes(b"not an array")
    assert spm_merges(scores, texts) == first and calls == [1]  # recomputed
    assert spm_merges(scores, texts) == first and calls == [1]  # and rewritten
    np.save(files[0], np.array([[0, len(texts)]], dtype=np.int32))  # an array, but an id past the end
    assert spm_merges(scores, texts) == first and calls == [1, 1]
    other = scores.copy()
    other[100] += 1.0
    spm_merges(other, texts)
    assert calls == [1, 1, 1] and len(list((tmp_path / "tokenizers").glob("spm-merges-*.npy"))) == 2


@pytest.mark.parametrize("name", VOCAB_NAMES)
def test_vocab_vectors_through_a_pickled_tokenizer(name):
    """A forked start-up (runtime/launch/preload.py) pickles the tokenizer before its encoder is built:
    the unpickled one, its encoder built, tokenizes llama.cpp's vectors as the ordinary one."""
    import pickle

    from runtime.model.gguf import read_gguf_metadata

    md = read_gguf_metadata(_need_vocab(name))
    sent = tokenizer_from_gguf_metadata(md, build_encoder=False)
    tok = pickle.loads(pickle.dumps(sent, protocol=5)).build_encoder()
    assert tok.build_encoder() is tok  # once
    cases = _cases(name)
    bad = [(text, want) for text, want in cases if tok.encode(text, add_special=False, parse_special=False) != want]
    assert not bad, bad[:3]
    ref = _tok(name)
    assert tok.token_pieces() == ref.token_pieces() and tok.fim_ids == ref.fim_ids and tok.eot_ids == ref.eot_ids
    assert tok.token_id(ref.token_text(ref.eos_id)) == ref.eos_id  # its text index rebuilt on first use
    with pytest.raises(TypeError, match="before build_encoder"):
        pickle.dumps(tok)
