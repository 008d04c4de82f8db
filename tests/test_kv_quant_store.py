"""KVStore with quantized caches (-ctk / -ctv): the rows it keeps are llama.cpp's blocks, host states
(what slot files and the RAM prompt cache hold) carry them and their types, a state goes back into a
store of its types byte for byte and into a float store as its values; the Hadamard rotation llama.cpp
b1 applies to quantized caches (attn_rot_k / attn_rot_v) is ggml's FWHT."""
from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q

import kernels
from kernels import kv_quant_ref as R
from runtime.model.kv_store import KVStore, SeqKV


def _store(tk, tv, dtype=torch.float16):
    return KVStore(3, 2, 64, num_blocks=6, block_size=4, dtype=dtype, type_k=tk, type_v=tv)


def test_quantized_rows_and_states_round_trip():
    g = torch.Generator().manual_seed(5)
    st = _store(Q.Q8_0, Q.Q4_0)
    assert st.k[0].dtype == torch.uint8 and st.k[0].shape == (6, 4, 2, 34 * 2) and st.v[0].shape == (6, 4, 2, 18 * 2)
    assert st.row_bytes(Q.Q8_0) == 2 * 68 and st.kv_types == (Q.Q8_0, Q.Q4_0)
    assert (st.rot_k, st.rot_v) == (64, 64)
    seq = SeqKV(blocks=[4, 1, 3], n_tokens=10)
    ks = [torch.randn(10, 2, 64, generator=g) for _ in range(3)]
    vs = [torch.randn(10, 2, 64, generator=g) for _ in range(3)]
    st.scatter(seq, 0, ks, vs)
    state = st.read(seq, 10)
    assert (state.type_k, state.type_v) == (Q.Q8_0, Q.Q4_0) and state.k.shape == (3, 10, 136)
    assert torch.equal(state.k[1].view(10, 2, 68), R.quantize_rows(ks[1], Q.Q8_0))
    assert torch.equal(state.v[2].view(10, 2, 36), R.quantize_rows(vs[2], Q.Q4_0))
    other = _store(Q.Q8_0, Q.Q4_0)
    seq2 = SeqKV(blocks=[0, 2, 5], n_tokens=10)
    other.write(seq2, state)
    assert torch.equal(other.read(seq2, 10).k, state.k) and torch.equal(other.read(seq2, 10).v, state.v)
    f = _store(None, None, torch.float32)
    f.write(seq2, state)  # into a float store: the values the blocks hold
    back = f.read(seq2, 10)
    assert torch.equal(back.k[0].view(torch.float32).view(10, 2, 64), R.dequantize_rows(state.k[0].view(10, 2, 68), Q.Q8_0))


def test_an_empty_slots_state_has_its_row_width():
    """A slot with no tokens exports [L, 0, row_bytes] (POST /slots/N?action=save on an idle slot
    answered 500 "cannot reshape tensor of 0 elements"), in float and quantized stores."""
    for kt, vt, dt in ((None, None, torch.float16), (Q.Q8_0, Q.Q4_0, torch.float16)):
        st = _store(kt, vt, dt)
        state = st.read(SeqKV(), 0)
        assert state.k.shape == (3, 0, st.row_bytes(st.type_k)) and state.v.shape == (3, 0, st.row_bytes(st.type_v))
        st.write(SeqKV(), state)


def test_hadamard_is_ggmls_fwht():
    x = torch.randn(5, 3, 128, generator=torch.Generator().manual_seed(2))
    for n in (64, 128):
        h = torch.tensor([[(-1) ** bin(i & j).count("1") for j in range(n)] for i in range(n)], dtype=torch.float64)
        want = (x.double().reshape(-1, n) @ h / n ** 0.5).reshape(x.shape)
        got = kernels.hadamard(x, n)
        assert (got.double() - want).abs().max().item() < 1e-5
        assert (kernels.hadamard(got, n) - x).abs().max().item() < 1e-5  # its own inverse
    assert kernels.kv_rotation_sizes(Q.Q8_0, Q.F16, 128) == (128, 0)
    assert kernels.kv_rotation_sizes(Q.F16, Q.Q4_0, 256) == (0, 64)
    assert kernels.kv_rotation_sizes(Q.Q8_0, Q.Q8_0, 96) == (0, 0)  # not a multiple of 64: no rotation


def test_quantized_v_cache_needs_flash_attention(tmp_path):
    """-ctv q8_0 -fa off: llama_init_from_model's refusal (b1 exits at load); -fa auto / on load it."""
    from runtime.model.tiny_model import spec_with, write_tiny_model
    from runtime.serving import Engine, EngineConfig

    path = tmp_path / "t.gguf"
    write_tiny_model(path, spec_with(n_layer=1, n_embd=64, n_head=2, n_head_kv=2, n_ff=64, n_ctx=256, seed=3),
                     vocab="builtin")
    cfg = dict(model_path=str(path), n_ctx=256, n_parallel=1, verbosity=0, warmup=False, kv_type_v="q8_0")
    with pytest.raises(ValueError, match="quantized V cache requires flash_attn to be enabled"):
        Engine(EngineConfig(**cfg, flash_attn="off")).load()
    for fa in ("auto", "on"):
        e = Engine(EngineConfig(**cfg, flash_attn=fa))
        e.load()
        assert e.blocks.store.type_v.name == "Q8_0"
