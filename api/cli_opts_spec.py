"""llama-server's options of common/arg.cpp (b1-0c1e570), last part: speculative decoding, the
removed draft options and the model presets (arg.cpp lines 3974-4730, in their order), then
tritium's own options (no llama-server spelling).

Speculative decoding changes how fast tokens come, not which: llama-server's drafts are verified
by the target model, so greedy outputs are the same, and sampled ones come from the same
distributions. The draft-free types (--spec-type ngram-simple, ngram-map-k, ngram-map-k4v,
ngram-mod, their --spec-ngram-* sizes, --spec-default, and the draft sizes --spec-draft-n-max/min)
take effect (runtime/serving/spec.py, settings built by api.cli.spec_config), and so does a draft
model (-md FILE --spec-type draft-simple, --spec-draft-p-min, -ctkd / -ctvd:
runtime/serving/spec_draft.py); the draft model's placement options (threads, CPU masks, devices,
GPU layers) are parsed and checked as llama-server checks them and have no effect (the draft runs
on the target's device and threads); the others (-hfd, --spec-synth-*) are ignored with a warning.
"""
from __future__ import annotations

import argparse

from api.cli_opts_general import cpu_mask, cpu_range
from api.cli_opts_model import gpu_layers, kv_cache_type, parse_device_list, tensor_overrides
from api.cli_spec import Effect, Invalid, Kind, Section, opt, stod, stof, store, string_split, string_strip

N, SP = Effect.NO_EFFECT, Section.SPEC
SPEC_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-simple",
              "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
SPEC_NOTE = "same tokens without it (not supported by tritium: ignored, a warning says so)"
PLACE_NOTE = "the draft model runs on the target model's device and threads (checked as llama-server checks it)"
DRAFT_NOTE = ("draft-model speculative decoding (-md FILE with --spec-type draft-simple): greedy tokens the same as "
              "without it, sampled ones from the same distributions")
DRAFT_FREE_NOTE = ("speculative decoding (ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache, draft-simple with -md; the "
                   "other types are ignored with a warning): greedy tokens the same as without it")

# the draft-free types' settings (runtime/spec_config.py, built by api.cli.spec_config)
SPEC_DEFAULTS = dict(spec_type=[], spec_draft_n_max=3, spec_draft_n_min=0, spec_draft_model=None, spec_draft_p_min=0.0,
                     spec_draft_type_k="f16", spec_draft_type_v="f16", spec_ngram_mod_n_min=48,
                     spec_ngram_mod_n_max=64, spec_ngram_mod_n_match=24,
                     **{f"spec_ngram_{k}_{f}": v for k in ("simple", "map_k", "map_k4v")
                        for f, v in (("size_n", 12), ("size_m", 48), ("min_hits", 1))})
DEFAULTS = dict(**SPEC_DEFAULTS, speculative=False, max_body_size=32 << 20, header_timeout=10.0, shutdown_timeout=5.0,
                tensor_parallel_size=None, numerics=None)


def _spec(check=None):
    """A speculative option's handler: its check, then the mark that prints the warning."""
    def h(ns: argparse.Namespace, *values) -> None:
        if check is not None:
            check(*values)
        ns.speculative = True
    return h


def _accept(check=None):
    """A draft model placement option: checked as llama-server checks it, no effect."""
    def h(ns: argparse.Namespace, *values) -> None:
        if check is not None:
            check(*values)
    return h


def _range(lo: int, hi: int | None, message: str):
    def check(v: int) -> None:
        if v < lo or (hi is not None and v > hi):
            raise Invalid(message)
    return check


def _min0(v: int) -> None:
    if v < 0:
        raise Invalid("invalid value")


def _prio03(v: int) -> None:
    if v < 0 or v > 3:
        raise Invalid("invalid value")


def _synth_len(v: str) -> None:
    text = string_strip(v)
    length, pos = stod(text)
    if pos != len(text) or length == -1.0:
        raise Invalid("invalid value")


