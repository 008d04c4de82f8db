"""Start-up decisions (runtime/serving/bootstrap.py) that need no model: the environment read into
the config, and the slot / context layout of -c, -np and -kvu."""
from __future__ import annotations

from runtime.serving import EngineConfig
from runtime.serving.bootstrap import resolve_config, slot_layout


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


def test_slot_layout():
    assert slot_layout(EngineConfig(n_ctx=4096, n_parallel=-1), 32768) == (4096, 4, True, 4096)
    assert slot_layout(EngineConfig(n_ctx=4096, n_parallel=2), 32768) == (4096, 2, False, 2048)
    assert slot_layout(EngineConfig(n_ctx=4096, n_parallel=2, kv_unified=True), 32768) == (4096, 2, True, 4096)
    assert slot_layout(EngineConfig(n_ctx=0, n_parallel=0), 2048) == (2048, 1, False, 2048)
