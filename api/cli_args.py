"""`tritium-server`'s flags: llama-server's command line as an argparse parser.

`build_parser()` is the whole of it; api/cli.py turns the parsed flags into the server's and the
engine's configs. Flags llama-server has that change nothing here are accepted (`_NO_EFFECT`),
those of speculative decoding with a warning (`_SPECULATIVE`), and those tritium does not implement
are refused with llama-server's `error while handling argument` (`_UNSUPPORTED`).
"""
from __future__ import annotations

import argparse

from api import cli_net
from runtime.chat import REASONING_FORMATS
from runtime.tasks import SamplingParams

POOLING = ("none", "mean", "cls", "last", "rank")


class ArgError(Exception):
    def __init__(self, flag: str, message: str):
        super().__init__(f'error while handling argument "{flag}": {message}')


def build_parser() -> argparse.ArgumentParser:
    d = SamplingParams()
    p = argparse.ArgumentParser(
        prog="tritium-server", allow_abbrev=False,
        description="A llama-server compatible LLM inference server (OpenAI-compatible and native endpoints).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("model and context")
    g.add_argument("-m", "--model", default=None, metavar="FNAME",
                   help="model path (GGUF file or Hugging Face folder); without it a built-in tiny model is used")
    g.add_argument("-hf", "-hfr", "--hf-repo", dest="hf_repo", default=None, metavar="<user>/<model>[:quant]",
                   help="Hugging Face model repository; quant is optional, case-insensitive, default to Q4_K_M, "
                        "or falls back to the first file in the repo if Q4_K_M doesn't exist")
    g.add_argument("-hff", "--hf-file", dest="hf_file", default=None, metavar="FILE",
                   help="Hugging Face model file; overrides the quant in --hf-repo")
    g.add_argument("-hft", "--hf-token", dest="hf_token", default=None, metavar="TOKEN",
                   help="Hugging Face access token (default: value from HF_TOKEN environment variable)")
    g.add_argument("--offline", action="store_true", help="offline mode: forces use of cache, prevents network access")
    # one list for both, in command-line order (llama.cpp appends to one list of adapters)
    g.add_argument("--lora", dest="lora", action="append", default=[], type=lambda v: ("--lora", v), metavar="FNAME",
                   help="path to LoRA adapter (use comma-separated values to load multiple adapters)")
    g.add_argument("--lora-scaled", dest="lora", action="append", type=lambda v: ("--lora-scaled", v),
                   metavar="FNAME:SCALE,...",
                   help="path to LoRA adapter with user defined scaling (format: FNAME:SCALE,...)")
    g.add_argument("--lora-init-without-apply", action="store_true",
                   help="load LoRA adapters without applying them (apply later via POST /lora-adapters)")
    g.add_argument("-a", "--alias", default=None,
                   help="model name aliases, comma-separated; the first in sorted order names the model in responses")
    g.add_argument("-c", "--ctx-size", type=int, default=4096, metavar="N",
                   help="size of the prompt context, 0 = loaded from the model")
    g.add_argument("-np", "--parallel", type=int, default=-1, metavar="N",
                   help="number of server slots (-1 = auto: 4 slots sharing a unified KV cache)")
    g.add_argument("-kvu", "--kv-unified", action="store_true", default=False,
                   help="use a single unified KV buffer shared by all slots")
    g.add_argument("--swa-full", action="store_true", default=False,
                   help="use full-size SWA cache (sliding-window layers keep every position, as the others)")
    g.add_argument("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints", type=int, default=32, metavar="N",
                   dest="ctx_checkpoints",
                   help="max number of context checkpoints per slot (sliding-window models: prompt batches end "
                        "where llama-server saves them, and a reused prompt resumes from the last one; 0 = none)")
    g.add_argument("-n", "--n-predict", type=int, default=-1, metavar="N",
                   help="number of tokens to predict (-1 = until end of generation or context)")
    g.add_argument("-t", "--threads", type=int, default=-1, metavar="N", help="CPU threads (-1 = torch default)")
    g.add_argument("-tp", "--tensor-parallel-size", type=int, default=None, metavar="N",
                   help="split the model across N ranks (torch.distributed: gloo on the CPU, NCCL on CUDA); "
                        "started here on one machine, or by torchrun across machines "
                        "(`-sm row -ts A,B,...` asks for the same, one rank per non-zero share)")
    g.add_argument("-dev", "--device", default="auto", type=_device, metavar="{auto,cpu,cuda}",
                   help="where the model runs (auto = cuda when available); llama-server's device lists are "
                        "understood too: none = cpu, CUDA0 = cuda")
    g.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", default=None, metavar="N",
                   help="accepted for compatibility; the whole model runs on --device")
    g.add_argument("--numerics", default=None, choices=("ggml", "own"),
                   help="the CPU kernels' float order: ggml = llama.cpp's, bit for bit where they have it "
                        "(llama-server's logits), own = their own (faster on the quantized matmuls); "
                        "default: own when TRITIUM_FAST_NUMERICS is set, else ggml")

    g = p.add_argument_group("sampling defaults")
    g.add_argument("--temp", type=float, default=d.temperature, metavar="N", help="temperature")
    g.add_argument("--top-k", type=int, default=d.top_k, metavar="N", help="top-k sampling (0 = disabled)")
    g.add_argument("--top-p", type=float, default=d.top_p, metavar="N", help="top-p sampling (1.0 = disabled)")
    g.add_argument("--min-p", type=float, default=d.min_p, metavar="N", help="min-p sampling (0.0 = disabled)")
    g.add_argument("--typical", type=float, default=d.typical_p, metavar="N", help="locally typical sampling p")
    g.add_argument("-s", "--seed", type=int, default=-1, metavar="SEED", help="RNG seed (-1 = random)")
    g.add_argument("--repeat-penalty", type=float, default=d.repeat_penalty, metavar="N",
                   help="penalize repeated tokens (1.0 = disabled)")
    g.add_argument("--repeat-last-n", type=int, default=d.repeat_last_n, metavar="N",
                   help="last n tokens to penalize (0 = disabled, -1 = ctx size)")
    g.add_argument("--presence-penalty", type=float, default=d.presence_penalty, metavar="N")
    g.add_argument("--frequency-penalty", type=float, default=d.frequency_penalty, metavar="N")
    g.add_argument("--samplers", default=None, metavar="SAMPLERS",
                   help="samplers in order, separated by ';' (default: " + ";".join(d.samplers) + ")")
    g.add_argument("--min-keep", type=int, default=d.min_keep, metavar="N")
    g.add_argument("-l", "--logit-bias", action="append", default=[], metavar="TOKEN_ID(+/-)BIAS",
                   help="a default logit bias, e.g. 15043+1 or 15043-1 (repeatable; a request's logit_bias replaces them)")
    g.add_argument("--mirostat", type=int, default=d.mirostat, metavar="N",
                   help="Mirostat sampling (0 = disabled, 1 = Mirostat, 2 = Mirostat 2.0; other samplers then unused)")
    g.add_argument("--mirostat-lr", type=float, default=d.mirostat_eta, metavar="N", help="Mirostat learning rate, eta")
    g.add_argument("--mirostat-ent", type=float, default=d.mirostat_tau, metavar="N", help="Mirostat target entropy, tau")
    g.add_argument("--top-nsigma", "--top-n-sigma", type=float, default=d.top_n_sigma, metavar="N")
    g.add_argument("--xtc-probability", type=float, default=d.xtc_probability, metavar="N")
    g.add_argument("--xtc-threshold", type=float, default=d.xtc_threshold, metavar="N")
    g.add_argument("--dynatemp-range", type=float, default=d.dynatemp_range, metavar="N")
    g.add_argument("--dynatemp-exp", type=float, default=d.dynatemp_exponent, metavar="N")
    g.add_argument("--dry-multiplier", type=float, default=d.dry_multiplier, metavar="N")
    g.add_argument("--dry-base", type=float, default=d.dry_base, metavar="N")
    g.add_argument("--dry-allowed-length", type=int, default=d.dry_allowed_length, metavar="N")
    g.add_argument("--dry-penalty-last-n", type=int, default=d.dry_penalty_last_n, metavar="N")
    g.add_argument("--ignore-eos", action="store_true", help="ignore end of generation tokens by default")
    g.add_argument("--grammar", default=None, metavar="GRAMMAR",
                   help="GBNF grammar for every request that brings no grammar or json_schema of its own")
    g.add_argument("--grammar-file", default=None, metavar="FNAME", help="file holding that GBNF grammar")
    g.add_argument("-j", "--json-schema", default=None, metavar="SCHEMA",
                   help="JSON schema for every request that brings no grammar or json_schema of its own")
    g.add_argument("-jf", "--json-schema-file", default=None, metavar="FNAME", help="file holding that JSON schema")

    g = p.add_argument_group("server")
    g.add_argument("--port", type=int, default=8080, help="port to listen on")
    g.add_argument("--api-key", default=None, metavar="KEY", help="API key(s), comma-separated")
    g.add_argument("--api-key-file", default=None, metavar="FNAME", help="file with one API key per line")
    g.add_argument("--timeout", "-to", type=int, default=600, metavar="N", help="HTTP keep-alive timeout in seconds")
    g.add_argument("--max-body-size", type=int, default=32 << 20, metavar="BYTES",
                   help="largest request body accepted; a larger one is a 413 (tritium; 0 = no limit)")
    g.add_argument("--header-timeout", type=float, default=10.0, metavar="N",
                   help="seconds a client may take to send a request's headers (tritium; 0 = no limit)")
    g.add_argument("--shutdown-timeout", type=float, default=5.0, metavar="N",
                   help="on SIGTERM, seconds running requests get to finish before they are ended (tritium)")
    g.add_argument("--metrics", action="store_true", help="enable the Prometheus /metrics endpoint")
    g.add_argument("--ui", "--webui", dest="ui", action="store_true", default=True, help="serve the web chat page at /")
    g.add_argument("--no-ui", "--no-webui", dest="ui", action="store_false", help="no web chat page")
    g.add_argument("--slots", dest="slots", action="store_true", default=True, help="enable the /slots endpoint")
    g.add_argument("--no-slots", dest="slots", action="store_false", help="disable the /slots endpoint")
    g.add_argument("--props", action="store_true", help="allow changing global properties with POST /props")
    g.add_argument("--slot-save-path", default=None, metavar="PATH", help="directory for slot KV cache files")
    g.add_argument("--sse-ping-interval", type=float, default=30.0, metavar="N",
                   help="seconds between SSE keep-alive comments while a stream is idle (0 = off)")
    g.add_argument("-lv", "--verbosity", "--log-verbosity", type=int, default=3, metavar="N",
                   help="log verbosity (3 = info, 4 = debug)")
    g.add_argument("-v", "--verbose", action="store_true", help="log everything (verbosity 4)")

    g = p.add_argument_group("prompt caching")
    g.add_argument("--cache-ram", "-cram", type=int, default=8192, metavar="N",
                   help="RAM prompt cache size limit in MiB (-1 = no limit, 0 = disabled)")
    g.add_argument("--cache-idle-slots", dest="cache_idle_slots", action="store_true", default=True,
                   help="save idle slots to the prompt cache on new task, and clear them when using unified KV "
                        "(default: enabled, requires cache-ram)")
    g.add_argument("--no-cache-idle-slots", dest="cache_idle_slots", action="store_false")
    g.add_argument("--sleep-idle-seconds", type=_sleep_seconds, default=-1, metavar="SECONDS",
                   help="number of seconds of idleness after which the server will sleep (-1 = disabled)")
    g.add_argument("--cache-reuse", type=int, default=0, metavar="N",
                   help="min chunk size to reuse from the cache via KV shifting (0 = disabled)")
    g.add_argument("--slot-prompt-similarity", "-sps", type=float, default=0.10, metavar="N",
                   help="how much a prompt must match a slot's cache to use that slot (0.0 = disabled)")

    g = p.add_argument_group("embeddings")
    g.add_argument("--embeddings", "--embedding", action="store_true",
                   help="restrict the server to embedding endpoints")
    g.add_argument("--pooling", default="", choices=POOLING, help="pooling type for embeddings (default: the model's)")
    g.add_argument("--rerank", "--reranking", dest="reranking", action="store_true",
                   help="enable reranking endpoint on server (default: disabled): embeddings with RANK pooling")
    g.add_argument("--embd-normalize", type=int, default=2, metavar="N",
                   help="embedding normalization (-1 none, 0 max absolute, 1 taxicab, 2 euclidean, >2 p-norm)")

    g = p.add_argument_group("chat templates and reasoning")
    g.add_argument("--jinja", dest="jinja", action="store_true", default=True, help="use the Jinja chat template engine")
    g.add_argument("--no-jinja", dest="jinja", action="store_false", help="disable Jinja templates (no tool calls)")
    g.add_argument("--chat-template", default=None, metavar="JINJA_TEMPLATE",
                   help="chat template name or Jinja source (default: the model's)")
    g.add_argument("--chat-template-file", default=None, metavar="FNAME", help="file holding a Jinja chat template")
    g.add_argument("--reasoning-format", "-rf", default="auto", choices=REASONING_FORMATS,
                   help="where reasoning text goes: none keeps it in content, deepseek puts it in reasoning_content")
    g.add_argument("--reasoning-budget", type=int, default=-1, metavar="N",
                   help="thinking tokens allowed (-1 = unlimited, 0 = end thinking at once)")
    g.add_argument("--reasoning", "-rea", default=None, choices=("on", "off", "auto"),
                   help="set enable_thinking for every request")
    _add_llama_server_flags(p)
    cli_net.add_net_flags(p)
    return p