def _synth_rates(v: str) -> None:
    for raw in string_split(v, ","):
        text = string_strip(raw)
        _, pos = stod(text)
        if pos != len(text):
            raise Invalid("invalid value")


def _spec_types(v: str) -> None:
    for name in string_split(v, ","):
        if name not in SPEC_TYPES:
            raise Invalid("unknown speculative type: " + name)
        if name == "none":
            return


def _set(dest: str, check):
    """A draft-free speculative option: checked as llama-server checks it, then stored."""
    def h(ns: argparse.Namespace, v) -> None:
        check(v)
        setattr(ns, dest, v)
    return h


def _add_types(ns: argparse.Namespace, v: str) -> None:
    _spec_types(v)
    ns.spec_type = [*ns.spec_type, v]


def _spec_default(ns: argparse.Namespace) -> None:
    """--spec-default: ngram-mod with n_match 24, n_min 48, n_max 64 (arg.cpp)."""
    ns.spec_type = [*ns.spec_type, "ngram-mod"]
    ns.spec_ngram_mod_n_match, ns.spec_ngram_mod_n_min, ns.spec_ngram_mod_n_max = 24, 48, 64


def _removed(message: str):
    def h(ns: argparse.Namespace, v: int) -> None:
        raise Invalid("the argument has been removed. " + message)
    return h


def _preset(**fields):
    """A --*-default preset: the model from the Hugging Face Hub and its settings."""
    def h(ns: argparse.Namespace) -> None:
        for k, v in fields.items():
            setattr(ns, k, v)
    return h


def _tp(ns: argparse.Namespace, v: int) -> None:
    ns.tensor_parallel_size = v


def _numerics(v: str) -> str:
    if v not in ("ggml", "own"):
        raise Invalid("invalid value")
    return v


def _float(v: str) -> float:
    return stof(v)


_FIM = dict(port=8012, ubatch_size=1024, batch_size=1024, ctx_size=0, cache_reuse=256)
_GPT_OSS = dict(port=8013, ubatch_size=2048, batch_size=32768, parallel=2, ctx_size=131072 * 2, temp=1.0, top_p=1.0,
                top_k=0, min_p=0.01, jinja=True)
