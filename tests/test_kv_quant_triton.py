"""The quantized KV cache in Triton (kernels/triton/kv_quant.py, the paged attention kernels reading it)
against the numpy reference (kernels/kv_quant_ref.py) and float64 attention over the dequantized caches.
On CPU tensors under the interpreter (TRITON_INTERPRET=1, set here before triton is imported); with
TRITIUM_KERNEL_DEVICE=cuda natively on a GPU."""
import os

if os.environ.get("TRITIUM_KERNEL_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from gguf import GGMLQuantizationType as Q

import kernels
from kernels import kv_quant_ref as R

DEV = os.environ.get("TRITIUM_KERNEL_DEVICE", "cpu")
if DEV == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1 before triton is imported", allow_module_level=True)
if DEV == "cuda" and not torch.cuda.is_available():
    pytest.skip("TRITIUM_KERNEL_DEVICE=cuda without a GPU", allow_module_level=True)

OPS = kernels.Backend("triton")


def _x(seed: int, T: int, KVH: int, D: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, KVH, D, generator=g) * 2
    x[0, 0, :32] = 0  # an all-zero block
    x[1, 0, 3] = -x[1, 0, :32].abs().max()  # a tie of the largest |x|, the first negative
    x[2, 1, 32:64] = -0.75  # a constant block
    return x


@pytest.mark.parametrize("t", R.KV_QUANT_TYPES, ids=lambda t: t.name)
def test_write_quantizes_as_llama_cpp(t):
    """Every quantized block as the reference writes it (IQ4_NL: the same values within the float32
    rounding of its refitted scale, whose sums the kernel forms as a tree)."""
    T, KVH, D, NB, BS = 4, 2, 64, 3, 4
    x = _x(int(t), T, KVH, D)
    slots = torch.tensor([5, -1, 0, 11])
    rb = R.row_bytes(t, D)
    got = torch.full((NB, BS, KVH, rb), 0xAB, dtype=torch.uint8, device=DEV)
    want = torch.full((NB, BS, KVH, rb), 0xAB, dtype=torch.uint8)
    vf = torch.zeros(NB, BS, KVH, D, dtype=torch.float16, device=DEV)
    OPS.write_kv(x.to(DEV), x.to(DEV), got, vf, slots.to(DEV), k_type=t, v_type=None)
    R.write_kv(x, x, want, torch.zeros(NB, BS, KVH, D, dtype=torch.float16), slots, k_type=t)
    got = got.cpu()
    assert torch.equal(vf.cpu().view(NB * BS, KVH, D)[slots[slots >= 0]], x[slots >= 0].half())
    assert torch.equal(got.view(NB * BS, -1)[1], want.view(NB * BS, -1)[1])  # an unwritten cell kept its bytes
    if t != Q.IQ4_NL:
        assert torch.equal(got, want)
    else:
        a = R.dequantize_rows(got, t)
        b = R.dequantize_rows(want, t)
        amax = x.abs().amax()
        assert (a - b).abs().max().item() <= 2e-3 * amax.item()
        assert (got != want).float().mean().item() < 0.02


@pytest.mark.parametrize("kt,vt", [(Q.Q8_0, Q.Q8_0), (Q.Q4_0, Q.Q4_1), (Q.Q5_0, Q.Q5_1), (Q.IQ4_NL, None),
                                   (None, Q.Q8_0)], ids=lambda t: getattr(t, "name", "f16"))
def test_paged_attention_reads_quantized_caches(kt, vt):
    """A decode batch (split-K, soft-capping) and a mixed one (prefill kernel, sliding window), GQA,
    shuffled block tables: against float64 attention over the same dequantized caches (the kernel's own
    roundings: the query and the dequantized tiles in float16, as the f16 cache path)."""
    g = torch.Generator().manual_seed(11)
    KVH, H, D, BS, NB = 2, 4, 64, 8, 20
    x = torch.randn(NB * BS, 2, KVH, D, generator=g)

    def cache(i, t):
        if t is None:
            return x[:, i].half().reshape(NB, BS, KVH, D)
        return R.quantize_rows(x[:, i], t).reshape(NB, BS, KVH, -1)

    kc, vc = cache(0, kt), cache(1, vt)
    bt = torch.randperm(NB, generator=g).to(torch.int32)[:18].reshape(3, 6)
    kf, vf = R.cache_floats(kc, kt).double(), R.cache_floats(vc, vt).double()
    for q_lens, lens, window, softcap in (([1, 1, 1], [48, 3, 21], 0, 3.0), ([3, 1, 6], [30, 44, 6], 9, 0.0)):
        q = torch.randn(sum(q_lens), H, D, generator=g)
        cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
        got = OPS.paged_attention(q.to(DEV), kc.to(DEV), vc.to(DEV), bt.to(DEV), cu.to(DEV),
                                  torch.tensor(lens, dtype=torch.int32, device=DEV), 0.125, softcap,
                                  window=window, k_type=kt, v_type=vt).cpu()
        for s in range(3):
            keys = torch.cat([kf[b] for b in bt[s].long()])[:lens[s]]
            vals = torch.cat([vf[b] for b in bt[s].long()])[:lens[s]]
            for j in range(q_lens[s]):
                pos = lens[s] - q_lens[s] + j
                lo = max(0, pos - window + 1) if window else 0
                row = q[cu[s] + j].double().reshape(KVH, H // KVH, D)
                sc = torch.einsum("kgd,tkd->kgt", row, keys[lo:pos + 1]) * 0.125
                if softcap:
                    sc = softcap * torch.tanh(sc / softcap)
                ref = torch.einsum("kgt,tkd->kgd", torch.softmax(sc, -1), vals[lo:pos + 1]).reshape(H, D)
                err = (got[cu[s] + j].double() - ref).abs().max().item()
                assert err < 1e-2, (q_lens, lens, window, softcap, s, j, err)
