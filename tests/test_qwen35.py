"""qwen35 / qwen35moe (runtime/model/arch/qwen35.py; the linear-attention ops of kernels/ref_linear.py,
kernels/cpu/linear_attn.c, kernels/triton/linear_attn.py; the recurrent state's serving in
runtime/serving/blocks.py and runtime/serving/) on the tiny random models of
scripts/record_qwen35_reference.py:

- the short convolution and the gated delta rule (CPU C kernel, Triton under the interpreter, the
  chunked prefill form) against a float64 reference, several sequences in their state cells;
- the model through the Triton backend (interpreter) against the reference backend;
- greedy tokens equal to llama-server b1-0c1e570's (tests/data/qwen35_greedy.json, recorded by
  `python scripts/record_qwen35_reference.py` with llama-server's defaults and with float32
  attention, `-ctk f32 -ctv f32 -fa off`; recorded with an AVX2 build on an AVX2 machine);
- serving (tests/data/qwen35_serving.json and qwen35_slot.bin, recorded by
  `python scripts/record_qwen35_serving.py`): a conversation whose turns resume the recurrent state
  from the slot or its context checkpoints (the same prompt tokens evaluated per turn as
  llama-server, the same tokens), a branch, a slot file in llama.cpp's hybrid layout that
  llama-server wrote, restored and continued;
- `-tp` refused with a clear message.
"""
from __future__ import annotations

import os

if os.environ.get("TRITIUM_KERNEL_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kernels import cpu as cpu_ops
from kernels import ref_linear
from runtime.model.kv_store import SeqKV
from runtime.model.decoder import Model, SeqBatch
from runtime.model.loader import load_model
from runtime.serving.blocks import BlockManager
from runtime.serving.plan import recurrent_resume
from tests.llama_tokens import compare, recorded_tokens, variant_files

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "record_qwen35_reference"


@pytest.fixture(scope="module")
def recorded() -> dict:
    return recorded_tokens("qwen35_greedy.json")


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, Path]:
    return variant_files(SCRIPT, tmp_path_factory.mktemp("qwen35"))


# ---------------------------------------------------------------------------------------------
# the linear-attention ops against float64


