"""Shared helpers for the grammar tests (no tests here): small vocabularies, an independent
recognizer, random walks."""
from __future__ import annotations

import random
import sys
from functools import lru_cache
from pathlib import Path

from grammar import Grammar, Vocab

SHARED = Path(__file__).resolve().parents[2] / "shared"
GRAMMARS = SHARED / "grammars"
QWEN2 = SHARED / "vocab" / "ggml-vocab-qwen2.gguf"


def small_pieces() -> list[bytes]:
    """All 256 single bytes, some words, JSON-ish pieces and split multi-byte characters."""
    pieces = [bytes([i]) for i in range(256)]
    words = ["yes", "no", "ye", "es", "\n", "yes\n", "true", "false", "null", '{"', '":', '",', '"}', "}", "{",
             "[", "]", ", ", ": ", "  ", "\n\n", "\t\t", "12", "345", "-1", ".5", "e+", "abc", "file", "lines",
             '"file"', '"lines"', "int ", "float ", "char ", "return", "while", "(", ")", "()", "{}", "=", " = ",
             ";", "//", "/*", "*/", "1. ", "O-O", "e4", "Nf3", "- ", "ひらがな", "カタカナ", "。", "日本", "한국",
             "쎅", "é", "\\n", "\\u00e9", '\\"', "2024-01-31", "T12:00:00Z", "abcdef12"]
    for w in words:
        pieces.append(w.encode())
    for ch in ["쎅", "語", "😀", "é"]:  # pieces that split a UTF-8 character
        b = ch.encode()
        for k in range(1, len(b)):
            pieces.append(b[:k])
            pieces.append(b[k:])
    pieces.append(b"")  # a token with no text: never allowed
    return pieces


def small_vocab() -> tuple[Vocab, list[bytes], int]:
    pieces = small_pieces()
    eos = len(pieces)
    pieces.append(b"<|endoftext|>")
    return Vocab(pieces, {eos}), pieces, eos


def qwen2_vocab():
    """(Vocab, pieces, eog ids) of the qwen2 tokenizer, or None when unavailable."""
    if not QWEN2.exists():
        return None
    from runtime.tokenizer import load_tokenizer
    tok = load_tokenizer(str(QWEN2))
    pieces = tok.token_pieces()
    eog = set(tok.eot_ids) | {tok.eos_id}
    return Vocab(pieces, eog), pieces, eog


def recognizes(g: Grammar, text: str) -> bool:
    """Independent recognizer (memoised span sets over the lowered rules, no token masks)."""
    # the limit is process-wide: raise it only while recognizing, so the limits the code under test relies on
    # (RecursionError at the default depth is how deep nesting becomes a 400 / GrammarError) hold in later tests
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20000))
    try:
        return _recognizes(g, text)
    finally:
        sys.setrecursionlimit(old)


def _recognizes(g: Grammar, text: str) -> bool:
    n = len(text)

    @lru_cache(maxsize=None)
    def rule_ends(rule: int, i: int) -> frozenset[int]:
        out: set[int] = set()
        for alt in g.rule_alts[rule]:
            out |= seq_ends(rule, id(alt), i)
        return frozenset(out)

    alts_by_id = {id(alt): alt for alts in g.rule_alts for alt in alts}

    @lru_cache(maxsize=None)
    def seq_ends(rule: int, alt_id: int, i: int, k: int = 0) -> frozenset[int]:
        alt = alts_by_id[alt_id]
        if k == len(alt):
            return frozenset((i,))
        kind, arg = alt[k][:2]
        out: set[int] = set()
        if kind == "char":
            if i < n and g.classes[arg].matches(ord(text[i])):
                out |= seq_ends(rule, alt_id, i + 1, k + 1)
        elif kind == "rep":  # a counter: arg repeated lo..hi times (hi -1: unbounded)
            lo, hi = alt[k][2], alt[k][3]
            frontier, count = {i}, 0
            while frontier and (hi < 0 or count <= hi):
                if count >= lo:
                    for j in frontier:
                        out |= seq_ends(rule, alt_id, j, k + 1)
                if count == hi or count > n + lo:
                    break
                frontier = {e for j in frontier for e in rule_ends(arg, j)}
                count += 1
        else:
            for j in rule_ends(arg, i):
                out |= seq_ends(rule, alt_id, j, k + 1)
        return frozenset(out)

    return n in rule_ends(g.root, 0)


def random_walk(compiled, pieces: list[bytes], rng: random.Random, max_steps: int = 300,
                bias_structural: float = 0.0, structural: frozenset[int] = frozenset()):
    """Sample allowed tokens until an EOG token is taken. Returns (bytes, finished)."""
    m = compiled.matcher()
    out = bytearray()
    eog = compiled.vocab.eog_ids
    for _ in range(max_steps):
        mask = m.allowed_mask()
        ids = mask.nonzero().flatten().tolist()
        assert ids, f"dead end after {bytes(out)!r}"
        if bias_structural and rng.random() < bias_structural:
            pref = [t for t in ids if t in structural or t in eog]
            if pref:
                ids = pref
        t = rng.choice(ids)
        m.advance(t)
        if t in eog:
            assert m.finished
            return bytes(out), True
        out += pieces[t]
    return bytes(out), False
