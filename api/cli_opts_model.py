"""llama-server's options of common/arg.cpp (b1-0c1e570), second part: pooling, RoPE/YaRN, KV cache
types, slots, multimodal, loading, devices and offload, LoRA and control vectors, the model and
where it comes from (arg.cpp lines 2312-3080, in their order).
"""
from __future__ import annotations

import argparse
import os
import re

from api.cli_spec import (Effect, Exit, Invalid, Kind, Section, checked, is_falsey, is_truthy, nothing, opt,
                          log_err, log_warn, parse_csv_row, stof, stoi, stoull, store, string_split, string_strip, warn)

N, P = Effect.NO_EFFECT, Effect.PENDING
SV = Section.SERVER
LLAMA_MAX_DEVICES = 16
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

DEFAULTS = dict(
    pooling="", rope_scaling=None, rope_freq_base=None, rope_freq_scale=None, yarn_orig_ctx=None,
    yarn_ext_factor=None, yarn_attn_factor=None, yarn_beta_slow=None, yarn_beta_fast=None,
    cache_type_k="f16", cache_type_v="f16", parallel=-1, mmproj=None, mmproj_url=None, mmproj_auto=True,
    mmproj_offload=True, mmproj_device=None, image_min_tokens=-1, image_max_tokens=-1, device="auto",
    device_list=None, split_mode="layer", tensor_split=None, override_kv=[], lora=[], control_vectors=[],
    alias=None, tags=None, model=None, model_url=None, docker_repo=None, hf_repo=None, hf_file=None,
    hf_token=None,
)


def gpu_visible() -> bool:
    """Whether a CUDA device is there, without importing torch (what llama_supports_gpu_offload
    answers on a CUDA build; the reference build is CPU-only)."""
    from runtime.launch.preload import nvidia_present

    return nvidia_present()


def _choice(values: tuple[str, ...]):
    def check(v: str) -> str:
        if v not in values:
            raise Invalid("invalid value")
        return v
    return check


def kv_cache_type(v: str) -> str:
    if v not in KV_CACHE_TYPES:
        raise Invalid(f"Unsupported cache type: {v}")
    return v


def _parallel(ns: argparse.Namespace, v: int) -> None:
    if v == 0:
        raise Invalid("error: invalid value for n_parallel\n")
    ns.parallel = v