OPTIONS = [
    opt(("--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft"), "<user>/<model>[:quant]", _spec(),
        env="LLAMA_ARG_SPEC_DRAFT_HF_REPO", section=SP, effect=N, note=SPEC_NOTE),
    opt(("--spec-draft-threads", "-td", "--threads-draft"), "N", _accept(), kind=Kind.INT, section=SP, effect=N,
        note=PLACE_NOTE),
    opt(("--spec-draft-threads-batch", "-tbd", "--threads-batch-draft"), "N", _accept(), kind=Kind.INT, section=SP,
        effect=N, note=PLACE_NOTE),
    opt(("--spec-draft-cpu-mask", "-Cd", "--cpu-mask-draft"), "M", _accept(cpu_mask), section=SP, effect=N,
        note=PLACE_NOTE),
    opt(("--spec-draft-cpu-range", "-Crd", "--cpu-range-draft"), "lo-hi", _accept(cpu_range), section=SP, effect=N,
        note=PLACE_NOTE),
    opt(("--spec-draft-cpu-strict", "--cpu-strict-draft"), "<0|1>", _accept(), kind=Kind.INT, section=SP, effect=N,
        note=PLACE_NOTE),
    opt(("--spec-draft-prio", "--prio-draft"), "N", _accept(_prio03), kind=Kind.INT, section=SP, effect=N,
        note=PLACE_NOTE),
    opt(("--spec-draft-poll", "--poll-draft"), "<0|1>", _accept(), kind=Kind.INT, section=SP, effect=N, note=PLACE_NOTE),
    opt(("--spec-draft-cpu-mask-batch", "-Cbd", "--cpu-mask-batch-draft"), "M", _accept(cpu_mask), section=SP,
        effect=N, note=PLACE_NOTE),
    opt(("--spec-draft-cpu-strict-batch", "--cpu-strict-batch-draft"), "<0|1>", _accept(), kind=Kind.INT, section=SP,
        effect=N, note=PLACE_NOTE),
    opt(("--spec-draft-prio-batch", "--prio-batch-draft"), "N", _accept(_prio03), kind=Kind.INT, section=SP, effect=N,
        note=PLACE_NOTE),
    opt(("--spec-draft-poll-batch", "--poll-batch-draft"), "<0|1>", _accept(), kind=Kind.INT, section=SP, effect=N,
        note=PLACE_NOTE),
    opt(("--spec-draft-type-k", "-ctkd", "--cache-type-k-draft"), "TYPE", store("spec_draft_type_k", kv_cache_type),
        env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K", note=DRAFT_NOTE),
    opt(("--spec-draft-type-v", "-ctvd", "--cache-type-v-draft"), "TYPE", store("spec_draft_type_v", kv_cache_type),
        env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V", note=DRAFT_NOTE),
    opt(("--spec-draft-override-tensor", "-otd", "--override-tensor-draft"),
        "<tensor name pattern>=<buffer type>,...", _accept(tensor_overrides), section=SP, effect=N, note=PLACE_NOTE),
    opt(("--spec-draft-cpu-moe", "-cmoed", "--cpu-moe-draft"), None, lambda ns: None,
        env="LLAMA_ARG_SPEC_DRAFT_CPU_MOE", section=SP, effect=N, note=PLACE_NOTE),
    opt(("--spec-draft-n-cpu-moe", "--spec-draft-ncmoe", "-ncmoed", "--n-cpu-moe-draft"), "N", _accept(_min0),
        kind=Kind.INT, env="LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE", section=SP, effect=N, note=PLACE_NOTE),
    opt(("--spec-draft-n-max",), "N", _set("spec_draft_n_max", _min0), kind=Kind.INT, env="LLAMA_ARG_SPEC_DRAFT_N_MAX",
        section=SP, note=DRAFT_FREE_NOTE),
    opt(("--spec-draft-n-min",), "N", _set("spec_draft_n_min", lambda v: None), kind=Kind.INT,
        env="LLAMA_ARG_SPEC_DRAFT_N_MIN", section=SP, note=DRAFT_FREE_NOTE),
    opt(("--spec-synth-len",), "L", _spec(_synth_len), env="LLAMA_ARG_SPEC_SYNTH_LEN", section=SP, effect=N,
        note=SPEC_NOTE),
    opt(("--spec-synth-rates",), "P0,P1,...", _spec(_synth_rates), env="LLAMA_ARG_SPEC_SYNTH_RATES", section=SP,
        effect=N, note=SPEC_NOTE),
    opt(("--spec-draft-p-split", "--draft-p-split"), "P", _accept(stof), env="LLAMA_ARG_SPEC_DRAFT_P_SPLIT", section=SP,
        effect=N, note="llama-server's draft-simple does not read it either"),
    opt(("--spec-draft-p-min", "--draft-p-min"), "P", store("spec_draft_p_min", stof), env="LLAMA_ARG_SPEC_DRAFT_P_MIN",
        section=SP, note=DRAFT_NOTE),
    opt(("--spec-draft-backend-sampling",), None, _accept(), neg=("--no-spec-draft-backend-sampling",),
        env="LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING", section=SP, effect=N, note=PLACE_NOTE),
    opt(("--spec-draft-device", "-devd", "--device-draft"), "<dev1,dev2,..>", _accept(parse_device_list), section=SP,
        effect=N, note=PLACE_NOTE),
    opt(("--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"), "N",
        _accept(gpu_layers("--gpu-layers-draft")), env="LLAMA_ARG_N_GPU_LAYERS_DRAFT", section=SP, effect=N,
        note=PLACE_NOTE),
    opt(("--spec-draft-model", "-md", "--model-draft"), "FNAME", store("spec_draft_model"),
        env="LLAMA_ARG_SPEC_DRAFT_MODEL", section=SP, note=DRAFT_NOTE),
    opt(("--spec-type",), ",".join(SPEC_TYPES), _add_types, env="LLAMA_ARG_SPEC_TYPE", section=SP, note=DRAFT_FREE_NOTE),
    opt(("--spec-ngram-mod-n-min",), "N",
        _set("spec_ngram_mod_n_min", _range(0, 1024, "ngram n-min must be between 0 and 1024 inclusive")),
        kind=Kind.INT, section=SP, note=DRAFT_FREE_NOTE),
    opt(("--spec-ngram-mod-n-max",), "N",
        _set("spec_ngram_mod_n_max", _range(0, 1024, "ngram n-max must be between 0 and 1024 inclusive")),
        kind=Kind.INT, section=SP, note=DRAFT_FREE_NOTE),
    opt(("--spec-ngram-mod-n-match",), "N",
        _set("spec_ngram_mod_n_match", _range(1, 1024, "ngram size N must be between 1 and 1024 inclusive")),
        kind=Kind.INT, section=SP, note=DRAFT_FREE_NOTE),
]
for _name in ("simple", "map-k", "map-k4v"):
    _d = "spec_ngram_" + _name.replace("-", "_")
    OPTIONS += [
        opt((f"--spec-ngram-{_name}-size-n",), "N",
            _set(_d + "_size_n", _range(1, 1024, "ngram size N must be between 1 and 1024 inclusive")), kind=Kind.INT,
            section=SP, note=DRAFT_FREE_NOTE),
        opt((f"--spec-ngram-{_name}-size-m",), "N",
            _set(_d + "_size_m", _range(1, 1024, "ngram size M must be between 1 and 1024 inclusive")), kind=Kind.INT,
            section=SP, note=DRAFT_FREE_NOTE),
        opt((f"--spec-ngram-{_name}-min-hits",), "N", _set(_d + "_min_hits", _range(1, None, "ngram min hits must be at least 1")),
            kind=Kind.INT, section=SP, note=DRAFT_FREE_NOTE),
    ]
OPTIONS += [
    opt(("--draft", "--draft-n", "--draft-max"), "N", _removed("use --spec-draft-n-max or --spec-ngram-mod-n-max"),
        kind=Kind.INT, env="LLAMA_ARG_DRAFT_MAX", section=SP, effect=Effect.REMOVED),
    opt(("--draft-min", "--draft-n-min"), "N", _removed("use --spec-draft-n-min or --spec-ngram-mod-n-min"),
        kind=Kind.INT, env="LLAMA_ARG_DRAFT_MIN", section=SP, effect=Effect.REMOVED),
    opt(("--spec-ngram-size-n",), "N", _removed("use the respective --spec-ngram-*-size-n"), kind=Kind.INT,
        section=SP, effect=Effect.REMOVED),
    opt(("--spec-ngram-size-m",), "N", _removed("use the respective --spec-ngram-*-size-m"), kind=Kind.INT,
        section=SP, effect=Effect.REMOVED),
    opt(("--spec-ngram-min-hits",), "N", _removed("use the respective --spec-ngram-*-min-hits"), kind=Kind.INT,
        section=SP, effect=Effect.REMOVED),
    # presets
    opt(("--embd-gemma-default",), None, _preset(
        hf_repo="ggml-org/embeddinggemma-300M-qat-q4_0-GGUF", hf_file="embeddinggemma-300M-qat-Q4_0.gguf", port=8011,
        ubatch_size=2048, batch_size=2048, parallel=32, ctx_size=2048 * 32, embeddings=True), section=Section.SERVER),
    opt(("--fim-qwen-1.5b-default",), None, _preset(
        hf_repo="ggml-org/Qwen2.5-Coder-1.5B-Q8_0-GGUF", hf_file="qwen2.5-coder-1.5b-q8_0.gguf", **_FIM),
        section=Section.SERVER),
    opt(("--fim-qwen-3b-default",), None, _preset(
        hf_repo="ggml-org/Qwen2.5-Coder-3B-Q8_0-GGUF", hf_file="qwen2.5-coder-3b-q8_0.gguf", **_FIM),
        section=Section.SERVER),
    opt(("--fim-qwen-7b-default",), None, _preset(
        hf_repo="ggml-org/Qwen2.5-Coder-7B-Q8_0-GGUF", hf_file="qwen2.5-coder-7b-q8_0.gguf", **_FIM),
        section=Section.SERVER),
    opt(("--fim-qwen-7b-spec",), None, _preset(
        hf_repo="ggml-org/Qwen2.5-Coder-7B-Q8_0-GGUF", hf_file="qwen2.5-coder-7b-q8_0.gguf", speculative=True, **_FIM),
        section=Section.SERVER, note="the 0.5B draft model is not fetched (" + SPEC_NOTE + ")"),
    opt(("--fim-qwen-14b-spec",), None, _preset(
        hf_repo="ggml-org/Qwen2.5-Coder-14B-Q8_0-GGUF", hf_file="qwen2.5-coder-14b-q8_0.gguf", speculative=True,
        **_FIM), section=Section.SERVER, note="the 0.5B draft model is not fetched (" + SPEC_NOTE + ")"),
    opt(("--fim-qwen-30b-default",), None, _preset(
        hf_repo="ggml-org/Qwen3-Coder-30B-A3B-Instruct-Q8_0-GGUF", hf_file="qwen3-coder-30b-a3b-instruct-q8_0.gguf",
        **_FIM), section=Section.SERVER),
    opt(("--gpt-oss-20b-default",), None, _preset(
        hf_repo="ggml-org/gpt-oss-20b-GGUF", hf_file="gpt-oss-20b-mxfp4.gguf", **_GPT_OSS), section=Section.SERVER),
    opt(("--gpt-oss-120b-default",), None, _preset(hf_repo="ggml-org/gpt-oss-120b-GGUF", **_GPT_OSS),
        section=Section.SERVER),
    opt(("--vision-gemma-4b-default",), None, _preset(hf_repo="ggml-org/gemma-3-4b-it-qat-GGUF", port=8014,
                                                      ctx_size=0, jinja=True),
        section=Section.SERVER),  # -hf brings the repository's projector along (--mmproj-auto)
    opt(("--vision-gemma-12b-default",), None, _preset(hf_repo="ggml-org/gemma-3-12b-it-qat-GGUF", port=8014,
                                                       ctx_size=0, jinja=True),
        section=Section.SERVER),
    opt(("--spec-default",), None, _spec_default, section=Section.SERVER, note=DRAFT_FREE_NOTE),
]
# tritium's own (llama-server has none of these spellings)
T = Section.TRITIUM
OPTIONS += [
    opt(("-tp", "--tensor-parallel-size"), "N", _tp, kind=Kind.INT, section=T,
        note="split the model across N ranks (torch.distributed: gloo on the CPU, NCCL on CUDA); started here on one "
             "machine, or by torchrun across machines (`-sm row -ts A,B,...` asks for the same)"),
    opt(("--numerics",), "{ggml,own}", store("numerics", _numerics), section=T,
        note="the CPU kernels' float order: ggml = llama.cpp's, bit for bit where they have it (llama-server's "
             "logits), own = their own (faster on the quantized matmuls); default: own when TRITIUM_FAST_NUMERICS "
             "is set, else ggml"),
    opt(("--max-body-size",), "BYTES", store("max_body_size"), kind=Kind.INT, section=T,
        note="largest request body accepted; a larger one is a 413 (0 = no limit; default: 33554432)"),
    opt(("--header-timeout",), "N", store("header_timeout", _float), section=T,
        note="seconds a client may take to send a request's headers (0 = no limit; default: 10)"),
    opt(("--shutdown-timeout",), "N", store("shutdown_timeout", _float), section=T,
        note="on SIGTERM, seconds running requests get to finish before they are ended (default: 5)"),
]
