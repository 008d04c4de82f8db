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
