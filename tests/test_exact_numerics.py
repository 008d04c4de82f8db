"""tritium's CPU forward computes llama.cpp's float32 arithmetic bit for bit (kernels/README.md,
"Numerics"): the logits of the two real Q4_K_M models equal those of the reference build's libllama
(b1-0c1e570) on the same tokens and prompt batches, recorded by scripts/record_exact_logits.py into
tests/data/exact_logits.json (sha256 of every step's float32 logits); and the vector kernels that
do it give the same bits as their portable reference (kernels/cpu/qdot_exact.c) on every build.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from kernels.cpu import native, qdot
from runtime.model.model_files import GEMMA, QWEN, SMOLLM2
from runtime.serving.plan import prompt_breaks
from tests.kernel_oracles import random_qweight
from tests.llama_tokens import real_model_path, recorded_tokens

def _recorded() -> dict:
    """This machine's float order's recording (tests/llama_tokens.py `reference_file`: tests/data/ for
    llama.cpp's AVX-512 build, tests/data/avx2/ for its AVX2 + FMA build)."""
    return recorded_tokens("exact_logits.json")


def _same_isa_as_the_recording() -> None:
    """The recorded bits are those of a llama.cpp built for this CPU's float order (its kernels' order
    differs between its AVX2 and AVX-512 builds, and tritium follows the build it runs:
    kernels/cpu/fattn.c); the AVX-512 recording needs AVX-512 VNNI, the AVX2 one AVX2 + FMA + F16C."""
    flags = native.cpu_flags()
    need = set(_recorded()["cpu_flags"]) & {"avx512f", "avx512vl", "avx512_vnni", "avx2", "fma", "f16c"}
    if not need <= flags:
        pytest.skip(f"the recording was made on a CPU with {sorted(need)}; this CPU takes another float order")


@pytest.mark.parametrize("real", [QWEN, GEMMA, SMOLLM2], ids=lambda m: m.key)
def test_logits_are_llama_cpps_bit_for_bit(real):
    """Q4_K_M (Q5_0, Q8_0, Q4_K, Q6_K) on Qwen and Gemma; Q4_1 and Q8_0 on SmolLM2-135M-Instruct, the
    default model (recorded with llama.cpp's AVX2 build only: the AVX-512 recording is missing)."""
    from runtime.model.kv_store import SeqKV
    from runtime.serving.blocks import BlockManager
    from runtime.model.loader import load_model
    from runtime.model.decoder import Model, SeqBatch

    _same_isa_as_the_recording()
    if real.key not in _recorded()["models"]:
        pytest.skip(f"no recording of {real.key} for this float order (recorded on AVX2 only)")
    cases = _recorded()["models"][real.key]
    m = Model(load_model(real_model_path(real)), "cpu")
    for case in cases:
        toks = case["tokens"]
        kv = BlockManager(m.new_kv_store(len(toks) + 64))
        s = SeqKV()
        kv.reserve(s, len(toks))
        at, logits = 0, None
        with torch.inference_mode():
            for n in case["batches"]:
                logits, _ = m.forward(kv.store, [SeqBatch(s, toks[at:at + n], at)])
                at += n
            s.n_tokens = len(toks)
            for k, step in enumerate(case["steps"]):
                lg = logits[-1].float().numpy()
                top = [[int(i), float(lg[i])] for i in np.argsort(-lg, kind="stable")[:5]]
                assert hashlib.sha256(lg.astype(np.float32).tobytes()).hexdigest() == step["sha256"], (
                    f"{real.key} {case['prompt']!r} step {k}: logits differ from llama.cpp's; top-5 {top} "
                    f"against {step['top']}")
                if k + 1 == len(case["steps"]):
                    break
                kv.reserve(s, s.n_tokens + 1)
                logits, _ = m.forward(kv.store, [SeqBatch(s, [step["argmax"]], s.n_tokens)])
                s.n_tokens += 1


def test_the_recorded_batches_are_the_servers():
    """The batches of the recording are what the scheduler plans (llama-server's checkpoint ends
    on the sliding-window model, one batch otherwise)."""
    rec = _recorded()["models"]
    for case in rec[GEMMA.key]:
        n = len(case["tokens"])
        ends = [e for e in prompt_breaks(n, 2048, 512)] + [n]
        assert case["batches"] == [b - a for a, b in zip([0] + ends[:-1], ends)]
    assert all(case["batches"] == [len(case["tokens"])] for key in (QWEN.key, SMOLLM2.key) if key in rec
               for case in rec[key])


def test_prompt_breaks_follow_llama_server():
    assert prompt_breaks(6, 2048, 512) == (2,)
    assert prompt_breaks(4, 2048, 512) == ()  # nothing before the last 4
    assert prompt_breaks(5, 2048, 512) == (1,)
    assert prompt_breaks(600, 2048, 512) == (84, 596)  # 4 + n_ubatch and 4 tokens before the end
    assert prompt_breaks(600, 256, 512) == (344, 596)  # n_last = min(n_batch, 4 + n_ubatch)


# ---- the vector kernels against their portable reference ------------------------------------

ISAS = ["avx512vnni", "avxvnni", "vnni-emu", "avx2", "scalar"]


@pytest.mark.parametrize("qtype", [Q.Q5_0, Q.Q8_0, Q.Q4_1, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K])
@pytest.mark.parametrize("isa", ISAS)
def test_exact_kernels_match_their_reference(isa, qtype, monkeypatch):
    """Every row count that changes llama.cpp's order (Q4_K: gemm for the first M - M % 4 rows,
    gemv after; Q6_K: the tiled path from 8 rows; the fused and the scratch drivers above 8),
    every thread count: the vector kernels' bits equal the portable C's."""
    if isa not in qdot.supported_isas():
        pytest.skip(f"this CPU cannot run {isa}")
    monkeypatch.setenv("TRITIUM_CPU_ISA", isa)
    if qdot.lib() is None:
        pytest.skip("no C compiler")
    gen = torch.Generator().manual_seed(int(qtype))
    w = random_qweight(qtype, 40, 512, gen)
    h = qdot.prepare(w.data, int(w.qtype), w.rows, w.cols)
    for M in (1, 3, 4, 5, 7, 8, 9, 12, 13):
        x = torch.randn(M, 512, generator=gen) * 3
        x[:, ::37] *= 9
        want = qdot.matmul(x, h, n_threads=1, exact=2)
        for nt in (1, 2):
            got = qdot.matmul(x, h, n_threads=nt, exact=1)
            assert torch.equal(got, want), f"{isa} {qtype.name} M={M} threads={nt}"
        # and these are not the other kernels' bits (the exact order is really taken)
        assert not torch.equal(qdot.matmul(x, h, exact=0), want) or M == 1 and qtype == Q.Q4_K


def test_exact_is_the_default_and_fast_numerics_opt_out(monkeypatch):
    """llama.cpp's order is the default; TRITIUM_FAST_NUMERICS, read once into the engine's config,
    gives a backend in the kernels' own order, whose prepared weights keep it (no read per call)."""
    import kernels
    from runtime.serving import EngineConfig
    from runtime.serving.bootstrap import resolve_config

    if qdot.lib() is None:
        pytest.skip("no C compiler")
    gen = torch.Generator().manual_seed(3)
    w = random_qweight(Q.Q5_0, 16, 256, gen)
    h = qdot.prepare(w.data, int(w.qtype), w.rows, w.cols)
    x = torch.randn(2, 256, generator=gen)
    assert torch.equal(qdot.matmul(x, h), qdot.matmul(x, h, exact=1))
    monkeypatch.delenv("TRITIUM_FAST_NUMERICS", raising=False)
    cfg = EngineConfig()
    resolve_config(cfg)
    ggml = kernels.Backend.for_device("cpu", numerics=cfg.numerics)
    monkeypatch.setenv("TRITIUM_FAST_NUMERICS", "1")
    cfg = EngineConfig()
    resolve_config(cfg)
    own = kernels.Backend.for_device("cpu", numerics=cfg.numerics)
    wo, wg = own.prepare_weight(w), ggml.prepare_weight(w)
    monkeypatch.delenv("TRITIUM_FAST_NUMERICS")  # the backend's weights no longer look at it
    assert torch.equal(own.qmatmul(x, wo), qdot.matmul(x, h, exact=0))
    assert torch.equal(ggml.qmatmul(x, wg), qdot.matmul(x, h, exact=1))
    assert not torch.equal(qdot.matmul(x, h, exact=0), qdot.matmul(x, h, exact=1))


def test_checkpoint_resume_follows_llama_server():
    """(runtime/serving/plan.py) llama-server b1-0c1e570, gemma 3 270M, measured: a repeated 6-token
    prompt resumes at 1 and evaluates 5 (its checkpoint before the last 4 tokens); a 14-token one at
    9; with no checkpoint the prompt is recomputed; past the window nothing changes here."""
    from runtime.serving.plan import checkpoint_resume

    assert checkpoint_resume(6, 6, [2], 512) == (1, [2])
    assert checkpoint_resume(14, 14, [10], 512) == (9, [10])
    # a longer prompt extending a cached one: its last checkpoint, later ones dropped
    assert checkpoint_resume(20, 30, [10, 16], 512) == (15, [10, 16])
    assert checkpoint_resume(12, 30, [10, 16], 512) == (9, [10])
    assert checkpoint_resume(5, 9, [], 512) == (0, [])
    assert checkpoint_resume(0, 9, [4], 512) == (0, [4])
    assert checkpoint_resume(600, 700, [300], 512) == (600, [300])


def test_ctx_checkpoints_flag():
    from api.cli import build_parser, engine_config, server_config

    def cfg(*argv):
        args = build_parser().parse_args(list(argv))
        return engine_config(args, server_config(args))

    assert cfg().ctx_checkpoints == 32  # llama-server's default
    assert cfg("--ctx-checkpoints", "0").ctx_checkpoints == 0
    assert cfg("--swa-checkpoints", "4").ctx_checkpoints == 4 and cfg("-ctxcp", "2").ctx_checkpoints == 2


def test_numerics_flag_reaches_the_kernel_backend(monkeypatch):
    """--numerics own|ggml -> EngineConfig -> resolve_config -> the model's backend; without it
    TRITIUM_FAST_NUMERICS decides, and the flag wins over it."""
    import kernels
    from api.cli import build_parser, engine_config, server_config
    from runtime.serving.bootstrap import resolve_config

    def numerics(*argv):
        args = build_parser().parse_args(list(argv))
        cfg = engine_config(args, server_config(args))
        resolve_config(cfg)
        return cfg.numerics

    monkeypatch.delenv("TRITIUM_FAST_NUMERICS", raising=False)
    assert numerics() is kernels.Numerics.GGML
    assert numerics("--numerics", "own") is kernels.Numerics.OWN
    monkeypatch.setenv("TRITIUM_FAST_NUMERICS", "1")
    assert numerics() is kernels.Numerics.OWN
    assert numerics("--numerics", "ggml") is kernels.Numerics.GGML
    assert kernels.Backend.for_device("cpu", "cpu", kernels.Numerics.OWN).numerics is kernels.Numerics.OWN


def test_user_message_starts_are_where_the_user_turns_begin():
    """api/chat_task.user_starts: the positions llama-server's user delimiter finds (the ChatML
    fallback of the template-less Gemma file: "<|im_start|>user")."""
    from types import SimpleNamespace

    from api.chat_task import user_starts
    from runtime.tokenizer import load_tokenizer

    tk = load_tokenizer(real_model_path(GEMMA))
    turns = [("user", "Tell me about Rome."), ("assistant", "Rome is old."), ("user", "And then?")]
    render = lambda ts: "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in ts)  # noqa: E731
    prompt = render(turns) + "<|im_start|>assistant\n"
    toks = tk.encode(prompt, add_special=True, parse_special=True)
    prep = SimpleNamespace(user_prefixes=[render(turns[:0]), render(turns[:2])], media=[], part_starts=[])
    got = user_starts(SimpleNamespace(tokenizer=tk), prep, toks)
    im_start = tk.encode("<|im_start|>user", add_special=False, parse_special=True)
    want = [i for i in range(len(toks)) if toks[i:i + len(im_start)] == im_start]
    assert got == want and len(got) == 2 and got[0] == 1  # after the BOS
