"""Start-up decisions (runtime/serving/bootstrap.py) that need no model: the environment read into
the config, and the slot / context layout of -c, -np and -kvu."""
from __future__ import annotations

from runtime.serving import EngineConfig
from types import SimpleNamespace

import torch

import kernels

from runtime.serving.bootstrap import CPU_UBATCH_MIN, resolve_config, runner_ubatch, slot_layout


def test_cuda_graph_mode_comes_from_the_config_else_the_environment(monkeypatch):
    monkeypatch.delenv("TRITIUM_CUDA_GRAPHS", raising=False)
    cfg = EngineConfig()
    resolve_config(cfg)
    assert cfg.cuda_graphs == "1" and cfg.device == "cpu"
    monkeypatch.setenv("TRITIUM_CUDA_GRAPHS", "eager")
    cfg = EngineConfig()
    resolve_config(cfg)
    assert cfg.cuda_graphs == "eager"
    cfg = EngineConfig(cuda_graphs="0")
    resolve_config(cfg)
    assert cfg.cuda_graphs == "0"  # an explicit setting wins over the environment


def test_numerics_come_from_the_config_else_the_environment(monkeypatch):
    """--numerics, else TRITIUM_FAST_NUMERICS (own when set, else llama.cpp's), read once here."""
    monkeypatch.delenv("TRITIUM_FAST_NUMERICS", raising=False)
    cfg = EngineConfig()
    resolve_config(cfg)
    assert cfg.numerics is kernels.Numerics.GGML
    monkeypatch.setenv("TRITIUM_FAST_NUMERICS", "1")
    cfg = EngineConfig()
    resolve_config(cfg)
    assert cfg.numerics is kernels.Numerics.OWN
    cfg = EngineConfig(numerics="ggml")
    resolve_config(cfg)
    assert cfg.numerics is kernels.Numerics.GGML  # an explicit setting wins over the environment


def test_numerics_flag():
    from api.cli_args import build_parser

    assert build_parser().parse_args([]).numerics is None  # as the environment says
    assert build_parser().parse_args(["--numerics", "own"]).numerics == "own"
    assert kernels.Numerics(build_parser().parse_args(["--numerics", "ggml"]).numerics) is kernels.Numerics.GGML


def test_slot_layout():
    assert slot_layout(EngineConfig(n_ctx=4096, n_parallel=-1), 32768) == (4096, 4, True, 4096)
    assert slot_layout(EngineConfig(n_ctx=4096, n_parallel=2), 32768) == (4096, 2, False, 2048)
    assert slot_layout(EngineConfig(n_ctx=4096, n_parallel=2, kv_unified=True), 32768) == (4096, 2, True, 4096)
    assert slot_layout(EngineConfig(n_ctx=0, n_parallel=0), 2048) == (2048, 1, False, 2048)
    # llama_context's padding (GGML_PAD 256) of n_ctx and of each sequence's share, then n_ctx = np x that
    # (llama-server b1-0c1e570 -c 1000 -np 3: n_ctx 1536, n_ctx_slot 512)
    assert slot_layout(EngineConfig(n_ctx=1000, n_parallel=3), 32768) == (1536, 3, False, 512)
    assert slot_layout(EngineConfig(n_ctx=1000, n_parallel=-1), 32768) == (1024, 4, True, 1024)
    assert slot_layout(EngineConfig(n_ctx=100, n_parallel=1), 32768) == (256, 1, False, 256)
    assert slot_layout(EngineConfig(n_ctx=0, n_parallel=2), 1000) == (1024, 2, False, 512)
    # a slot's context: capped by --kv-unified-per-slot and by the training context (n_ctx_slot())
    assert slot_layout(EngineConfig(n_ctx=2000, n_parallel=2, kv_unified=True, kv_unified_per_slot=700), 32768) \
        == (2048, 2, True, 700)
    assert slot_layout(EngineConfig(n_ctx=4096, n_parallel=1), 512) == (4096, 1, False, 512)


def test_context_log_lines_are_llama_servers():
    from runtime.serving.bootstrap import log_context

    lines: list[tuple[str, str]] = []
    log_context(EngineConfig(n_ctx=1000, n_parallel=3), 32768, lambda lv, m: lines.append((lv, m)))
    assert ("W", "llama_context: n_ctx is not divisible by n_seq_max - rounding down to 1536") in lines
    assert ("D", "llama_context: n_ctx_seq             = 512") in lines
    lines.clear()
    log_context(EngineConfig(n_ctx=4096, n_parallel=1), 512, lambda lv, m: lines.append((lv, m)))
    assert ("W", "llama_context: n_ctx_seq (4096) > n_ctx_train (512) -- possible training context overflow") in lines
    assert ("W", "srv    load_model: the slot context (4096) exceeds the training context of the model (512) - "
                 "capping") in lines
    assert not any("rounding down" in m for _, m in lines)


def test_cpu_micro_batches_are_capped_by_the_model_size_whatever_ub_says():
    """In the kernels' own numerics (under llama.cpp's the micro-batch is -ub: its float order
    depends on the rows per forward, kernels/README.md); the numerics are the model's backend's."""
    def on(device, numerics):
        return SimpleNamespace(device=torch.device(device), ops=kernels.Backend.for_device(device, "torch", numerics))

    cpu, cuda = on("cpu", kernels.Numerics.GGML), on("cuda", kernels.Numerics.OWN)
    qwen05b, q15b = 491_400_064, 1_117_318_368
    assert runner_ubatch(EngineConfig(n_ubatch=512), cpu, qwen05b) == 512
    assert runner_ubatch(EngineConfig(n_ubatch=2048), cpu, q15b) == 2048
    cpu = on("cpu", kernels.Numerics.OWN)
    assert runner_ubatch(EngineConfig(n_ubatch=512), cpu, qwen05b) == CPU_UBATCH_MIN == 256
    assert runner_ubatch(EngineConfig(n_ubatch=512), cpu, q15b) == 512
    assert runner_ubatch(EngineConfig(n_ubatch=2048), cpu, q15b) == 512  # one row per 2 MiB, in 64s
    assert runner_ubatch(EngineConfig(n_ubatch=64), cpu, qwen05b) == 64
    assert runner_ubatch(EngineConfig(n_ubatch=512), cuda, qwen05b) == 512  # the device's memory is not the host's
