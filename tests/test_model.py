"""The batched paged-KV forward against a straightforward float64 implementation.

The reference below recomputes every sequence from scratch (no cache, no batching), with its own
RoPE, attention and GQA code; the engine's forward runs the same sequences chunked, mixed with
other sequences' decode steps, through the block-allocated cache.
"""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

import kernels
from kernels.cpu.native import lib as native_lib
from kernels.dequant_ref import dequantize
from kernels.qweight import QWeight
from runtime.model.kv_store import SeqKV
from runtime.serving.blocks import BlockManager
from runtime.model.loader import load_model
from runtime.model.decoder import Model, SeqBatch
from runtime.model.rope import rope_inv_freq
from runtime.model.tiny_model import spec_with, write_tiny_model


def _w64(x) -> torch.Tensor:
    if isinstance(x, QWeight):
        return dequantize(x).double()
    return x.double()


def _rope64(x: torch.Tensor, pos: torch.Tensor, base: float, neox: bool) -> torch.Tensor:
    """x: [T, NH, D] float64, rotated at integer positions pos: [T]."""
    d = x.shape[-1]
    out = x.clone()
    for i in range(d // 2):
        theta = pos.double() * base ** (-2.0 * i / d)
        c, s = torch.cos(theta)[:, None], torch.sin(theta)[:, None]
        a, b = (i, i + d // 2) if neox else (2 * i, 2 * i + 1)
        x0, x1 = x[:, :, a], x[:, :, b]
        out[:, :, a] = x0 * c - x1 * s
        out[:, :, b] = x0 * s + x1 * c
    return out


def _rms64(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def reference_logits(lm, tokens: list[int]) -> torch.Tensor:
    """Logits [T, V] float64 of every position of one sequence."""
    cfg, W = lm.config, lm.weights
    H, KVH, D = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    T = len(tokens)
    h = _w64(W["token_embd.weight"])[torch.tensor(tokens)]
    pos = torch.arange(T)
    mask = torch.full((T, T), -math.inf, dtype=torch.float64).triu(1)
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        x = _rms64(h, _w64(W[p + "attn_norm.weight"]), cfg.rms_eps)
        q = x @ _w64(W[p + "attn_q.weight"]).T
        k = x @ _w64(W[p + "attn_k.weight"]).T
        v = x @ _w64(W[p + "attn_v.weight"]).T
        if p + "attn_q.bias" in W:
            q = q + _w64(W[p + "attn_q.bias"])
            k = k + _w64(W[p + "attn_k.bias"])
            v = v + _w64(W[p + "attn_v.bias"])
        q, k, v = q.view(T, H, D), k.view(T, KVH, D), v.view(T, KVH, D)
        if p + "attn_q_norm.weight" in W:
            q = _rms64(q, _w64(W[p + "attn_q_norm.weight"]), cfg.rms_eps)
            k = _rms64(k, _w64(W[p + "attn_k_norm.weight"]), cfg.rms_eps)
        q = _rope64(q, pos, cfg.rope_freq_base, cfg.rope_neox)
        k = _rope64(k, pos, cfg.rope_freq_base, cfg.rope_neox)
        out = torch.empty(T, H, D, dtype=torch.float64)
        for hh in range(H):
            kh = hh // (H // KVH)
            s = q[:, hh] @ k[:, kh].T / math.sqrt(D) + mask
            out[:, hh] = torch.softmax(s, -1) @ v[:, kh]
        h = h + out.reshape(T, H * D) @ _w64(W[p + "attn_output.weight"]).T
        x = _rms64(h, _w64(W[p + "ffn_norm.weight"]), cfg.rms_eps)
        g = x @ _w64(W[p + "ffn_gate.weight"]).T
        u = x @ _w64(W[p + "ffn_up.weight"]).T
        h = h + (torch.nn.functional.silu(g) * u) @ _w64(W[p + "ffn_down.weight"]).T
    h = _rms64(h, _w64(W["output_norm.weight"]), cfg.rms_eps)
    out_w = W.get("output.weight", W["token_embd.weight"])
    return h @ _w64(out_w).T


def _randomize_norms(lm, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for name, t in list(lm.weights.items()):
        if name.endswith("norm.weight"):
            lm.weights[name] = 1.0 + 0.3 * torch.randn(t.shape, generator=g)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm())


@pytest.fixture(scope="module", params=[
    ("llama", "f32", {}),
    ("qwen2", "f32", {}),
    ("qwen3", "f32", {"head_dim": 24}),
    ("llama", "q8_0", {}),
    ("llama", "q4_k", {"n_embd": 256, "n_ff": 512}),
    ("mistral", "f16", {"tie_embeddings": True}),
])
def tiny(request, tmp_path_factory):
    arch, wtype, extra = request.param
    spec = spec_with(arch=arch, wtype=wtype, n_layer=2, n_embd=extra.pop("n_embd", 64), n_head=4, n_head_kv=2,
                     n_ff=extra.pop("n_ff", 96), n_vocab=300, init_std=0.15, seed=random.randrange(1 << 30),
                     **extra)
    path = tmp_path_factory.mktemp("m") / f"{arch}-{wtype}.gguf"
    write_tiny_model(path, spec)
    lm = load_model(path)
    _randomize_norms(lm, spec.seed)
    return lm


# (float16 cache: rows of batches under 64 take llama.cpp's flash attention, whose accumulator is float16)
@pytest.mark.parametrize("kv_dtype,tol", [(torch.float32, 2e-4), (torch.float16, 1e-2)])
def test_batched_paged_forward_matches_float64_reference(tiny, kv_dtype, tol):
    """Batching, chunking and the paged cache against the float64 reference. Quantized weights are
    dequantized once at load here (float math, the float tolerances); the integer-dot path, whose
    activation quantization these chaotic random networks (std 0.15, random norms) amplify to ~10%
    over 2 layers, is checked on a calmer model in
    test_integer_dot_model_matches_the_float_reference."""
    _check_batched_forward(tiny, Model(tiny, pack_quantized=False), kv_dtype, tol)


def _check_batched_forward(lm, model, kv_dtype, tol):
    n_vocab = model.n_vocab
    rng = random.Random(7)
    seqs = [[rng.randrange(n_vocab) for _ in range(n)] for n in (37, 1, 70)]
    refs = [reference_logits(lm, s) for s in seqs]

    # a cache with blocks handed out in a scrambled order
    kv = BlockManager(model.new_kv_store(512, block_size=8, dtype=kv_dtype))
    order = list(range(kv.store.num_blocks))
    rng.shuffle(order)
    kv.pool.free.clear()
    kv.pool.free.extend(order)

    states = [SeqKV() for _ in seqs]
    fed = [0, 0, 0]
    # step 1: seq0 prefix of 20, seq1 whole (1 token), seq2 first 33
    # then: seq0 rest as a chunk while seq1 decodes; then token-by-token decode of everything
    plan = [{0: 20, 1: 1, 2: 33}, {0: 17, 2: 30}, {2: 7}]
    for step in plan:
        batch = []
        for i, n in step.items():
            kv.reserve(states[i], fed[i] + n)
            batch.append(SeqBatch(states[i], seqs[i][fed[i]:fed[i] + n], fed[i]))
        logits, _ = model.forward(kv.store, batch)
        for row, (i, n) in enumerate(step.items()):
            assert states[i].n_tokens == fed[i]  # the forward does not advance the sequence
            fed[i] += n
            states[i].n_tokens = fed[i]  # the caller (the serving runner) does
            assert _rel(logits[row], refs[i][fed[i] - 1]) < tol, (i, fed[i])
    assert fed == [37, 1, 70]
    # decode: feed one more token to each and compare with the reference on the longer sequence
    extra = [rng.randrange(n_vocab) for _ in seqs]
    batch = []
    for i, s in enumerate(states):
        kv.reserve(s, fed[i] + 1)
        batch.append(SeqBatch(s, [extra[i]], fed[i]))
    logits, _ = model.forward(kv.store, batch)
    for i in range(3):
        ref = reference_logits(lm, seqs[i] + [extra[i]])[-1]
        assert _rel(logits[i], ref) < tol
        assert states[i].n_tokens == fed[i]




def test_forward_does_not_advance_n_tokens(tmp_path):
    """Only the serving room's model runner advances a sequence's token count: `Model.forward`
    (prefill and decode rows, logits and hidden states) leaves `n_tokens` and the block table as the
    caller reserved them."""
    spec = spec_with(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=96, n_vocab=300, init_std=0.15, seed=11)
    path = tmp_path / "n.gguf"
    write_tiny_model(path, spec)
    m = Model(load_model(path))
    kv = BlockManager(m.new_kv_store(128, block_size=8, dtype=torch.float32))
    a, b, c = SeqKV(), SeqKV(), SeqKV()
    for s, n in ((a, 12), (b, 1), (c, 5)):
        kv.reserve(s, n)
    m.forward(kv.store, [SeqBatch(a, list(range(12)), 0), SeqBatch(b, [3], 0),
                         SeqBatch(c, [1, 2, 3, 4, 5], 0, logits=False, hidden=True)])
    assert (a.n_tokens, b.n_tokens, c.n_tokens) == (0, 0, 0)
    a.n_tokens = 12
    kv.reserve(a, 13)
    blocks = list(a.blocks)
    m.forward(kv.store, [SeqBatch(a, [7], 12)])
    assert a.n_tokens == 12 and a.blocks == blocks


def test_rope_inv_freq_linear_scaling():
    class C:
        head_dim = 8
        rope_freq_base = 10000.0
        rope_scaling_type = "linear"
        rope_scaling_factor = 4.0
    inv = rope_inv_freq(C())
    expect = 1.0 / (10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)) / 4.0
    assert torch.allclose(inv.double(), expect, rtol=1e-6)


def _prefill_logits(m: Model, toks: list[int]) -> torch.Tensor:
    """Logits of every position of `toks` (one sequence, fed one chunk, then each row's logits
    through decode steps of one token so that every row goes through the model's batch paths)."""
    kv = BlockManager(m.new_kv_store(64, dtype=torch.float32))
    s = SeqKV()
    kv.reserve(s, len(toks))
    out = []
    for i in range(len(toks)):
        logits, _ = m.forward(kv.store, [SeqBatch(s, toks[: i + 1] if i == 0 else [toks[i]], 0 if i == 0 else i)])
        out.append(logits[0])
    return torch.stack(out)


@pytest.mark.parametrize("wtype", ["q4_k", "q8_0"])
def test_quantized_weights_kept_in_blocks_give_the_same_logits(tmp_path, wtype):
    """On the CPU, quantized weights that are not given to a kernel (`pack_quantized=False`) are
    dequantized once at load when they fit the memory budget, or else kept in GGUF blocks and
    dequantized per matmul; the float-affine tiles (kernels.cpu.qgemv, the fallback for types the
    integer-dot kernels lack) hold the same values: the same numbers all three ways."""
    spec = spec_with(wtype=wtype, n_layer=1, n_embd=256, n_head=4, n_head_kv=2, n_ff=256, n_vocab=300,
                     init_std=0.15, seed=5)
    path = tmp_path / "q.gguf"
    write_tiny_model(path, spec)
    lm = load_model(path)
    unpacked, blocks = Model(lm, pack_quantized=False), Model(lm, unpack_budget=0, pack_quantized=False)
    assert unpacked.unpacked_quantized and not blocks.unpacked_quantized
    assert not blocks.layers[0].w_down.is_float and unpacked.layers[0].w_down.is_float
    models = [unpacked, blocks]
    from kernels.cpu import qgemv as cpu_qgemv
    if cpu_qgemv.available():  # the fallback layout, forced on every matrix
        tiles = Model(lm, pack_quantized=False)
        for L in tiles.layers:
            L.wqkv = [cpu_qgemv.pack(x) for x in _cat(lm, "attn_q", "attn_k", "attn_v")]
            L.w_gate_up = [cpu_qgemv.pack(x) for x in _cat(lm, "ffn_gate", "ffn_up")]
            L.wo, L.w_down = (cpu_qgemv.pack(lm.weights[f"blk.0.{n}.weight"]) for n in ("attn_output", "ffn_down"))
        models.append(tiles)
    toks = list(range(1, 20))
    out = []
    for m in models:
        kv = BlockManager(m.new_kv_store(64, dtype=torch.float32))
        s = SeqKV()
        kv.reserve(s, len(toks))
        logits, _ = m.forward(kv.store, [SeqBatch(s, toks, 0)])
        out.append(logits)
    for o in out[1:]:
        assert _rel(o, out[0].double()) < 1e-5


def _cat(lm, *names) -> list[QWeight]:
    from kernels.ref import cat_rows
    return cat_rows([lm.weights[f"blk.0.{n}.weight"] for n in names])


# Integer-dot path (kernels/cpu/qdot) at model level, against the same model with the quantized
# weights dequantized to float32 (the float reference): the only difference is the activation
# quantization to 8 bits per block (per 32 for Q4_0 / Q8_0 weights, per 256 for the K-quants),
# ~0.3-1% relative error per matmul (tests/test_qdot.py). Through 2 layers and the head, measured
# 1.5-2.7% relative error of the logits on these models (the same on every ISA build): stated
# tolerance 4%, and the greedy token the same at >= 85% of the positions (measured 92-100%).
QDOT_LOGITS_RTOL = 4e-2
QDOT_ARGMAX_AGREE = 0.85


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
@pytest.mark.parametrize("wtype,tied", [("q8_0", True), ("q4_0", False), ("q4_k", False), ("q6_k", True)])
def test_integer_dot_model_matches_the_float_reference(tmp_path, monkeypatch, isa, wtype, tied):
    from kernels.cpu import qdot
    if isa not in qdot.supported_isas():
        pytest.skip(f"this CPU cannot run {isa}")
    monkeypatch.setenv("TRITIUM_CPU_ISA", isa)
    if qdot.lib() is None:
        pytest.skip("no C compiler")
    spec = spec_with(wtype=wtype, arch="qwen2", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
                     n_vocab=300, init_std=0.05, seed=7, tie_embeddings=tied)
    path = tmp_path / "q.gguf"
    write_tiny_model(path, spec)
    lm = load_model(path)
    ref, m = Model(lm, pack_quantized=False), Model(lm)
    assert ref.unpacked_quantized and m.packed_quantized
    L = m.layers[0]
    # q/k/v and gate/up each one integer-dot group (one call, the input quantized once)
    assert [(x.layout, x.rows) for x in L.wqkv] == [("x8", (4 + 2 * 2) * 64)]
    assert [(x.layout, x.rows) for x in L.w_gate_up] == [("x8", 2 * 512)]
    assert L.wo.layout == L.w_down.layout == m.output.layout == "x8"
    # the panels hold the file's bits: exactly the reference dequantization, group members in order
    names = [f"blk.0.attn_{n}.weight" for n in "qkv"]
    assert torch.equal(kernels.dequantize(L.wqkv[0]), torch.cat([dequantize(lm.weights[n]) for n in names]))
    assert L.wqkv[0].nbytes < sum(lm.weights[n].nbytes for n in names) + 128 * L.wqkv[0].rows // 8  # < 128 B per 8 rows
    # embeddings: tied ones are looked up in the repacked head, exactly; untied ones stay in the
    # file's blocks (only the rows looked up are ever read)
    ids = torch.tensor([0, 299, 5, 64, 5])
    assert m.tok_embd.layout == ("x8" if tied else "rows")
    assert torch.equal(kernels.embedding(ids, m.tok_embd), dequantize(lm.weights["token_embd.weight"])[ids])
    toks = [(7 * i * i + 3) % 300 for i in range(24)]
    want, got = _prefill_logits(ref, toks), _prefill_logits(m, toks)
    agree = float((got.argmax(1) == want.argmax(1)).double().mean())
    assert _rel(got, want.double()) < QDOT_LOGITS_RTOL
    assert agree >= QDOT_ARGMAX_AGREE, agree


def test_yarn_matches_ggml_rope_formula():
    """Effective inverse frequencies and score scale against ggml's per-dimension YaRN angle."""
    class C:
        head_dim = 64
        rope_freq_base = 1000000.0
        rope_scaling_type = "yarn"
        rope_scaling_factor = 4.0
        rope_scaling_orig_ctx = 32768
        yarn_ext_factor = -1.0
        yarn_attn_factor = 1.0
        yarn_beta_fast = 32.0
        yarn_beta_slow = 1.0
    cfg = C()
    inv = rope_inv_freq(cfg).double()
    # ggml_rope_yarn for one position, written out
    d, base, fs, pos = 64, 1000000.0, 0.25, 12345.0

    def corr_dim(n_rot):
        return d * math.log(32768 / (n_rot * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(0, math.floor(corr_dim(32.0))), min(d - 1, math.ceil(corr_dim(1.0)))
    for i0 in range(0, d, 2):
        theta_extrap = pos * base ** (-i0 / d)
        y = (i0 / 2 - low) / max(0.001, high - low)
        ramp = 1 - min(1.0, max(0.0, y))
        theta = fs * theta_extrap * (1 - ramp) + theta_extrap * ramp
        assert abs(pos * float(inv[i0 // 2]) - theta) <= 1e-6 * max(1.0, abs(theta))
    # YaRN's magnitude factor goes into the rope (cos and sin), as ggml_rope_ext applies it: llama_context's
    # attn_factor get_mscale(4, 1) / (1 + 0.1 ln 4) times ggml's 1 + 0.1 ln 4, in float32
    from runtime.model.rope import rope_mscale
    assert abs(rope_mscale(cfg) - (1 + 0.1 * math.log(4.0))) < 1e-6
    assert rope_mscale(cfg) == float(np.float32(rope_mscale(cfg)))
    assert rope_mscale(cfg, 1.0) != rope_mscale(cfg) and abs(rope_mscale(cfg, 1.0) - 1.0) < 1e-6  # gemma's local layers
    cfg.rope_attn_factor = 0.5
    assert abs(rope_mscale(cfg) - 0.5 * (1 + 0.1 * math.log(4.0))) < 1e-6
    cfg.rope_scaling_type = "none"  # no YaRN: the file's attn_factor alone
    assert rope_mscale(cfg) == 0.5


@pytest.mark.parametrize("backend", ["torch", "cpu", "triton"])
@pytest.mark.parametrize("neox", [False, True])
def test_rope_mscale_scales_cos_and_sin(backend, neox):
    """kernels.rope(..., mscale=m) rotates by cos * m and sin * m as ggml's rope_yarn (the factor on the
    rotated pairs only); the CPU kernel bit for bit: cs = cosf(a) * m, x0' = fmaf(x0, cs, -(x1 sn))."""
    import ctypes
    import ctypes.util

    g = torch.Generator().manual_seed(3)
    T, NH, D, R, m = 5, 3, 16, 6, float(np.float32(1.1386294))
    x = torch.randn(T, NH, D, generator=g)
    pos = torch.tensor([0, 3, 17, 250, -4])
    inv = (1.0 / (10000.0 ** (torch.arange(R, dtype=torch.float32) / R))).float()
    ops = kernels.Backend(backend)
    got = ops.rope(x, pos, inv, neox, 0.0, m)
    plain = ops.rope(x, pos, inv, neox, 0.0)
    rot = torch.cat([torch.arange(R), torch.arange(R) + R]) if neox else torch.arange(2 * R)
    assert torch.equal(got[..., 2 * R:], x[..., 2 * R:])
    assert float((got[..., rot] - plain[..., rot] * m).abs().max()) < 1e-5
    assert float((got[..., rot] - plain[..., rot]).abs().max()) > 1e-2
    if backend != "cpu" or native_lib() is None:
        return
    libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    for f in ("cosf", "sinf"):
        getattr(libm, f).restype, getattr(libm, f).argtypes = ctypes.c_float, [ctypes.c_float]
    libm.fmaf.restype, libm.fmaf.argtypes = ctypes.c_float, [ctypes.c_float] * 3
    f32 = np.float32
    want = x.numpy().copy()
    for t in range(T):
        for i in range(R):
            a = float(f32(float(pos[t])) * f32(float(inv[i])))
            cs, sn = f32(libm.cosf(a)) * f32(m), f32(libm.sinf(a)) * f32(m)
            i0, i1 = (i, i + R) if neox else (2 * i, 2 * i + 1)
            for h in range(NH):
                x0, x1 = float(x[t, h, i0]), float(x[t, h, i1])
                want[t, h, i0] = libm.fmaf(x0, float(cs), -float(f32(x1) * sn))
                want[t, h, i1] = libm.fmaf(x0, float(sn), float(f32(x1) * cs))
    assert np.array_equal(got.numpy(), want)


@pytest.mark.parametrize("k", [1, 40])
def test_topk_logits_match_the_exact_row(tmp_path, k):
    """Rows that only need their top-k logits (greedy, top_k-first sampling) go through an int8
    first pass plus an exact recompute of the candidates: the top-k must equal the exact row's."""
    from kernels.cpu import gemv as cpu_gemv
    if not cpu_gemv.i8_fast():
        pytest.skip("no C compiler or no AVX2/AVX-512 for the CPU kernels on this machine")
    spec = spec_with(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_vocab=5000, init_std=0.3,
                     seed=random.randrange(1 << 20))
    path = tmp_path / "v.gguf"
    write_tiny_model(path, spec)
    m = Model(load_model(path))
    assert m._topk_head is not None
    kv = BlockManager(m.new_kv_store(256, dtype=torch.float32))
    seqs = [SeqKV() for _ in range(3)]
    toks = [[random.randrange(5000) for _ in range(n)] for n in (5, 9, 1)]
    for s, t in zip(seqs, toks):
        kv.reserve(s, len(t))
    full, _ = m.forward(kv.store, [SeqBatch(s, t, 0) for s, t in zip(seqs, toks)])
    for s, t in zip(seqs, toks):
        kv.truncate(s, 0)
        kv.reserve(s, len(t))
    banned = (7, int(full[0].argmax()))
    part, _ = m.forward(kv.store, [SeqBatch(s, t, 0, topk=k, banned=banned if i == 0 else ())
                             for i, (s, t) in enumerate(zip(seqs, toks))])
    for i in range(3):
        ref_row = full[i].clone()
        if i == 0:
            ref_row[list(banned)] = float("-inf")
        tv, ti = torch.topk(ref_row, k)
        pv, pi = torch.topk(part[i], k)
        assert set(ti.tolist()) == set(pi.tolist())
        assert torch.allclose(pv, tv, rtol=1e-5, atol=1e-5)
        assert int((part[i] > float("-inf")).sum()) < 5000 // 4  # only candidates were recomputed