def _device(v: str) -> str:
    """--device: tritium's auto|cpu|cuda, or a llama-server device list (none, CUDA0, ...)."""
    low = v.strip().lower()
    if low in ("auto", "cpu", "cuda"):
        return low
    if low in ("none", ""):
        return "cpu"
    if low.startswith("cuda"):
        return "cuda"
    raise argparse.ArgumentTypeError(f"unknown device {v!r} (auto, cpu, cuda, none, CUDA0)")


# llama-server flags that tritium accepts without a change in what it computes (memory mapping,
# NUMA, batch threads, multi-GPU splits, web UI, logging cosmetics, ...): (names, takes a value)
_NO_EFFECT = [
    (("-tb", "--threads-batch"), True), (("-fa", "--flash-attn"), True), (("-cb", "--cont-batching"), False),
    (("-nocb", "--no-cont-batching"), False), (("--mlock",), False), (("--mmap",), False),
    (("--no-mmap",), False), (("--numa",), True), (("-sm", "--split-mode"), True), (("-mg", "--main-gpu"), True),
    (("-ts", "--tensor-split"), True), (("-fit", "--fit"), True), (("-dt", "--defrag-thold"), True),
    (("--threads-http",), True), (("--keep",), True), (("--context-shift",), False),
    (("--no-context-shift",), False),
    (("--spm-infill",), False),
    (("--no-prefill-assistant",), False), (("-lcs", "--lookup-cache-static"), True),
    (("-lcd", "--lookup-cache-dynamic"), True), (("--reuse-port",), False), (("-e", "--escape"), False),
    (("--no-escape",), False), (("--log-colors",), True), (("--log-prefix",), False), (("--log-timestamps",), False),
    (("--no-perf",), False), (("--perf",), False), (("-kvo", "--kv-offload"), False),
    (("-nkvo", "--no-kv-offload"), False), (("--repack",), False), (("-nr", "--no-repack"), False),
    (("--no-host",), False), (("-sp", "--special"), False), (("--poll",), True), (("--poll-batch",), True),
    (("--cpu-strict",), True), (("--cpu-strict-batch",), True), (("-Cb", "--cpu-mask-batch"), True),
    (("-Crb", "--cpu-range-batch"), True), (("--prio-batch",), True),
    (("-bs", "--backend-sampling"), False),  # samples on the device: the same distributions
]
# accepted with a warning: the output is the same, only the speed differs (no speculative decoding)
_SPECULATIVE = [
    (("-md", "--model-draft"), True), (("--draft", "--draft-n", "--draft-max"), True), (("--draft-min",), True),
    (("--draft-p-min",), True), (("-cd", "--ctx-size-draft"), True), (("-devd", "--device-draft"), True),
    (("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"), True), (("--spec-replace",), True),
]
# refused: they would change what the server computes or serves, and tritium does not implement them
_UNSUPPORTED = [
    (("--control-vector",), True), (("--control-vector-scaled",), True), (("-mu", "--model-url"), True),
]


