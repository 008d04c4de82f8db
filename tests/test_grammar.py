"""GBNF parsing, compiled token masks (small vocabularies) and the grammar compiler cache."""
from __future__ import annotations

import random

import pytest
import torch

from grammar import GrammarCompiler, GrammarError, Vocab, compile_grammar, parse_gbnf
from tests.test_grammar_helpers import GRAMMARS, random_walk, recognizes, small_vocab

VOCAB, PIECES, EOS = small_vocab()


def shared_grammars():
    if not GRAMMARS.exists():
        return []
    return sorted(GRAMMARS.glob("*.gbnf"))


def test_shared_grammars_exist_or_skip():
    if not GRAMMARS.exists():
        pytest.skip("shared grammars not available")
    assert len(shared_grammars()) >= 8


@pytest.mark.parametrize("path", shared_grammars(), ids=lambda p: p.name)
def test_shared_grammar_parses(path):
    g = parse_gbnf(path.read_text())
    assert g.rule_names[g.root] == "root"
    # every referenced rule is defined (has at least one alternative)
    for alts in g.rule_alts:
        assert alts


@pytest.mark.parametrize("text, rule, where", [
    ('root ::= foo', "root", "line 1, column 10"),
    ('root ::= "a"\nitem ::= "b" | [a-', "item", "line 2"),
    ('root ::= "abc', "root", "line 1"),
    ('root ::= item\nitem ::= ("a" "b"', "item", "line 2"),
    ('root ::= "\\q"', "root", "column 11"),
    ('root ::= "a"\nbad rule', "bad", "line 2"),
    ('root ::= "a"{3,1}', "root", "line 1"),
    ('root ::= "\\x4"', "root", "line 1"),
])
def test_bad_grammar_errors_name_rule_and_position(text, rule, where):
    with pytest.raises(GrammarError) as ei:
        parse_gbnf(text)
    msg = str(ei.value)
    assert f"'{rule}'" in msg and where in msg, msg


def test_newline_ends_a_rule_outside_groups():
    with pytest.raises(GrammarError, match="line 2"):
        parse_gbnf('root ::= "a"\n  "c"')


def test_missing_root_and_left_recursion():
    with pytest.raises(GrammarError, match="root"):
        parse_gbnf('item ::= "a"')
    with pytest.raises(GrammarError, match="left recursion in rule 'expr'"):
        parse_gbnf('root ::= expr\nexpr ::= expr "+" "1" | "1"')
    with pytest.raises(GrammarError, match="left recursion"):
        parse_gbnf('root ::= ("a"?)*')


@pytest.mark.parametrize("grammar, good, bad", [
    ('root ::= "a" "b"{2} "c"{1,} "d"{0,2}', ["abbc", "abbcccdd"], ["abc", "abbcddd", "abb"]),
    ('root ::= [^a-c] . [\\x41-\\x43] "\\u00e9" "\\U0001F600"', ["dzAé😀", "x\nCé😀"], ["azAé😀", "dzDé😀"]),
    ('root ::= ("x" | "y" "z")+ # comment\n', ["x", "yzx", "xxyz"], ["", "y", "xz"]),
    ('root ::= "\\"\\\\\\t\\n\\r" [\\]\\[]', ['"\\\t\n\r]', '"\\\t\n\r['], ['"\\\t\n\r}']),
    ('root ::= (\n  "a" |\n  "b"\n  "c"?\n) # newlines continue only inside groups', ["a", "bc", "b"], ["c", "ac"]),
    ('root ::= [ぁ-ゟ]+ "。"', ["ひらがな。"], ["カ。", "。"]),
    ('root ::= "" "a"', ["a"], [""]),
])
def test_language_features(grammar, good, bad):
    g = parse_gbnf(grammar)
    cg = compile_grammar(grammar, VOCAB)
    for s in good:
        assert recognizes(g, s), s
        assert cg.accepts_bytes(s.encode()), s
    for s in bad:
        assert not recognizes(g, s), s
        assert not cg.accepts_bytes(s.encode()), s


def test_yes_no_grammar_masks_and_eog():
    cg = compile_grammar('root ::= ("yes" | "no") "\\n"', VOCAB)
    m = cg.matcher()
    mask = m.allowed_mask()
    assert mask.dtype == torch.bool and mask.shape == (VOCAB.n_vocab,)
    allowed = {PIECES[i] for i in mask.nonzero().flatten().tolist()}
    assert allowed == {b"y", b"n", b"yes", b"no", b"ye", b"yes\n"}
    assert not m.is_complete() and not mask[EOS]
    m.advance(PIECES.index(b"ye"))
    assert {PIECES[i] for i in m.allowed_mask().nonzero().flatten().tolist()} == {b"s"}
    m.advance(PIECES.index(b"s"))
    m.advance(PIECES.index(b"\n"))
    # complete and nothing can follow: only EOG
    assert m.is_complete() and m.only_eog_allowed()
    assert m.allowed_mask().nonzero().flatten().tolist() == [EOS]
    with pytest.raises(GrammarError):
        m.advance(PIECES.index(b"y"))
    m.advance(EOS)
    assert m.finished and not m.allowed_mask().any()