def device_names() -> list[str]:
    """The offload devices this machine has, as ggml names them (CUDA0, ...); none on a CPU."""
    if not gpu_visible():
        return []
    n = len([d for d in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", d)]) or 1
    return [f"CUDA{i}" for i in range(n)]


def parse_device_list(value: str) -> list[str]:
    """parse_device_list: "none", or known offload devices (the CPU is none of them)."""
    names = string_split(value, ",")
    if names == ["none"]:
        return []
    known = device_names()
    for d in names:
        if d not in known:
            raise Invalid(f"invalid device: {d}")
    return names


def _device(ns: argparse.Namespace, v: str) -> None:
    """-dev: llama-server's device list (none = the CPU, CUDA0 = cuda), or tritium's auto|cpu|cuda."""
    if v in ("auto", "cpu", "cuda"):
        ns.device = v
        return
    ns.device_list = parse_device_list(v)
    ns.device = "cuda" if ns.device_list else "cpu"


def _buffer_types() -> list[str]:
    """The buffer types -ot may name: the CPU's, and each CUDA device's (plus pinned host memory)."""
    cuda = device_names()
    return ["CPU"] + cuda + (["CUDA_Host"] if cuda else [])


def tensor_overrides(v: str) -> None:
    """parse_tensor_buffer_overrides: PATTERN=BUFFER_TYPE,... with a buffer type this build has."""
    types = _buffer_types()
    for item in string_split(v, ","):
        if "=" not in item:
            raise Invalid("invalid value")
        if item.split("=", 1)[1] not in types:
            print("Available buffer types:\n" + "".join(f"  {t}\n" for t in sorted(types)), end="", flush=True)
            raise Invalid("unknown buffer type")


def _non_negative(v: int) -> int:
    if v < 0:
        raise Invalid("invalid value")
    return v


def _no_gpu(what: str, flag: str = "") -> None:
    if gpu_visible():
        return
    if flag:
        warn(f"warning: no usable GPU found, {flag} option will be ignored\n"
             "warning: one possible reason is that llama.cpp was compiled without GPU support\n"
             "warning: consult docs/build.md for compilation instructions\n")
    else:
        warn(f"warning: llama.cpp was compiled without support for GPU offload. {what} has no effect.\n")


def gpu_layers(flag: str):
    def check(v: str) -> str:
        if v not in ("auto", "all"):
            stoi(v)
        _no_gpu("", flag)
        return v
    return check


def _split_mode(ns: argparse.Namespace, v: str) -> None:
    ns.split_mode = _choice(("none", "layer", "row", "tensor"))(v)
    _no_gpu("Setting the split mode")


def _split_list(v: str) -> list[str]:
    parts = [p for p in re.split(r"[,/]+", v)]
    while parts and parts[-1] == "":  # std::sregex_token_iterator drops a trailing empty match
        parts.pop()
    if len(parts) >= LLAMA_MAX_DEVICES:
        raise Invalid(f"got {len(parts)} input configs, but system only has {LLAMA_MAX_DEVICES} devices")
    return parts


def _tensor_split(ns: argparse.Namespace, v: str) -> None:
    ns.tensor_split = [stof(p) for p in _split_list(v)]
    _no_gpu("Setting a tensor split")


def _main_gpu(ns: argparse.Namespace, v: int) -> None:
    _no_gpu("Setting the main GPU")


def _fit(v: str) -> str:
    if is_truthy(v) or is_falsey(v):
        return v
    raise Invalid(f"error: unknown value for --fit: '{v}'\n")


def _fit_target(v: str) -> None:
    for p in _split_list(v):
        stoull(p)


def kv_override_error(item: str) -> str | None:
    """string_parse_kv_override's complaint about KEY=int|float|bool|str:VALUE, None when valid."""
    eq = item.find("=")
    if eq < 0 or eq >= 128:
        return f"string_parse_kv_override: malformed KV override '{item}'\n"
    rest = item[eq + 1:]
    if rest.startswith(("int:", "float:")):
        return None
    if rest.startswith("bool:"):
        ok = rest[5:] in ("true", "false")
        return None if ok else f"string_parse_kv_override: invalid boolean value for KV override '{item}'\n"
    if rest.startswith("str:"):
        ok = len(rest[4:].encode("utf-8", "surrogateescape")) <= 127
        return None if ok else (f"string_parse_kv_override: malformed KV override '{item}', value cannot exceed "
                                "127 chars\n")
    return f"string_parse_kv_override: invalid type for KV override '{item}'\n"


def _override_kv(ns: argparse.Namespace, v: str) -> None:
    for item in parse_csv_row(v):
        err = kv_override_error(item)
        if err is not None:
            log_err("string_parse_kv_override", err)
            raise Invalid(f"error: Invalid type for KV override: {item}\n")
        ns.override_kv = ns.override_kv + [item]


def _lora(ns: argparse.Namespace, v: str) -> None:
    ns.lora = ns.lora + [(item, 1.0) for item in parse_csv_row(v)]


def _lora_scaled(ns: argparse.Namespace, v: str) -> None:
    for item in parse_csv_row(v):
        parts = string_split(item, ":")
        if len(parts) != 2:
            raise Invalid("lora-scaled format: FNAME:SCALE")
        ns.lora = ns.lora + [(parts[0], stof(parts[1]))]


def _control_vector(ns: argparse.Namespace, v: str) -> None:
    ns.control_vectors = ns.control_vectors + parse_csv_row(v)


def _control_vector_scaled(ns: argparse.Namespace, v: str) -> None:
    for item in parse_csv_row(v):
        parts = string_split(item, ":")
        if len(parts) != 2:
            raise Invalid("control-vector-scaled format: FNAME:SCALE")
        stof(parts[1])
        ns.control_vectors = ns.control_vectors + [parts[0]]


def _csv_set(dest: str):
    """-a / --tags: comma-separated, stripped, empty ones dropped, added to a set."""
    def h(ns: argparse.Namespace, v: str) -> None:
        items = [string_strip(a) for a in string_split(v, ",")]
        old = getattr(ns, dest)
        setattr(ns, dest, ",".join(([old] if old else []) + [a for a in items if a]))
    return h


def _list_devices(ns: argparse.Namespace) -> None:
    raise Exit(0, stdout="Available devices:\n" + ("".join(f"  {d}\n" for d in device_names()) or "  (none)\n"))


def _rpc(v: str) -> None:
    raise Invalid("RPC not supported in this build")


def _mmdev(ns: argparse.Namespace, v: str) -> None:
    """-mmdev: none (the CPU) or one offload device."""
    if v != "none" and len(parse_device_list(v)) > 1:
        raise Invalid("only one device may be specified for mmproj")
    ns.mmproj_device = v


def _rope_scale(ns: argparse.Namespace, v: str) -> None:
    ns.rope_freq_scale = 1.0 / stof(v) if stof(v) else float("inf")


NO_GPU = "where weights live (tritium runs the whole model on --device): same output"
OPTIONS = [
    opt(("--pooling",), "{none,mean,cls,last,rank}", checked(_choice(("none", "mean", "cls", "last", "rank")),
                                                             "pooling"), env="LLAMA_ARG_POOLING", section=SV),
    opt(("--rope-scaling",), "{none,linear,yarn}", checked(_choice(("none", "linear", "yarn")), "rope_scaling"),
        env="LLAMA_ARG_ROPE_SCALING_TYPE"),
    opt(("--rope-scale",), "N", _rope_scale, env="LLAMA_ARG_ROPE_SCALE"),
    opt(("--rope-freq-base",), "N", store("rope_freq_base", stof), env="LLAMA_ARG_ROPE_FREQ_BASE"),
    opt(("--rope-freq-scale",), "N", store("rope_freq_scale", stof), env="LLAMA_ARG_ROPE_FREQ_SCALE"),
    opt(("--yarn-orig-ctx",), "N", store("yarn_orig_ctx"), kind=Kind.INT, env="LLAMA_ARG_YARN_ORIG_CTX"),
    opt(("--yarn-ext-factor",), "N", store("yarn_ext_factor", stof), env="LLAMA_ARG_YARN_EXT_FACTOR"),
    opt(("--yarn-attn-factor",), "N", store("yarn_attn_factor", stof), env="LLAMA_ARG_YARN_ATTN_FACTOR"),
    opt(("--yarn-beta-slow",), "N", store("yarn_beta_slow", stof), env="LLAMA_ARG_YARN_BETA_SLOW"),
    opt(("--yarn-beta-fast",), "N", store("yarn_beta_fast", stof), env="LLAMA_ARG_YARN_BETA_FAST"),
    opt(("-kvo", "--kv-offload"), None, nothing, neg=("-nkvo", "--no-kv-offload"), env="LLAMA_ARG_KV_OFFLOAD",
        effect=N, note="where the KV cache lives: same output"),
    opt(("--repack",), None, nothing, neg=("-nr", "--no-repack"), env="LLAMA_ARG_REPACK", effect=N,
        note="weight layout: same output"),
    opt(("--no-host",), None, nothing, env="LLAMA_ARG_NO_HOST", effect=N, note="buffer placement: same output"),
    opt(("-ctk", "--cache-type-k"), "TYPE", store("cache_type_k", kv_cache_type), env="LLAMA_ARG_CACHE_TYPE_K"),
    opt(("-ctv", "--cache-type-v"), "TYPE", store("cache_type_v", kv_cache_type), env="LLAMA_ARG_CACHE_TYPE_V"),
    opt(("-dt", "--defrag-thold"), "N", lambda ns, v: log_warn(
        "DEPRECATED: --defrag-thold is deprecated and no longer necessary to specify\n"),
        env="LLAMA_ARG_DEFRAG_THOLD", effect=N, note="deprecated in llama-server too"),
    opt(("-np", "--parallel"), "N", _parallel, kind=Kind.INT, env="LLAMA_ARG_N_PARALLEL", section=SV),
    opt(("-cb", "--cont-batching"), None, nothing, neg=("-nocb", "--no-cont-batching"), env="LLAMA_ARG_CONT_BATCHING",
        effect=N, section=SV, note="tritium always batches continuously: same output"),
    opt(("-mm", "--mmproj"), "FILE", store("mmproj"), env="LLAMA_ARG_MMPROJ", section=SV),
    opt(("-mmu", "--mmproj-url"), "URL", store("mmproj_url"), env="LLAMA_ARG_MMPROJ_URL", section=SV),
    opt(("--mmproj-auto",), None, store("mmproj_auto"), neg=("--no-mmproj", "--no-mmproj-auto"),
        env="LLAMA_ARG_MMPROJ_AUTO", section=SV),
    opt(("--mmproj-offload",), None, store("mmproj_offload"), neg=("--no-mmproj-offload",),
        env="LLAMA_ARG_MMPROJ_OFFLOAD", section=SV),
    opt(("-mmdev", "--mmproj-device"), "DEVICE", _mmdev, env="MTMD_BACKEND_DEVICE", section=SV),
    opt(("--image-min-tokens",), "N", store("image_min_tokens"), kind=Kind.INT, env="LLAMA_ARG_IMAGE_MIN_TOKENS",
        section=SV),
    opt(("--image-max-tokens",), "N", store("image_max_tokens"), kind=Kind.INT, env="LLAMA_ARG_IMAGE_MAX_TOKENS",
        section=SV),
    opt(("--mtmd-batch-max-tokens",), "N", nothing, kind=Kind.INT, env="LLAMA_ARG_MTMD_BATCH_MAX_TOKENS", effect=N,
        section=SV, note="how many image tokens one encoder batch takes: same embeddings"),
    opt(("--video-fps",), "N", checked(stof), env="LLAMA_ARG_VIDEO_FPS", effect=N, section=SV,
        note="video input is not decoded here"),
    opt(("--video-timestamp-interval",), "N", nothing, kind=Kind.INT, env="LLAMA_ARG_VIDEO_TIMESTAMP_INTERVAL",
        effect=N, section=SV, note="video input is not decoded here"),
    opt(("--video-ffmpeg-dir",), "DIR", nothing, env="LLAMA_ARG_VIDEO_FFMPEG_DIR", effect=N, section=SV,
        note="video input is not decoded here"),
    opt(("--rpc",), "SERVERS", checked(_rpc), env="LLAMA_ARG_RPC", effect=Effect.REMOVED,
        note="refused as by the reference build (no RPC backend)"),
    opt(("-lm", "--load-mode"), "MODE", checked(_choice(("auto", "none", "mmap", "mlock", "mmap+mlock", "dio"))),
        env="LLAMA_ARG_LOAD_MODE", effect=N, note="how the file is read: same weights"),
    opt(("-lzm", "--lazy-mode"), "MODE", checked(_choice(("on", "auto", "off"))), env="LLAMA_ARG_LAZY_MODE",
        effect=N, note="when tensors are read: same weights"),
    opt(("--numa",), "TYPE", checked(_choice(("distribute", "", "isolate", "numactl"))), env="LLAMA_ARG_NUMA",
        effect=N, note="thread placement: speed only"),
    opt(("-dev", "--device"), "<dev1,dev2,..>", _device, env="LLAMA_ARG_DEVICE"),
    opt(("--list-devices",), None, _list_devices, effect=Effect.EXIT),
    opt(("-ot", "--override-tensor"), "<tensor name pattern>=<buffer type>,...", checked(tensor_overrides),
        env="LLAMA_ARG_OVERRIDE_TENSOR", effect=N, note=NO_GPU),
    opt(("-cmoe", "--cpu-moe"), None, nothing, env="LLAMA_ARG_CPU_MOE", effect=N, note=NO_GPU),
    opt(("-ncmoe", "--n-cpu-moe"), "N", checked(_non_negative), kind=Kind.INT, env="LLAMA_ARG_N_CPU_MOE", effect=N,
        note=NO_GPU),
    opt(("-ncffn", "--n-cpu-ffn"), "N", checked(_non_negative), kind=Kind.INT, env="LLAMA_ARG_N_CPU_FFN", effect=N,
        note=NO_GPU),
    opt(("-ngl", "--gpu-layers", "--n-gpu-layers"), "N", checked(gpu_layers("--gpu-layers")),
        env="LLAMA_ARG_N_GPU_LAYERS", effect=N, note=NO_GPU),
    opt(("-sm", "--split-mode"), "{none,layer,row,tensor}", _split_mode, env="LLAMA_ARG_SPLIT_MODE",
        note="row with -ts A,B,... splits the model across ranks as -tp does; other modes: same output"),
    opt(("-ts", "--tensor-split"), "N0,N1,N2,...", _tensor_split, env="LLAMA_ARG_TENSOR_SPLIT",
        note="with -sm row: one rank per non-zero share"),
    opt(("-mg", "--main-gpu"), "INDEX", _main_gpu, kind=Kind.INT, env="LLAMA_ARG_MAIN_GPU", effect=N, note=NO_GPU),
    opt(("-fit", "--fit"), "[on|off]", checked(_fit), env="LLAMA_ARG_FIT", effect=N,
        note="tritium does not shrink -c to fit device memory"),
    opt(("-fitt", "--fit-target"), "MiB0,MiB1,MiB2,...", checked(_fit_target), env="LLAMA_ARG_FIT_TARGET", effect=N,
        note="see --fit"),
    opt(("-fitc", "--fit-ctx"), "N", nothing, kind=Kind.INT, env="LLAMA_ARG_FIT_CTX", effect=N, note="see --fit"),
    opt(("--check-tensors",), None, nothing, effect=N, note="a valid model computes the same"),
    opt(("--override-kv",), "KEY=TYPE:VALUE,...", _override_kv, effect=P,
        startup=lambda ns: "--override-kv (model metadata overrides) is not supported yet", note="metadata overrides"),
    opt(("--op-offload",), None, nothing, neg=("--no-op-offload",), effect=N, note=NO_GPU),
    opt(("--lora",), "FNAME", _lora),
    opt(("--lora-scaled",), "FNAME:SCALE,...", _lora_scaled),
    opt(("--control-vector",), "FNAME", _control_vector, effect=P, note="control vectors",
        startup=lambda ns: "control vectors are not supported yet"),
    opt(("--control-vector-scaled",), "FNAME:SCALE,...", _control_vector_scaled, effect=P, note="control vectors",
        startup=lambda ns: "control vectors are not supported yet"),
    opt(("--control-vector-layer-range",), "START", lambda ns, a, b: (stoi(a), stoi(b)) and None, hint2="END",
        effect=P, note="control vectors", startup=lambda ns: "control vectors are not supported yet"),
    opt(("-a", "--alias"), "STRING", _csv_set("alias"), env="LLAMA_ARG_ALIAS", section=SV),
    opt(("--tags",), "STRING", _csv_set("tags"), env="LLAMA_ARG_TAGS", section=SV),
    opt(("-m", "--model"), "FNAME", store("model"), env="LLAMA_ARG_MODEL"),
    opt(("-mu", "--model-url"), "MODEL_URL", store("model_url"), env="LLAMA_ARG_MODEL_URL", effect=P,
        note="model downloads from a URL", startup=lambda ns: "downloading a model from a URL (-mu) is not "
                                                              "supported yet: use -hf or -m" if ns.model_url else None),
    opt(("-dr", "--docker-repo"), "[<repo>/]<model>[:quant]", store("docker_repo"), env="LLAMA_ARG_DOCKER_REPO",
        effect=P, note="Docker Hub models", startup=lambda ns: "Docker Hub models (-dr) are not supported yet: "
                                                               "use -hf or -m" if ns.docker_repo else None),
    opt(("-hf", "-hfr", "--hf-repo"), "<user>/<model>[:quant]", store("hf_repo"), env="LLAMA_ARG_HF_REPO"),
    opt(("-hff", "--hf-file"), "FILE", store("hf_file"), env="LLAMA_ARG_HF_FILE"),
    opt(("-hft", "--hf-token"), "TOKEN", store("hf_token"), env="HF_TOKEN"),
]