def _gdn_inputs(lens=(5, 1, 70), Hk=2, Hv=4, S=32, NC=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = sum(lens)
    q = torch.nn.functional.normalize(torch.randn(T, Hk, S, generator=g), dim=-1)  # the model l2-normalizes q, k
    k = torch.nn.functional.normalize(torch.randn(T, Hk, S, generator=g), dim=-1)
    v = torch.randn(T, Hv, S, generator=g)
    gate = -torch.rand(T, Hv, generator=g) * 2  # log decay <= 0
    beta = torch.rand(T, Hv, generator=g)
    state = torch.randn(NC, Hv, S, S, generator=g) * 0.1
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    cells = torch.tensor([2, 0, 3][:len(lens)], dtype=torch.int64)
    return q, k, v, gate, beta, state, cells, cu


def _gdn64(q, k, v, gate, beta, state, cells, cu):
    st = state.double().clone()
    o = ref_linear.gated_delta_net(q.double(), k.double(), v.double(), gate.double(), beta.double(), st, cells, cu)
    return o, st


@pytest.mark.parametrize("impl", ["cpu", "triton", "chunked"])
def test_gated_delta_net_against_float64(impl):
    q, k, v, gate, beta, state, cells, cu = _gdn_inputs()
    want_o, want_st = _gdn64(q, k, v, gate, beta, state, cells, cu)
    st = state.clone()
    if impl == "triton":
        from kernels.triton import linear_attn
        o = linear_attn.gated_delta_net(q, k, v, gate, beta, st, cells, cu)
    elif impl == "cpu":
        o = cpu_ops.gated_delta_net(q, k, v, gate, beta, st, cells, cu)
    else:  # llama.cpp's chunked prompt form (chunks of 64: the 70-token sequence spans two)
        o = ref_linear.gated_delta_net_chunked(q, k, v, gate, beta, st, cells, cu)
    torch.testing.assert_close(o.double(), want_o, rtol=1e-4, atol=2e-5)
    torch.testing.assert_close(st.double(), want_st, rtol=1e-4, atol=2e-5)
    assert torch.equal(st[1], state[1]), "a cell no sequence names is left alone"


@pytest.mark.parametrize("impl", ["cpu", "triton"])
def test_ssm_conv_against_float64(impl):
    g = torch.Generator().manual_seed(3)
    lens, C, K, NC = (4, 1, 9), 24, 4, 4
    T = sum(lens)
    x = torch.randn(T, C, generator=g)
    w = torch.randn(C, K, generator=g)
    state = torch.randn(NC, K - 1, C, generator=g)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    cells = torch.tensor([1, 3, 0], dtype=torch.int64)
    want = torch.empty(T, C, dtype=torch.float64)
    want_st = state.double().clone()
    for s, cell in enumerate(cells.tolist()):  # silu(causal depthwise conv), the last K - 1 inputs kept
        a, b = int(cu[s]), int(cu[s + 1])
        inp = torch.cat([want_st[cell], x[a:b].double()])
        acc = sum(inp[i:i + b - a] * w[:, i].double() for i in range(K))
        want[a:b] = acc * torch.sigmoid(acc)
        want_st[cell] = inp[b - a:]
    st = state.clone()
    if impl == "triton":
        from kernels.triton import linear_attn
        y = linear_attn.ssm_conv(x, w, st, cells, cu)
    else:
        y = cpu_ops.ssm_conv(x, w, st, cells, cu)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(st.double(), want_st)
    assert torch.equal(st[2], state[2])


class _TritonLinear:
    """A backend's ops with the linear-attention ones from kernels/triton/linear_attn.py (the
    interpreter runs the model's matmuls too slowly for the suite; tests/test_model_triton.py
    covers those)."""
    def __init__(self, ops):
        from kernels.triton import linear_attn
        self._ops, self.ssm_conv, self.gated_delta_net = ops, linear_attn.ssm_conv, linear_attn.gated_delta_net

    def __getattr__(self, name):
        return getattr(self._ops, name)


def test_model_triton_linear_attention_interpreter(model_files):
    """The model (prompt in one batch, then single tokens) with its linear-attention layers on the
    Triton kernels, against the reference backend."""
    lm = load_model(model_files["f32"], progress=lambda m: None)
    ids = [1, 50, 300, 7, 99, 1000]

    def run(backend: str) -> torch.Tensor:
        m = Model(lm, "cpu", backend="torch")
        if backend == "triton":
            m.ops = _TritonLinear(m.ops)
        kv, rs = BlockManager(m.new_kv_store(64, dtype=torch.float32)), m.new_state(1)
        seq = SeqKV()
        kv.reserve(seq, len(ids))
        out = [m.forward(kv.store, [SeqBatch(seq, ids[:4], 0, rs=0)], rs)[0][0]]
        for i in (4, 5):
            kv.commit(seq, i)
            out.append(m.forward(kv.store, [SeqBatch(seq, [ids[i]], i, rs=0)], rs)[0][0])
        return torch.stack(out)

    torch.testing.assert_close(run("triton"), run("torch"), rtol=1e-3, atol=1e-3)


# ---------------------------------------------------------------------------------------------
# llama-server's tokens


# prompts (of 8) whose 24 greedy tokens equal llama-server's (AVX2 build, this AVX2 machine;
# measured 2026-12-07: f32 8/8 in both configurations, q8_0 8/8, q4_k 8 and 7, moe-f32 8/8,
# moe-q8_0 7 and 6: the tiny MoE's router amplifies the 8-bit activations' rounding)
# (the other recorded pairs pass as measured there; left out to keep the suite's time)
NEED = {("f32", "default"): 8, ("q8_0", "f32attn"): 8}


@pytest.mark.parametrize("variant,config", sorted(NEED))
def test_greedy_matches_llama_server(model_files, recorded, variant, config):
    same, prefix = compare(model_files[variant], recorded, variant, config, "scripts/record_qwen35_reference.py")
    assert same >= NEED[(variant, config)], f"{same}/8 identical; matching prefixes {prefix}"


def test_moe_greedy_matches_llama_server(model_files, recorded):
    """qwen35moe (experts plus the gated shared expert), two token prompts of the "default" recording."""
    import hashlib

    from runtime.tokenizer import load_tokenizer
    from tests.llama_tokens import greedy

    path = model_files["moe-f32"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == recorded["sha256"]["moe-f32"]
    lm = load_model(path, progress=lambda m: None)
    m = Model(lm, "cpu")
    banned = sorted(load_tokenizer(lm.gguf_metadata).eot_ids)
    want = recorded["tokens"]["moe-f32"]["default"]["token_prompts"]
    for prompt, toks in list(zip(recorded["token_prompts"], want))[:2]:
        assert greedy(m, prompt, recorded["n_predict"], banned, torch.float16) == toks


# ---------------------------------------------------------------------------------------------
# serving: the recurrent state per slot, context checkpoints, slot files


def test_recurrent_resume():
    # the cached state is exactly the common prefix and a token follows: resumed from it
    assert recurrent_resume(10, 15, 10, [4]) == (10, [4])
    # the slot holds more (an answer, a mismatch): the newest checkpoint c with c - 1 < n_past
    assert recurrent_resume(10, 15, 14, [4, 9, 11]) == (9, [4, 9])
    # the whole prompt is cached: a checkpoint that leaves a token to evaluate
    assert recurrent_resume(10, 10, 14, [4, 10]) == (4, [4])
    # none usable: from 0
    assert recurrent_resume(10, 15, 14, [12]) == (0, [])


def test_server_serves_qwen35_conversation_and_slot_file(start_server, model_files, tmp_path):
    """llama-server's tokens and evaluated prompt tokens per turn (the recurrent state resumed from
    the slot or a context checkpoint), its slot file restored and continued from the restored state."""
    import sys
    sys.path.insert(0, str(REPO / "scripts"))
    import record_qwen35_serving as serving

    want = json.loads((REPO / "tests" / "data" / "qwen35_serving.json").read_text())
    slots = tmp_path / "slots"
    slots.mkdir()
    shutil.copy(REPO / "tests" / "data" / "qwen35_slot.bin", slots / "b1.bin")
    srv = start_server("-m", str(model_files["f32"]), *serving.SERVER_ARGS, "--slot-save-path", str(slots))
    got = serving.scenario(srv.url, "mine.bin")
    for key in ("turns", "branch", "other", "back", "save", "restore", "after_restore"):
        assert got[key] == want[key], key
    # our file has llama-server's layout (M-RoPE cells, attention K/V, then the recurrent section):
    # its size, and every byte outside the float data
    mine, b1 = (slots / "mine.bin").read_bytes(), (slots / "b1.bin").read_bytes()
    assert len(mine) == len(b1) and mine[:988] == b1[:988]
    # llama-server's own file, restored into the slot, continued from its recurrent state
    import httpx
    r = httpx.post(srv.url + "/slots/0?action=restore", json={"filename": "b1.bin"}, timeout=60).json()
    assert r["n_restored"] == want["restore"]["n_restored"]
    r = httpx.post(srv.url + "/completion", json=dict(serving.REQUEST, prompt=want["after_restore"]["prompt"]),
                   timeout=120).json()
    assert r["tokens"] == want["after_restore"]["tokens"] and r["timings"]["prompt_n"] == 3


def test_tensor_parallel_refused(model_files):
    from runtime.parallel.shard import shard_loaded

    lm = load_model(model_files["f32"], progress=lambda m: None)
    with pytest.raises(ValueError, match=r"qwen35: tensor parallelism \(-tp\) is not supported for hybrid"):
        shard_loaded(lm, SimpleNamespace(world=2, rank=0))
