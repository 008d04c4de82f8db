"""One request never harms another (engine level, no HTTP): a failure while one sequence is
admitted, sampled or stopped ends that sequence alone, with llama-server's `got exception: ...`
500 and its slot freed; a failed forward ends only its batch; the other stream generates exactly
the tokens it generates alone. Extreme sampling input is handled as llama.cpp's samplers handle
it (no exception at all)."""
from __future__ import annotations

import math
import threading

import pytest

from runtime.serving import Engine, EngineConfig
from runtime.tasks import CompletionResult, CompletionTask, SamplingParams, TaskError, TokenOut
from runtime.model.tiny_model import spec_with, write_tiny_model

VICTIM_N = 48


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("isolation") / "iso-tiny.gguf"
    write_tiny_model(path, spec_with(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=4096,
                                     name="iso-tiny", seed=7), vocab="builtin")
    e = Engine(EngineConfig(model_path=str(path), n_ctx=4096, n_parallel=2, verbosity=0, warmup=False))
    e.load()
    e.start()
    yield e
    e.stop()


def _ids(e: Engine, text: str) -> list[int]:
    return e.tokenizer.encode(text, add_special=True, parse_special=True)


def _victim_task(e: Engine) -> CompletionTask:
    return CompletionTask(_ids(e, "the victim speaks"), SamplingParams(temperature=0, ignore_eos=True),
                          n_predict=VICTIM_N, id_slot=0, stream=True)


def _collect(h) -> tuple[list[int], object]:
    toks, final = [], None
    for ev in h.iter_sync(timeout=120):
        if isinstance(ev, TokenOut):
            toks.append(ev.id)
        else:
            final = ev
    return toks, final


@pytest.fixture(scope="module")
def alone(engine) -> list[int]:
    toks, final = _collect(engine.submit(_victim_task(engine)))
    assert isinstance(final, CompletionResult) and len(toks) == VICTIM_N
    return toks


def _beside(engine, offender: CompletionTask):
    """Run the victim in slot 0 and `offender` in slot 1 at once: (victim tokens, victim final,
    offender final)."""
    out: dict[str, object] = {}
    hv = engine.submit(_victim_task(engine))
    t = threading.Thread(target=lambda: out.update(v=_collect(hv)))
    t.start()
    offender.id_slot = 1
    res = engine.submit(offender).result_sync(timeout=120)
    t.join(120)
    toks, final = out["v"]
    return toks, final, res


def _ok_beside(engine, alone, offender):
    toks, final, res = _beside(engine, offender)
    assert isinstance(final, CompletionResult), final
    assert toks == alone  # the victim's tokens are the ones it gets alone
    assert not any(s["is_processing"] for s in engine.slots_info())
    return res


def test_a_grammar_left_without_a_legal_token_fails_only_its_request(engine, alone):
    """The grammar allows only "a", and logit_bias bans every token that spells it: llama-server
    b1-0c1e570 ends that request with `got exception: Unexpected empty grammar stack ...` (500)."""
    banned = [(t, -math.inf) for t in range(engine.tokenizer.n_vocab)
              if engine.tokenizer.piece(t).startswith(b"a")]
    offender = CompletionTask(_ids(engine, "x"), SamplingParams(temperature=1.0, grammar='root ::= "a"',
                                                                logit_bias=banned), n_predict=8)
    res = _ok_beside(engine, alone, offender)
    assert isinstance(res, TaskError) and res.code == 500 and res.type == "server_error"
    assert res.message.startswith("got exception: Unexpected empty grammar stack after accepting piece: ")


@pytest.mark.parametrize("params", [
    dict(temperature=1.0, dry_multiplier=1.0, dry_base=3e38, dry_allowed_length=1),
    dict(temperature=1.0, dry_multiplier=1e30, dry_base=1.75, dry_allowed_length=0, dry_penalty_last_n=100000),
    dict(temperature=1.0, dynatemp_range=1.0, dynatemp_exponent=-1.0, top_k=1),
    dict(temperature=1.0, dynatemp_range=3e38, dynatemp_exponent=3e38),
    dict(temperature=1.0, top_k=5, min_keep=10**6),
    dict(temperature=1.0, top_k=2**31 - 1, top_p=0.5, min_keep=2**31 - 1),
    dict(temperature=1.0, top_n_sigma=1e30),
    dict(temperature=1.0, typical_p=0.0, min_keep=10**6),
    dict(temperature=1.0, xtc_probability=1.0, xtc_threshold=0.0, min_keep=10**6),
    dict(temperature=1.0, mirostat=1, mirostat_tau=3e38, mirostat_eta=3e38),
    dict(temperature=1.0, mirostat=2, mirostat_tau=-3e38),
    dict(temperature=3e38, repeat_penalty=1e-30, frequency_penalty=3e38, presence_penalty=-3e38),
    dict(temperature=1.0, samplers=[]),
])
def test_extreme_sampling_input_is_sampled_like_llama_cpp(engine, alone, params):
    res = _ok_beside(engine, alone, CompletionTask(_ids(engine, "a b a b a b a b"), SamplingParams(**params),
                                                   n_predict=8))
    assert isinstance(res, CompletionResult), res
    assert res.n_decoded >= 1


