"""runtime.tokenizer.from_hf: tokenizers built from Hugging Face folders against the `tokenizers`
library's own encodings."""
from __future__ import annotations

import json
from pathlib import Path

from runtime.tokenizer import VOCAB_TYPE_BPE, VOCAB_TYPE_SPM, load_tokenizer

def _make_hf_folder(tmp_path: Path) -> Path:
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|begin|>", "<|end|>", "<|im_start|>"])
    corpus = ["hello world, this is a small corpus for a test tokenizer"] * 5 + ["héllo wörld 123"]
    hf.train_from_iterator(corpus, trainer=trainer)
    hf.add_tokens(["<tool>"])  # user-defined (not special)
    folder = tmp_path / "hf"
    folder.mkdir()
    hf.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|begin|>", "eos_token": {"content": "<|end|>"}, "add_bos_token": True,
        "chat_template": "{{ messages[0]['content'] }}",
    }))
    return folder


def test_hf_folder(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer
    folder = _make_hf_folder(tmp_path)
    ref = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    tok = load_tokenizer(folder)
    assert tok.vocab_type == VOCAB_TYPE_BPE
    assert tok.n_vocab == ref.get_vocab_size(with_added_tokens=True)
    for text in ["hello world", "héllo wörld 123", "  spaces\n\nnewlines\t!", "ünïcödé 🦙"]:
        assert tok.encode(text) == ref.encode(text, add_special_tokens=False).ids
        assert tok.decode(tok.encode(text)) == text
    begin, end, im_start = (ref.token_to_id(t) for t in ("<|begin|>", "<|end|>", "<|im_start|>"))
    assert tok.bos_id == begin and tok.eos_id == end and tok.add_bos
    assert tok.encode("hello", add_special=True)[0] == begin
    assert tok.encode("<|im_start|>hello", parse_special=True)[0] == im_start
    assert im_start not in tok.encode("<|im_start|>hello", parse_special=False)
    tool = ref.token_to_id("<tool>")
    assert tool in tok.encode("a <tool> b", parse_special=False)  # user-defined: always split
    assert end in tok.eot_ids  # eos
    assert tok.token_type(im_start) == 3 and tok.token_type(tool) == 4
    assert tok.chat_template == "{{ messages[0]['content'] }}"
    assert tok.piece(im_start) == b"<|im_start|>"
    assert load_tokenizer(folder / "tokenizer.json").n_vocab == tok.n_vocab


def test_hf_folder_metaspace_spm(tmp_path):
    """An SPM-style tokenizer.json (Metaspace, byte fallback): ids as HF gives them, decode drops
    the prefix space as llama.cpp does for SPM."""
    from tokenizers import Tokenizer as HFTokenizer, models, pre_tokenizers
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t in ["\u2581", "h", "i", "\u2581h", "\u2581hi", "hi"]:
        vocab[t] = len(vocab)
    merges = [("\u2581", "h"), ("h", "i"), ("\u2581h", "i")]
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    hf.add_special_tokens(["<s>", "</s>"])
    folder = tmp_path / "spm"
    folder.mkdir()
    hf.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}))
    tok = load_tokenizer(folder)
    assert tok.vocab_type == VOCAB_TYPE_SPM and tok.add_space_prefix
    for text in ["hi", "hi hi", "hé"]:
        ids = tok.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids) == text
    assert tok.encode("hi", add_special=True) == [1, vocab["\u2581hi"]]
    assert tok.piece(vocab["<0x41>"]) == b"A"