def test_eog_allowed_alongside_when_more_may_follow():
    cg = compile_grammar("root ::= [a-z]+", VOCAB)
    m = cg.matcher()
    assert not m.allowed_mask()[EOS]
    with pytest.raises(GrammarError):
        m.advance(EOS)
    m.advance(PIECES.index(b"abc"))
    mask = m.allowed_mask()
    assert mask[EOS] and mask[ord("q")] and not mask[ord("A")]
    assert m.is_complete() and not m.only_eog_allowed()


def test_empty_piece_and_bad_tokens_rejected():
    cg = compile_grammar("root ::= .*", VOCAB)
    m = cg.matcher()
    empty = PIECES.index(b"")
    assert not m.allowed_mask()[empty]
    with pytest.raises(GrammarError):
        m.advance(empty)
    with pytest.raises(GrammarError):
        m.advance(10 ** 9)


def test_utf8_split_tokens_are_byte_exact():
    # two characters exactly; tokens may split them at any byte
    cg = compile_grammar('root ::= [^a-z]{2}', VOCAB)
    hangul = "쎅".encode()
    m = cg.matcher()
    mask = m.allowed_mask()
    assert mask[hangul[0]] and not mask[hangul[1]]  # a lead byte may start; a continuation may not
    assert not mask[0xC0] and not mask[0xFF]  # never valid UTF-8
    m.advance(PIECES.index(hangul[:1]))
    assert not m.is_complete()
    mask = m.allowed_mask()
    assert mask[PIECES.index(hangul[1:])] and not mask[ord("x")] and not mask[PIECES.index(hangul)]
    m.advance(PIECES.index(hangul[1:]))
    m.advance(PIECES.index("😀".encode()[:2]))
    mask = m.allowed_mask()
    assert not mask[EOS]
    m.advance(PIECES.index("😀".encode()[2:]))
    assert m.only_eog_allowed()


def test_class_excluding_a_character_rejects_its_prefix_only_when_fully_excluded():
    # only U+C385 is excluded; its lead byte still starts other characters
    cg = compile_grammar('root ::= [^\\uC385]', VOCAB)
    m = cg.matcher()
    b = "쎅".encode()
    assert m.allowed_mask()[PIECES.index(b[:2])]
    m.advance(PIECES.index(b[:2]))
    assert not m.allowed_mask()[b[2]]  # would complete the excluded character
    assert m.allowed_mask()[b[2] + 1]


@pytest.mark.parametrize("path", shared_grammars(), ids=lambda p: p.name)
def test_random_walks_on_shared_grammars(path):
    text = path.read_text()
    g = parse_gbnf(text)
    cg = compile_grammar(text, VOCAB)
    rng = random.Random(path.name)
    structural = frozenset(i for i, p in enumerate(PIECES) if p in (b"\n", b'"', b"}", b"]", b";", b" ", b")"))
    finished = 0
    for _ in range(12):
        out, done = random_walk(cg, PIECES, rng, max_steps=120, bias_structural=0.4, structural=structural)
        text_out = out.decode("utf-8") if done else None
        if done:
            finished += 1
            assert recognizes(g, text_out), (path.name, text_out)
        else:  # still a viable prefix: must decode up to a partial trailing character
            out.decode("utf-8", errors="ignore")
    assert finished >= 1


def test_compiler_cache_is_lru_by_text():
    comp = GrammarCompiler(VOCAB, cache_size=2)
    a = comp.compile('root ::= "a"')
    assert comp.compile('root ::= "a"') is a
    comp.compile('root ::= "b"')
    comp.compile('root ::= "a"')  # refresh a
    comp.compile('root ::= "c"')  # evicts b
    assert comp.compile('root ::= "a"') is a
    b2 = comp.compile('root ::= "b"')
    assert b2.text == 'root ::= "b"'
    with pytest.raises(GrammarError):
        comp.compile("root ::= undefined-rule")
    empty = comp.compile("root ::= ")  # an empty root: only EOG
    assert empty.matcher().allowed_mask().nonzero().flatten().tolist() == [EOS]


def test_fill_mask_and_matcher_copy():
    cg = compile_grammar('root ::= "ab" | "ac"', VOCAB)
    m = cg.matcher()
    m.advance(ord("a"))
    m2 = m.copy()
    m2.advance(ord("b"))
    out = torch.ones(2, VOCAB.n_vocab, dtype=torch.bool)
    m.fill_mask(out[0])
    m2.fill_mask(out[1])
    assert out[0].nonzero().flatten().tolist() == [ord("b"), ord("c")]
    assert out[1].nonzero().flatten().tolist() == [EOS]


def test_vocab_multiple_eog_ids():
    pieces = [b"a", b"b", b"<eot>", b"<eos>"]
    v = Vocab(pieces, {2, 3})
    cg = compile_grammar('root ::= "a"', v)
    m = cg.matcher()
    assert m.allowed_mask().tolist() == [True, False, False, False]
    m.advance(0)
    assert m.allowed_mask().tolist() == [False, False, True, True]
