"""runtime.tokenizer.builtin_vocab: the built-in tiny model's byte-level BPE vocabulary."""
from __future__ import annotations

from runtime.tokenizer.builtin_vocab import BUILTIN_SPECIAL_TOKENS, QWEN2_CHAT_TEMPLATE, builtin_vocab
from runtime.tokenizer import VOCAB_TYPE_BPE, tokenizer_from_gguf_metadata


def test_builtin_vocab():
    keys = builtin_vocab()
    again = builtin_vocab()
    assert keys == again  # deterministic
    kv = {k: v for k, v, _, _ in keys}
    tokens, types, merges = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"], kv["tokenizer.ggml.merges"]
    assert 2000 <= len(tokens) <= 4100 and len(tokens) == len(types) == len(set(tokens))
    assert kv["tokenizer.ggml.model"] == "gpt2" and kv["tokenizer.ggml.pre"] == "qwen2"
    assert tokens[-3:] == BUILTIN_SPECIAL_TOKENS and types[-3:] == [3, 3, 3]
    assert set(types[:-3]) == {1}
    eot, im_end = tokens.index("<|endoftext|>"), tokens.index("<|im_end|>")
    assert kv["tokenizer.ggml.bos_token_id"] == eot
    assert kv["tokenizer.ggml.eos_token_id"] == im_end == kv["tokenizer.ggml.eot_token_id"]
    assert kv["tokenizer.ggml.add_bos_token"] is False
    assert kv["tokenizer.chat_template"] == QWEN2_CHAT_TEMPLATE
    # every byte has a token, every merge joins two tokens into a third
    from tokenizers import pre_tokenizers

    assert set(pre_tokenizers.ByteLevel.alphabet()) <= set(tokens)
    vocab = set(tokens)
    for m in merges:
        a, b = m.split(" ")
        assert a in vocab and b in vocab and a + b in vocab
    assert "Ġthe" in vocab and "Ġfunction" in vocab


def test_builtin_vocab_tokenizes_compactly():
    """Encode with an HF tokenizer built from the GGUF keys: common words are single tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    from runtime.tokenizer.builtin_vocab import _QWEN2_PRE_REGEX

    kv = {k: v for k, v, _, _ in builtin_vocab()}
    tokens = kv["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ")) for m in kv["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_PRE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    text = "Hello, World! The model answers the question."
    enc = tok.encode(text)
    ids = enc.ids
    assert len(ids) <= 14  # vs 46 bytes
    assert {"Hello", "ĠWorld", "Ġmodel", "Ġthe"} <= set(enc.tokens)
    assert tok.decode(ids) == text
    odd = "naïve café — 東京 🙂"
    assert tok.decode(tok.encode(odd).ids) == odd  # byte fallback covers everything


def test_builtin_tiny_vocab_loads():
    md = {k: v for k, v, *_ in builtin_vocab()}
    tok = tokenizer_from_gguf_metadata(md)
    assert tok.vocab_type == VOCAB_TYPE_BPE and tok.n_vocab == len(md["tokenizer.ggml.tokens"])
    im_start = md["tokenizer.ggml.tokens"].index("<|im_start|>")
    im_end = md["tokenizer.ggml.tokens"].index("<|im_end|>")
    text = "<|im_start|>user\nHello, world! public static void main<|im_end|>\n"
    ids = tok.encode(text, parse_special=True)
    assert ids[0] == im_start and im_end in ids
    assert tok.decode(ids) == text
    assert im_start not in tok.encode(text, parse_special=False)
    assert im_end in tok.eot_ids and tok.eos_id == im_end
    assert tok.chat_template is not None