def test_every_token_banned_is_answered(engine, alone):
    """Mirostat and the plain chain over a row without a finite logit draw a token (llama.cpp's
    dist falls back to its last candidate) instead of raising."""
    ban = [(t, -math.inf) for t in range(engine.tokenizer.n_vocab)]
    for p in (dict(temperature=1.0, mirostat=2), dict(temperature=1.0), dict(temperature=0.0)):
        res = _ok_beside(engine, alone, CompletionTask(_ids(engine, "x"), SamplingParams(logit_bias=ban, **p),
                                                       n_predict=4))
        assert isinstance(res, CompletionResult), (p, res)


def test_dry_breakers_are_tokenized_where_parsed_not_by_the_engine(engine, alone, monkeypatch):
    """200,000 DRY sequence breakers: their single-token ids are found once, where the request is
    parsed (api/params.py, off the engine thread); the engine tokenizes none of them and its DRY
    step matches the history against one sorted array."""
    from api.params import parse_sampling
    breakers = ["\n", ":", "ab", "x" * 50] + [f"w{i}" for i in range(200_000)]
    p = parse_sampling({"dry_multiplier": 0.8, "dry_sequence_breakers": breakers}, SamplingParams(),
                       engine.tokenizer, 4096)
    single = {t[0] for t in (engine.tokenizer.encode(b, add_special=False, parse_special=False)
                             for b in breakers[:4]) if len(t) == 1}
    got = set(p.dry_breaker_ids.tolist())
    assert single <= got and len(got) == len(p.dry_breaker_ids) and list(p.dry_breaker_ids) == sorted(got)
    seen: list[str] = []
    real = engine.tokenizer.encode
    monkeypatch.setattr(engine.tokenizer, "encode", lambda text, *a, **k: (seen.append(text), real(text, *a, **k))[1])
    p.temperature, p.dry_allowed_length = 0.0, 1
    res = _ok_beside(engine, alone, CompletionTask(_ids(engine, "a b a b a b a b"), p, n_predict=8))
    assert isinstance(res, CompletionResult) and res.n_decoded == 8
    assert not set(seen) & set(breakers), "the engine tokenized the breakers again"


def test_a_failed_forward_ends_only_its_batch_and_the_engine_serves_on(engine, alone):
    """Fault injection at the model runner: the forward of one step raises. The sequences of that
    batch end with a 500, their cache is dropped, and the next requests run normally."""
    real = engine.runner.run
    armed = {"n": 1}

    def failing(plan, *a, **kw):
        if armed["n"] and any(s.id == 1 for s in plan.slots):
            armed["n"] -= 1
            raise RuntimeError("injected fault in the forward")
        return real(plan, *a, **kw)
    engine.runner.run = failing
    try:
        res = engine.submit(CompletionTask(_ids(engine, "fails once"), SamplingParams(temperature=0),
                                           n_predict=4, id_slot=1)).result_sync(timeout=120)
    finally:
        engine.runner.run = real
    assert isinstance(res, TaskError) and res.code == 500
    assert res.message == "got exception: injected fault in the forward"
    toks, final = _collect(engine.submit(_victim_task(engine)))
    assert isinstance(final, CompletionResult) and toks == alone


def test_a_failure_while_starting_a_task_fails_that_task_alone(engine, alone, monkeypatch):
    """Fault injection at admission (the sampler set-up raises for one task): that task gets its
    500, the victim streaming beside it is untouched."""
    real = engine.vocab.start_sampler

    def failing(req, *a, **kw):
        if req.task.id_slot == 1:
            raise ZeroDivisionError("float division by zero")
        return real(req, *a, **kw)
    monkeypatch.setattr(engine.vocab, "start_sampler", failing)
    res = _ok_beside(engine, alone, CompletionTask(_ids(engine, "y"), SamplingParams(temperature=0), n_predict=4))
    assert isinstance(res, TaskError) and res.code == 500
    assert res.message == "got exception: division by zero"  # no Python wording


def test_client_messages_carry_no_python_names():
    from runtime.serving.failures import client_message
    msgs = [client_message(e) for e in (
        TypeError("runtime.chat.template.ChatTemplate.render() got multiple values for keyword argument 'x'"),
        OSError(34, "Numerical result out of range"), RecursionError("maximum recursion depth exceeded"),
        ValueError("<class 'numpy.ndarray'> cannot be used"))]
    assert msgs[0] == "got exception: render got multiple values for keyword argument 'x'"
    assert msgs[1] == "got exception: Numerical result out of range"
    assert msgs[2] == "got exception: the request nests too deeply"
    for m in msgs:
        assert "runtime." not in m and "<class" not in m and "()" not in m
