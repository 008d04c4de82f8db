"""Decoder forward for llama / mistral / qwen2 / qwen3 / qwen3moe / gemma / gemma2 / gemma3 / phi3 / qwen35 /
smollm3 / mistral3 / gpt-oss over the paged KV cache.

One `forward` call processes a batch of sequences of different lengths (prefill chunks and
single decode tokens mixed): their new tokens are concatenated into one [T] row of tokens, every
matmul runs once over all T rows (weights read once per step), and attention goes through
`paged_attention` with per-sequence block tables. Every op comes from the model's kernel backend
(`kernels.Backend`, chosen from the device). What differs between architectures (embedding scale,
GeGLU, post-norms, soft-caps, sliding windows, per-layer RoPE bases) is plain data from
`runtime.model.arch.spec_for(cfg)`; a mixture-of-experts FFN (qwen3moe) is `runtime.model.arch.qwen3moe.MoeFFN`
(gpt-oss: `runtime.model.arch.gptoss.GptOssMoE`); a layer's attention sinks and output bias are read
when the file has them (gpt-oss). What an architecture computes differently goes through its module in
runtime/model/arch/ (gemma4's attention block and layer fields, mistral3's q temperature, smollm3's
NoPE layers). The step's host inputs are built in `runtime.model.step`; RoPE frequencies (YaRN
included) come from `runtime.model.rope`.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from types import SimpleNamespace

import torch

import kernels
from kernels.qweight import QWeight
from runtime.model.arch import moe_class, spec_for
from runtime.model.arch.qwen3moe import MoeFFN
from runtime.model.arch.gptoss import GptOssMoE
from runtime.model.arch import gemma4, mistral3, smollm3
from runtime.model.arch.qwen35 import LinearAttention, SharedExpertMoE, recurrent_shape
from runtime.model.recurrent import RecurrentStore
from runtime.model.arch.qwenvl import mrope, pair_sections
from runtime.model import media as mm
from runtime.model.kv_store import KeyRotation, KVStore
from runtime.model.lora import RowLora
from runtime.model.rope import rope_inv_freq, rope_mscale, rope_theta_scale  # noqa: F401 (re-exported)
from runtime.model.step import SeqBatch, StepTensors, build_step, recurrent_cells  # noqa: F401 (re-exported)


@dataclass
class Layer:
    attn_norm: torch.Tensor
    wqkv: list[QWeight]  # q, k, v as `kernels.prepare_weights` returns them (fused where it can)
    bqkv: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    wo: QWeight
    ffn_norm: torch.Tensor
    w_gate_up: list[QWeight]  # gate, up as `kernels.prepare_weights` returns them ([] with `moe`)
    w_down: QWeight | None  # None with `moe`
    post_attn_norm: torch.Tensor | None = None  # gemma2/3
    post_ffn_norm: torch.Tensor | None = None
    window: int = 0  # sliding window of this layer (0: global attention)
    inv_freq: torch.Tensor | None = None  # this layer's RoPE frequencies
    rope_theta_scale: float = 0.0  # ggml's angle chain (`rope_theta_scale`), 0: angles from inv_freq
    rope_mscale: float = 1.0  # cos and sin times it inside the rope (ggml's YaRN magnitude: `rope.rope_mscale`)
    moe: MoeFFN | SharedExpertMoE | GptOssMoE | None = None  # the FFN is a mixture of experts (qwen3moe, qwen35moe)
    linear: LinearAttention | None = None  # a gated linear-attention layer instead of attention (qwen35)
    # gemma4 (runtime/model/arch/gemma4.py): this layer's head size (0: the model's; smaller ones are
    # zero-padded to the store's), the layer whose cached K/V it reads (-1 / itself: its own; another:
    # it writes none), v is the k projection, its per-layer input, the factor on its output
    head_dim: int = 0
    kv_src: int = -1
    v_from_k: bool = False
    ple: gemma4.LayerInput | None = None
    out_scale: float = 1.0
    sinks: torch.Tensor | None = None  # [H] float32: attention sink logits (gpt-oss)
    bo: torch.Tensor | None = None  # [C]: attn_output's bias (gpt-oss)


def _matmul_rows(ops: kernels.Backend, x: torch.Tensor, ws: list[QWeight]) -> torch.Tensor:
    """x @ [W_0; W_1; ...]^T for weights kept fused or apart: [T, sum(rows)]."""
    if len(ws) == 1:
        return ops.qmatmul(x, ws[0])
    return torch.cat([ops.qmatmul(x, w) for w in ws], dim=1)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


RANK_HEAD_ARCHS = ("qwen3",)  # decoders whose `cls.output.weight` llama.cpp b1-0c1e570 loads (src/models/qwen3.cpp)


class Model:
    def __init__(self, loaded, device: str | torch.device = "cpu", unpack_budget: int | None = None,
                 pack_quantized: bool | None = None, backend: str | None = None, tp=None,
                 act_dtype: torch.dtype | None = None, numerics: kernels.Numerics | None = None):
        """On the CPU, quantized weights are repacked into exact integer tiles (`pack_quantized`,
        default: when the backend has that kernel). Otherwise they are dequantized once at load
        when their float32 size fits `unpack_budget` bytes (default: half the physical memory),
        or else stay in their block format and are dequantized on every matmul. `backend` forces
        a kernel backend ("torch" | "cpu" | "triton"; default: the device's). `tp`: this rank's
        `runtime.parallel.shard.TPShard` when `loaded` holds one shard of a tensor-parallel model.
        `act_dtype`: the residual stream and matmul inputs (default bfloat16 on CUDA: half the
        traffic of float32 and exact tensor-core products, float32 elsewhere); the output head
        runs in float32. `numerics`: the CPU kernels' float order, fixed in the backend (default
        `kernels.Numerics.GGML`, llama.cpp's; the engine passes its config's)."""
        cfg = loaded.config
        self.tp = tp
        self.cfg = cfg
        self.device = torch.device(device)
        self.ops = ops = kernels.Backend.for_device(self.device, backend, numerics)
        self.act_dtype = act_dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        w = loaded.weights
        dev = self.device
        quant_f32 = sum(4 * x.rows * x.cols for x in w.values() if isinstance(x, QWeight) and not x.is_float)
        if unpack_budget is None:
            unpack_budget = _physical_memory() // 2
        # CPU: quantized weights go into exact integer tiles when the backend's vectorized kernel
        # exists; only without it are they dequantized to float32 (if they fit)
        if pack_quantized is None:
            pack_quantized = ops.packs_quantized()
        self.packed_quantized = dev.type == "cpu" and quant_f32 > 0 and pack_quantized
        self.unpacked_quantized = dev.type == "cpu" and 0 < quant_f32 <= unpack_budget and not self.packed_quantized
        unpack = self.unpacked_quantized

        def t(name):
            x = w.get(name)
            return None if x is None else x.to(dev).float()

        def prep(x: QWeight) -> QWeight:  # a matmul weight, in the layout the device's kernels read fastest
            return ops.prepare_weight(x, unpack, self.packed_quantized)

        def q(name) -> QWeight:
            return prep(w[name].to(dev))

        def fused(names) -> list[QWeight]:  # weights reading one input, prepared together
            return ops.prepare_weights([w[n].to(dev) for n in names], unpack, self.packed_quantized)

        if "output.weight" in w:
            self.tok_embd = w["token_embd.weight"].to(dev)  # only gathered from: keep rows contiguous
            self.output = q("output.weight")
        else:  # tied: one matrix serves both
            self.tok_embd = self.output = q("token_embd.weight")
        self.output_norm = t("output_norm.weight")
        # a reranker's classification head (llama.cpp loads `cls.output` for qwen3 among the decoders)
        self.cls_out = q("cls.output.weight") if cfg.arch in RANK_HEAD_ARCHS and "cls.output.weight" in w else None
        self.spec = spec = spec_for(cfg)
        if spec.moe and tp is not None:
            raise ValueError(f"{cfg.arch}: tensor parallelism (-tp) is not supported for mixture-of-experts models")
        recurrent = cfg.recurrent_layers or [False] * cfg.n_layer
        if any(recurrent) and tp is not None:
            raise ValueError(f"{cfg.arch}: tensor parallelism (-tp) is not supported for hybrid linear-attention models")
        self.recurrent = recurrent_shape(cfg) if any(recurrent) else None
        self.inv_freq = rope_inv_freq(cfg).to(dev)
        self.layers: list[Layer] = []
        n_rec = 0
        for i in range(cfg.n_layer):
            p = f"blk.{i}."
            bias = [t(p + f"attn_{n}.bias") for n in "qkv"]
            bqkv = torch.cat(bias).to(self.act_dtype) if all(b is not None for b in bias) else None
            if spec.moe:
                ffn = dict(w_gate_up=[], w_down=None,
                           moe=moe_class(cfg).load(ops, w, p, cfg, dev, unpack, self.packed_quantized))
            else:
                ffn = dict(w_gate_up=fused([p + "ffn_gate.weight", p + "ffn_up.weight"]), w_down=q(p + "ffn_down.weight"))
            fields = dict(attn_norm=t(p + "attn_norm.weight"), bqkv=bqkv, q_norm=t(p + "attn_q_norm.weight"),
                          k_norm=t(p + "attn_k_norm.weight"), ffn_norm=t(p + "ffn_norm.weight"), **ffn,
                          post_attn_norm=t(p + "post_attention_norm.weight"), post_ffn_norm=t(p + "post_ffw_norm.weight"),
                          window=spec.window(i), inv_freq=self._layer_inv_freq(cfg, i),
                          sinks=t(p + "attn_sinks.weight"), bo=t(p + "attn_output.bias"),
                          rope_theta_scale=rope_theta_scale(cfg, spec.rope_bases[i] if spec.rope_bases and spec.window(i) else None),
                          rope_mscale=self._layer_mscale(cfg, i))
            if spec.v_norm:  # gemma4: q only on KV-shared layers, per-layer head sizes, RoPE, inputs
                fields.update(gemma4.layer_fields(cfg, w, p, i, dev, fused, q, prep, t))
            elif recurrent[i]:  # gated linear attention: no q/k/v, no KV
                fields.update(wqkv=[], wo=None, linear=LinearAttention.load(ops, w, p, cfg, n_rec, dev, unpack,
                                                                            self.packed_quantized))
                n_rec += 1
            else:
                fields.update(wqkv=fused([p + f"attn_{n}.weight" for n in "qkv"]), wo=q(p + "attn_output.weight"))
            if spec.nope and spec.nope[i]:  # smollm3's NoPE layers
                fields.update(smollm3.nope_fields(self.inv_freq))
            self.layers.append(Layer(**fields))
        self.rope_inv_freqs = [L.inv_freq for L in self.layers]  # per layer, for re-rotating cached keys
        self.n_head, self.n_head_kv, self.head_dim = cfg.n_head, cfg.n_head_kv, cfg.head_dim
        self.ple = None  # gemma4's per-layer token embeddings
        if spec.v_norm:
            self.head_dim = gemma4.store_head_dim(cfg)  # the KV store's (the largest)
            self.ple = gemma4.PerLayerEmbedding.load(cfg, w, dev, prep)
        self.n_ff = cfg.n_ff_exp if spec.moe else self.layers[0].w_down.cols
        self.eps = float(cfg.rms_eps)
        self.neox = bool(cfg.rope_neox)
        self.scale = spec.attn_scale if spec.attn_scale is not None else 1.0 / math.sqrt(self.head_dim)
        # None: full logits only (always with -tp: each rank holds a block of the head)
        self._topk_head = ops.prepare_topk_head(self.output) if tp is None else None
        self.n_vocab = self.output.rows if tp is None else tp.n_vocab
        self.n_embd = cfg.n_embd
        self.n_deepstack = getattr(cfg, "n_deepstack", 0)
        self.attn_temp = bool(getattr(cfg, "attn_temp_scale", 0.0))  # mistral3's temperature tuning of q
        secs = getattr(cfg, "rope_sections", None)  # M-RoPE (runtime/model/arch/qwenvl.py)
        self.rope_pairs = None if secs is None else pair_sections(secs, self.inv_freq.shape[0], cfg.rope_imrope)
        # pairs turned by the 4th position, which is 0 for text tokens too (llama.cpp): M-RoPE on every row
        self.rope_e = self.rope_pairs is not None and bool((self.rope_pairs == 3).any())
        self.adapters: list = []  # LoRA adapters (runtime.model.lora.LoraAdapter), attached at load
        self.decoder = self._fused_decoder()  # the CPU's one-loop decode step, where the model qualifies

    def _fused_decoder(self):
        """`kernels.fused_decoder` on the CPU for the layers' decode steps (not with -tp or experts;
        LoRA steps take the per-op path), else None."""
        s = self.spec
        if (self.device.type != "cpu" or self.tp is not None or s.moe or self.act_dtype != torch.float32 or self.rope_e
                or s.q_gate or s.v_norm or self.recurrent is not None or 2 * self.inv_freq.shape[0] != self.head_dim
                or self.attn_temp):
            return None
        if any(len(L.wqkv) != 1 or len(L.w_gate_up) != 1 for L in self.layers):
            return None
        layers = [kernels.DecoderLayer(L.attn_norm, L.wqkv[0], L.bqkv, L.q_norm, L.k_norm, L.inv_freq, L.wo,
                                       L.ffn_norm, L.w_gate_up[0], L.w_down, L.post_attn_norm, L.post_ffn_norm,
                                       L.window, L.rope_theta_scale, L.rope_mscale) for L in self.layers]
        shape = kernels.DecoderShape(self.n_head, self.n_head_kv, self.head_dim, self.n_embd, self.n_ff, self.eps,
                                     self.neox, float(self.scale), s.act, float(s.attn_softcap), s.prescale_q)
        return self.ops.fused_decoder(layers, shape)

    def _layer_inv_freq(self, cfg, i: int) -> torch.Tensor:
        """Local (sliding-window) layers may have their own RoPE base, unscaled (llama.cpp's
        rope_freq_base_train_swa / rope_freq_scale_train_swa = 1)."""
        if not self.spec.rope_bases or self.spec.window(i) == 0:
            return self.inv_freq
        local = SimpleNamespace(head_dim=cfg.head_dim, rope_freq_base=self.spec.rope_bases[i])
        return rope_inv_freq(local).to(self.device)

    def _layer_mscale(self, cfg, i: int) -> float:
        """ggml's factor on cos and sin for layer i (`rope.rope_mscale`); local layers with their own
        base are unscaled (llama.cpp: their freq_scale is rope_freq_scale_train_swa = 1)."""
        return rope_mscale(cfg, 1.0 if self.spec.rope_bases and self.spec.window(i) else None)

    def _softcap(self, logits: torch.Tensor) -> torch.Tensor:
        cap = self.spec.final_softcap
        if cap <= 0.0:
            return logits
        return torch.where(torch.isinf(logits), logits, cap * torch.tanh(logits / cap))

    def key_rotation(self) -> KeyRotation:  # how cached keys are re-rotated when they move (KVStore.move)
        return KeyRotation(self.rope_inv_freqs, self.neox, tuple(L.rope_theta_scale for L in self.layers), self.ops,
                           tuple(L.rope_mscale for L in self.layers))

    def new_kv_store(self, n_tokens: int, block_size: int = 16, dtype: torch.dtype = torch.float16,
                     type_k=None, type_v=None) -> KVStore:
        """K/V tensors for `n_tokens` positions; the serving room's `BlockManager` hands out its blocks.
        `type_k` / `type_v`: ggml types of the caches (-ctk / -ctv; default: `dtype`'s)."""
        nb = (n_tokens + block_size - 1) // block_size
        return KVStore(len(self.layers), self.n_head_kv, self.head_dim, nb, block_size, dtype, self.device,
                       rope=self.key_rotation(), type_k=type_k, type_v=type_v)

    def new_state(self, n_cells: int) -> RecurrentStore | None:
        """The recurrent state cells of a hybrid model (None for the others); the serving room
        hands them out (`SeqBatch.rs`)."""
        return None if self.recurrent is None else RecurrentStore(self.recurrent, n_cells, self.device)

    def _layers(self, kv: KVStore, ids_t: torch.Tensor, pos_t: torch.Tensor, slot_t: torch.Tensor,
                tables: torch.Tensor, cu: torch.Tensor, kv_lens_t: torch.Tensor,
                max_q_len: int | None, lora: RowLora | None = None,
                swa_slot_t: torch.Tensor | None = None, swa_tables: torch.Tensor | None = None,
                media: mm.StepMedia | None = None, rs: RecurrentStore | None = None,
                rs_cells: torch.Tensor | None = None) -> torch.Tensor:
        """Embedding and every layer for T new tokens (device tensors: ids/pos/slot [T], tables
        [S, max_blocks] int32, cu [S + 1] int32, kv_lens [S] int32); new K/V are written to their
        slots (negative: skipped). Returns the final residual stream [T, C]. With `max_q_len`
        given, no op waits on the device (what a CUDA graph capture needs). `swa_slot_t` /
        `swa_tables`: the slots and block tables of the sliding-window layers when the cache
        keeps them in its SWA pool (None: every layer uses `slot_t` / `tables`). `media`: rows taking
        media embeddings (runtime/model/media.py). `rs` / `rs_cells` [S]: the recurrent state and each
        sequence's cell (hybrid models' linear-attention layers)."""
        T = ids_t.shape[0]
        ops = self.ops
        h = self._embed(ids_t)  # [T, C]
        if self.spec.embed_scale != 1.0:
            h = h * self.spec.embed_scale
        h = h.to(self.act_dtype)
        if media is not None:
            h = mm.put_embeddings(h, media, self.n_embd)
        dec = self.decoder  # one query per sequence: the fused loop (same bits, kernels/cpu/decoder.py)
        if (dec is not None and lora is None and media is None and max_q_len == 1 and T == cu.shape[0] - 1
                and (dec.max_rows is None or T <= dec.max_rows) and kv.kv_types == (None, None)
                and dec.supports(kv.k, kv.v)):  # (quantized caches: the per-op path below)
            return dec(h, kv.k, kv.v, pos_t, slot_t, tables, kv_lens_t, kv.is_swa if swa_tables is not None else None,
                       swa_slot_t, swa_tables)
        act = ops.gelu_mul if self.spec.act == "gelu" else ops.silu_mul
        ple = self.ple(ops, ids_t, h) if self.ple is not None else None  # [T, n_layer, P] (gemma4)
        pos4 = media.pos4 if media is not None else None
        if pos4 is None and self.rope_e:  # text rows: (p, p, p, 0), as llama.cpp's M-RoPE input
            pos4 = torch.stack([pos_t, pos_t, pos_t, torch.zeros_like(pos_t)])
        residual = None
        for li, L in enumerate(self.layers):
            if residual is None:
                x, residual = ops.rms_norm(h, L.attn_norm, self.eps), h
            else:
                x, residual = ops.add_rms_norm(h, residual, L.attn_norm, self.eps)
            p = f"blk.{li}."
            if L.linear is not None:  # gated linear attention (runtime/model/arch/qwen35.py)
                h = L.linear(ops, x, rs.conv[L.linear.index], rs.ssm[L.linear.index], rs_cells, cu).to(x.dtype)
            else:
                h = self._attention(li, L, x, kv, pos_t, pos4, slot_t, tables, cu, kv_lens_t, max_q_len, lora,
                                    swa_slot_t, swa_tables, media)
            if self.tp is not None:  # row-parallel: partial sums of the ranks' heads
                self.tp.group.all_reduce(h)
            if L.post_attn_norm is not None:
                h = ops.rms_norm(h, L.post_attn_norm, self.eps)
            x, residual = ops.add_rms_norm(h, residual, L.ffn_norm, self.eps)
            if L.moe is not None:  # routed experts (no LoRA on them; no -tp)
                h = L.moe(ops, x)
            else:
                gu = _matmul_rows(ops, x, L.w_gate_up)  # [T, 2F]
                F = gu.shape[1] // 2  # (gemma4: per layer)
                if lora is not None:
                    lora.add(gu, x, [p + "ffn_gate.weight", p + "ffn_up.weight"], [F, F])
                gate, up = gu.split([F, F], dim=1)
                a = act(gate, up)
                h = ops.qmatmul(a, L.w_down)
                if lora is not None:
                    lora.add(h, a, [p + "ffn_down.weight"])
                if self.tp is not None:
                    self.tp.group.all_reduce(h)
            if L.post_ffn_norm is not None:
                h = ops.rms_norm(h, L.post_ffn_norm, self.eps)
            if L.ple is not None or L.out_scale != 1.0:  # gemma4: the per-layer input, the output's scale
                h, residual = h + residual, None
                if L.ple is not None:
                    h = L.ple(ops, h, ple[:, li], self.eps)
                if L.out_scale != 1.0:
                    h = h * L.out_scale
            if media is not None and li < self.n_deepstack:  # qwen3vl: the layer's output plus its deepstack input
                h, residual = h + residual, None
                h[media.rows] += mm.deepstack_rows(media, li, self.n_embd).to(h.dtype)
        return h if residual is None else h + residual  # [T, C] final residual stream

    def _attention(self, li: int, L: Layer, x: torch.Tensor, kv: KVStore, pos_t, pos4, slot_t, tables, cu, kv_lens_t,
                   max_q_len, lora, swa_slot_t, swa_tables, media) -> torch.Tensor:
        """One attention block of `_layers` on the normed input x [T, C] -> its output [T, C] (before
        the residual add; with -tp this rank's partial sum)."""
        T = x.shape[0]
        H, KVH, D = self.n_head, self.n_head_kv, L.head_dim or self.head_dim
        ops = self.ops
        QD = 2 * H * D if self.spec.q_gate else H * D  # qwen35: per head D query rows then D gate rows
        qkv = _matmul_rows(ops, x, L.wqkv)  # [T, (H + 2 KVH) D]
        p = f"blk.{li}."
        if self.spec.v_norm:  # gemma4: its own attention block
            return gemma4.attention(self, li, L, qkv, kv, pos_t, slot_t, tables, cu, kv_lens_t, max_q_len,
                                    swa_slot_t, swa_tables)
        if lora is not None:
            lora.add(qkv, x, [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"],
                     [QD, KVH * D, KVH * D])
        if L.bqkv is not None:
            qkv = qkv + L.bqkv
        q, k, v = qkv.split([QD, KVH * D, KVH * D], dim=1)
        gate = None
        if self.spec.q_gate:
            q, gate = q.reshape(T, H, 2, D).unbind(2)
            gate = gate.reshape(T, H * D)
        q = q.reshape(T, H, D)
        k = k.reshape(T, KVH, D)
        v = v.reshape(T, KVH, D)
        if L.q_norm is not None:
            q = ops.rms_norm(q.reshape(T * H, D), L.q_norm, self.eps).view(T, H, D)
            k = ops.rms_norm(k.reshape(T * KVH, D), L.k_norm, self.eps).view(T, KVH, D)
        own = swa_tables is not None and kv.is_swa[li]
        kt, vt = kv.kv_types  # quantized caches (-ctk / -ctv): their ggml types, else None
        slots = swa_slot_t if own else slot_t
        if pos4 is None and not kv.rot_k and not kv.rot_v:  # RoPE of q and k and the KV write: one op
            q = ops.rope_write_kv(q, k, v, pos_t, L.inv_freq, self.neox, L.rope_theta_scale, L.rope_mscale, kv.k[li],
                                  kv.v[li], slots, kt, vt)
        else:
            if pos4 is not None:
                q = mrope(ops, q, pos4, L.inv_freq, L.rope_theta_scale, self.rope_pairs, L.rope_mscale)
                k = mrope(ops, k, pos4, L.inv_freq, L.rope_theta_scale, self.rope_pairs, L.rope_mscale)
            elif L.q_norm is None and not self.spec.q_gate:  # q and k side by side in qkv: one rope call
                qk = ops.rope(qkv[:, :(H + KVH) * D].reshape(T, H + KVH, D), pos_t, L.inv_freq, self.neox,
                              L.rope_theta_scale, L.rope_mscale)
                q, k = qk[:, :H], qk[:, H:]
            else:
                q = ops.rope(q, pos_t, L.inv_freq, self.neox, L.rope_theta_scale, L.rope_mscale)
                k = ops.rope(k, pos_t, L.inv_freq, self.neox, L.rope_theta_scale, L.rope_mscale)
            if kv.rot_k:  # llama.cpp's Hadamard rotation of a quantized K (q alike, below)
                k = kernels.hadamard(k, kv.rot_k)
            if kv.rot_v:  # ... of a quantized V (the output rotated back, below)
                v = kernels.hadamard(v, kv.rot_v)
            ops.write_kv(k, v, kv.k[li], kv.v[li], slots, kt, vt)
        if self.attn_temp:  # mistral3: Llama 4's temperature tuning of q (after the K write)
            q = mistral3.temper(q, pos_t, self.cfg)
        if self.spec.prescale_q:  # llama.cpp's gemma graphs: ggml_scale(q), then attention at scale 1
            q = q * self.scale
        if kv.rot_k:
            q = kernels.hadamard(q, kv.rot_k).to(q.dtype)
        attn = ops.paged_attention(q, kv.k[li], kv.v[li], swa_tables if own else tables, cu, kv_lens_t,
                                   1.0 if self.spec.prescale_q else self.scale,
                                   self.spec.attn_softcap, max_q_len=max_q_len, window=L.window, sinks=L.sinks,
                                   k_type=kt, v_type=vt)
        if media is not None and media.spans:  # media rows seeing their whole chunk
            attn = mm.bidirectional_attention(ops, attn, q, kv.k[li], kv.v[li], swa_tables if own else tables, cu,
                                              kv_lens_t, media, 1.0 if self.spec.prescale_q else self.scale,
                                              self.spec.attn_softcap, L.window, kt, vt)
        if kv.rot_v:
            attn = kernels.hadamard(attn, kv.rot_v).to(attn.dtype)
        attn = attn.reshape(T, H * D)
        if gate is not None:
            attn = attn * ops.sigmoid(gate.float()).to(attn.dtype)
        h = ops.qmatmul(attn, L.wo)
        if lora is not None:
            lora.add(h, attn, [p + "attn_output.weight"])
        if L.bo is not None:
            h = h + L.bo.to(h.dtype)  # (no -tp with experts: the bias is added once)
        return h

    def decode_logits(self, kv: KVStore, ids_t: torch.Tensor, pos_t: torch.Tensor, slot_t: torch.Tensor,
                      tables: torch.Tensor, cu: torch.Tensor, kv_lens_t: torch.Tensor,
                      swa_slot_t: torch.Tensor | None = None, swa_tables: torch.Tensor | None = None) -> torch.Tensor:
        """One new token per sequence (B rows, cu = arange(B + 1)): full logits [B, V] float32,
        with no host synchronisation and no per-call Python state, so that it can be captured in
        a CUDA graph (`runtime.model.cuda_graphs`). n_tokens of the sequences is not touched."""
        h = self._layers(kv, ids_t, pos_t, slot_t, tables, cu, kv_lens_t, 1, None, swa_slot_t, swa_tables)
        return self._head(self.ops.rms_norm(h, self.output_norm, self.eps))

    def _embed(self, ids_t: torch.Tensor) -> torch.Tensor:
        """Token embeddings [T, C]; with -tp each rank looks up the ids of its vocabulary block and
        the all-reduce assembles the rows."""
        if self.tp is None:
            return self.ops.embedding(ids_t, self.tok_embd)
        v0, v1 = self.tp.vocab
        local = ids_t - v0
        mine = (local >= 0) & (local < v1 - v0)
        h = self.ops.embedding(torch.where(mine, local, torch.zeros_like(local)), self.tok_embd).float()
        h = h * mine.unsqueeze(1)
        return self.tp.group.all_reduce(h)

    def rank_scores(self, h: torch.Tensor) -> torch.Tensor:
        """llama.cpp's RANK pooling head (build_pooling): pooled normed states h [S, C] -> [S, L]
        float32, the score being column 0: through `cls.output` and a softmax over its L labels
        (qwen3's "yes"/"no"), else the state itself (a model without a head: its first value)."""
        if self.cls_out is None:
            return h.float()
        return torch.softmax(self.ops.qmatmul(h.float(), self.cls_out).float(), dim=-1)

    def _head(self, hs: torch.Tensor) -> torch.Tensor:
        """Logits [R, n_vocab] float32 of normed hidden states [R, C]; with -tp each rank computes
        its vocabulary block and they are gathered; soft-capped where the architecture says."""
        logits = self.ops.qmatmul(hs.float(), self.output).float()
        if self.tp is not None:
            pad = self.tp.vocab_chunk - logits.shape[1]
            if pad:
                logits = torch.nn.functional.pad(logits, (0, pad))
            logits = self.tp.group.all_gather_cols(logits, self.n_vocab)
        return self._softcap(logits)

    @torch.inference_mode()
    def forward(self, kv: KVStore, batch: list[SeqBatch],
                rs: RecurrentStore | None = None) -> tuple[torch.Tensor | None, list[torch.Tensor | None]]:
        """Run the batch; returns (logits [n_rows_with_logits, n_vocab] float32 in batch order,
        hidden states per sequence ([n_new, C] or None)). New K/V go to the blocks the rows' tables name
        (reserved beforehand: `BlockManager.reserve`); the tables are only read (n_tokens is the
        caller's to advance once the step is done, `ModelRunner.run`). Hybrid models: `rs` (default:
        the store's, `kv.rs`) holds each sequence's state in its cell `SeqBatch.rs` (default: `seq.rs`;
        the state after its first n_past tokens; a sequence starting at 0 starts from zeros), left
        there after the step."""
        step = build_step(kv, batch, self.rope_pairs is not None)
        if self.recurrent is not None:
            rs = rs if rs is not None else getattr(kv, "rs", None)  # the store's (KVStore.rs)
            step.rs_cells = recurrent_cells(batch, rs, self.cfg.arch)
        if self.tp is not None:
            self.tp.group.send(("forward", step))  # the other ranks run the same step on their shards
        wants = [b for b in batch if b.logits]
        topk = None
        if any(b.topk > 0 for b in wants):  # one entry per logits row
            topk = ([b.topk for b in wants for _ in range(b.n_logits)], [b.banned for b in wants for _ in range(b.n_logits)])
        lora = None  # LoRA rows (runtime/model/lora.py); not with -tp (bootstrap refuses the pair)
        if self.adapters:
            lora = RowLora.build(self.adapters, [b.lora for b in batch], [len(b.tokens) for b in batch], self.device)
        logits, hn = self.run_step(kv, step, topk, lora, rs)
        hidden: list[torch.Tensor | None] = []
        cu = step.cu.tolist()
        for b, s, e in zip(batch, cu[:-1], cu[1:]):
            hidden.append(hn[s:e].float() if b.hidden else None)
        return logits, hidden

    def run_step(self, kv: KVStore, step: "StepTensors", topk=None, lora: RowLora | None = None,
                 rs: RecurrentStore | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The computation of `forward` on prepared host tensors: (logits of `step.rows`, normed
        hidden states [T, C] when `step.need_hidden`). Every rank of a tensor-parallel model runs it
        for every step. `topk`: (k per row, banned ids per row) where only the top k must be exact."""
        dev = self.device
        T = step.ids.shape[0]
        h = self._layers(kv, step.ids.to(dev), step.pos.to(dev), step.slots.to(dev), step.tables.to(dev),
                         step.cu.to(dev), step.kv_lens.to(dev), step.max_q_len, lora,
                         None if step.swa_slots is None else step.swa_slots.to(dev),
                         None if step.swa_tables is None else step.swa_tables.to(dev),
                         None if step.media is None else step.media.to(dev), rs,
                         None if step.rs_cells is None else step.rs_cells.to(dev))
        logits = None
        if step.rows:
            hs = h[torch.tensor(step.rows, device=dev)] if len(step.rows) != T else h
            hs = self.ops.rms_norm(hs, self.output_norm, self.eps).float()
            out_lora = lora.select(step.rows) if lora is not None and lora.has("output.weight") else None
            if out_lora is None and self._topk_head is not None and topk is not None:  # exact only where it matters
                logits = self._softcap(self.ops.topk_logits(hs, self.output, self._topk_head, topk[0], topk[1]))
            else:
                logits = self._head(hs)
                if out_lora is not None:
                    out_lora.add(logits, hs, ["output.weight"])
        hn = self.ops.rms_norm(h, self.output_norm, self.eps) if step.need_hidden else None
        return logits, hn