def _add_llama_server_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("llama-server compatibility")
    g.add_argument("-b", "--batch-size", type=int, default=2048, metavar="N",
                   help="logical maximum batch size: prompt tokens evaluated per step")
    g.add_argument("-ub", "--ubatch-size", type=int, default=512, metavar="N",
                   help="physical maximum batch size: rows of one forward (a larger step runs as several)")
    g.add_argument("--path", dest="public_path", default="", metavar="PATH",
                   help="serve the static files of this folder at / instead of the built-in web page")
    g.add_argument("--api-prefix", default="", metavar="PREFIX",
                   help="serve every route under this path prefix (no trailing slash), as llama-server's")
    g.add_argument("--ssl-key-file", default=None, metavar="FNAME", help="PEM private key: serve HTTPS (with --ssl-cert-file)")
    g.add_argument("--ssl-cert-file", default=None, metavar="FNAME", help="PEM certificate chain for HTTPS")
    g.add_argument("-C", "--cpu-mask", default=None, metavar="M",
                   help="CPU affinity mask, hex (e.g. ff): the process and every thread it starts are pinned to it")
    g.add_argument("-Cr", "--cpu-range", default=None, metavar="LO-HI", help="CPU affinity range (e.g. 0-3)")
    g.add_argument("--prio", type=int, default=0, metavar="N",
                   help="process priority: -1 low, 0 normal, 1 medium, 2 high, 3 realtime (nice values)")
    g.add_argument("--no-warmup", dest="warmup", action="store_false", default=True,
                   help="skip the warm-up forward at load")
    g.add_argument("--warmup", dest="warmup", action="store_true")
    g.add_argument("-ctk", "--cache-type-k", default="f16", metavar="TYPE", help="KV cache type (f32, f16, bf16)")
    g.add_argument("-ctv", "--cache-type-v", default="f16", metavar="TYPE", help="KV cache type (f32, f16, bf16)")
    g.add_argument("--rope-scaling", choices=("none", "linear", "yarn"), default=None,
                   help="RoPE frequency scaling (default: the model's)")
    g.add_argument("--rope-scale", type=float, default=None, metavar="N", help="RoPE context scaling factor")
    g.add_argument("--rope-freq-base", type=float, default=None, metavar="N", help="RoPE base frequency")
    g.add_argument("--rope-freq-scale", type=float, default=None, metavar="N",
                   help="RoPE frequency scaling factor (1 / --rope-scale)")
    g.add_argument("--yarn-orig-ctx", type=int, default=None, metavar="N", help="YaRN original context size")
    g.add_argument("--yarn-ext-factor", type=float, default=None, metavar="N")
    g.add_argument("--yarn-attn-factor", type=float, default=None, metavar="N")
    g.add_argument("--yarn-beta-slow", type=float, default=None, metavar="N")
    g.add_argument("--yarn-beta-fast", type=float, default=None, metavar="N")
    g.add_argument("--log-disable", action="store_true", help="no log output")
    g.add_argument("--log-file", default=None, metavar="FNAME", help="also write the log to this file")
    _add_multimodal_flags(p)
    for prefix, table in (("_noeffect_", _NO_EFFECT), ("_spec_", _SPECULATIVE), ("_unsupported_", _UNSUPPORTED)):
        for names, value in table:
            kw = {} if value else {"action": "store_const", "const": True}
            g.add_argument(*names, dest=_dest(prefix, names), default=None, help=argparse.SUPPRESS, **kw)


