"""Stop rules and generated text (runtime/serving/stopping.py)."""
from __future__ import annotations

import time

from runtime.serving.stopping import StopType, TextState, check_stop, effective_n_predict


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


def _check(text=None, stop_word=None, is_eog=False, **kw):
    args = dict(n_cached=10, n_ctx=100, n_decoded=3, n_predict=-1, n_indent=0, t_max_ms=-1,
                t_prompt_done=time.perf_counter())
    args.update(kw)
    return check_stop(text or TextState([]), stop_word, is_eog, **args)


def test_check_stop_rules_and_their_order():
    assert _check() == (None, False)
    assert _check(stop_word="END") == (StopType.WORD, False)
    # the context end: the sampled token would not fit; it overrides a stop word and truncates
    assert _check(n_cached=99) == (StopType.LIMIT, True)
    assert _check(stop_word="END", n_cached=99) == (StopType.LIMIT, True)
    assert _check(n_cached=98) == (None, False)
    assert _check(n_decoded=5, n_predict=5) == (StopType.LIMIT, False)
    assert _check(n_decoded=4, n_predict=5) == (None, False)
    assert _check(n_decoded=0, n_predict=0) == (StopType.LIMIT, False)
    # end of generation wins over everything, the truncation flag stays
    assert _check(is_eog=True, stop_word="END", n_cached=99) == (StopType.EOS, True)
    assert _check(is_eog=True) == (StopType.EOS, False)


def test_check_stop_indent_and_time_limit():
    t = TextState([])
    for piece in ("def f():\n", "    x = 1\n", "y"):
        t.push(piece.encode())
        stop, _ = _check(t, n_indent=4)
    assert stop is StopType.LIMIT and t.text == "def f():\n    x = 1\n"
    # the time limit applies once a new line was generated
    old = time.perf_counter() - 1.0
    u = TextState([])
    u.push(b"no newline yet")
    assert _check(u, t_max_ms=1, t_prompt_done=old) == (None, False)
    u.push(b"\n")
    assert _check(u, t_max_ms=1, t_prompt_done=old) == (StopType.LIMIT, False)
    assert _check(u, t_max_ms=0, t_prompt_done=old) == (None, False)
    assert _check(u, t_max_ms=60_000, t_prompt_done=old) == (None, False)


def test_effective_n_predict_server_value_is_only_a_default():
    assert effective_n_predict(-1, -1) == -1
    assert effective_n_predict(7, -1) == 7
    assert effective_n_predict(-1, 16) == 16
    assert effective_n_predict(32, 16) == 32  # b1-0c1e570 does not cap a request by -n
    assert effective_n_predict(8, 16) == 8
    assert effective_n_predict(0, 16) == 0
    assert [t.value for t in StopType] == ["none", "eos", "limit", "word"]  # llama-server's stop_type strings