def _add_multimodal_flags(p: argparse.ArgumentParser) -> None:
    """llama-server's multimodal flags (runtime/vision)."""
    g = p.add_argument_group("multimodal")
    g.add_argument("-mm", "--mmproj", default=None, metavar="FILE",
                   help="path to a multimodal projector file (images / audio in prompts)")
    g.add_argument("-mmu", "--mmproj-url", default=None, metavar="URL",
                   help="URL to a multimodal projector file (downloaded into the cache)")
    g.add_argument("--mmproj-auto", dest="mmproj_auto", action="store_true", default=True,
                   help="use the multimodal projector of a -hf repository when it has one")
    g.add_argument("--no-mmproj", "--no-mmproj-auto", dest="mmproj_auto", action="store_false")
    g.add_argument("--mmproj-offload", dest="mmproj_offload", action="store_true", default=True,
                   help="run the multimodal projector on the model's device (--no-mmproj-offload: the CPU)")
    g.add_argument("--no-mmproj-offload", dest="mmproj_offload", action="store_false")
    g.add_argument("-mmdev", "--mmproj-device", default=None, metavar="DEVICE",
                   help="device of the multimodal projector (none = the CPU; default: the model's)")
    g.add_argument("--image-min-tokens", type=int, default=-1, metavar="N",
                   help="minimum number of tokens each image can take (dynamic-resolution vision models; "
                        "default: read from the model)")
    g.add_argument("--image-max-tokens", type=int, default=-1, metavar="N",
                   help="maximum number of tokens each image can take (default: read from the model)")
    g.add_argument("--media-path", default="", metavar="PATH",
                   help="folder that file:// media URLs may name (default: file:// URLs are refused)")
    for names in (("--mtmd-batch-max-tokens",), ("--video-fps",), ("--video-timestamp-interval",),
                  ("--video-ffmpeg-dir",)):  # batching and video: nothing to change here
        g.add_argument(*names, dest=_dest("_noeffect_", names), default=None, help=argparse.SUPPRESS)


def _dest(prefix: str, names: tuple[str, ...]) -> str:
    return prefix + names[-1].lstrip("-").replace("-", "_")

def _sleep_seconds(v: str) -> int:
    n = int(v)
    if n == 0 or n < -1:
        raise argparse.ArgumentTypeError("invalid value: cannot be 0 or less than -1")
    return n
