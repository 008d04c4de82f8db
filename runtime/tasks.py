"""Plain data exchanged between `api/` and the engine: requests in, events out.

`api/` builds these from JSON and reads them back into JSON; it never sees tensors.
Field names follow llama-server's (tools/server) so that `generation_settings` can echo them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_SAMPLERS = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]


@dataclass
class SamplingParams:
    temperature: float = 0.8
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    repeat_last_n: int = 64
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64  # common_params_sampling's default in b1-0c1e570 (-1 = context size)
    dry_sequence_breakers: list[str] = field(default_factory=lambda: ["\n", ":", "\"", "*"])
    # the breakers' token ids, computed where the request is parsed (off the engine thread: a client
    # may send a million breakers); None: computed at admission
    dry_breaker_ids: Any = None  # np.ndarray of int64 (runtime.sampling.samplers.dry_breaker_ids)
    min_keep: int = 0
    mirostat: int = 0  # 1: Mirostat, 2: Mirostat 2.0 (then only logit bias, temperature and it sample)
    mirostat_tau: float = 5.0  # target surprise (bits)
    mirostat_eta: float = 0.1  # learning rate
    adaptive_target: float = -1.0  # echoed (the adaptive-p sampler is not implemented)
    adaptive_decay: float = 0.9
    seed: int = 4294967295  # 0xFFFFFFFF = random
    n_probs: int = 0
    # n_probs from the sampler's candidates (after biases and the grammar) rather than the model's
    # own distribution, which is llama-server's default (get_token_probabilities: the raw logits)
    post_sampling_probs: bool = False
    logit_bias: list[tuple[int, float]] = field(default_factory=list)  # (token id, bias); -inf bans
    ignore_eos: bool = False
    samplers: list[str] = field(default_factory=lambda: list(DEFAULT_SAMPLERS))
    grammar: str = ""  # GBNF text; "" = unconstrained
    grammar_lazy: bool = False
    grammar_triggers: list[str] = field(default_factory=list)
    preserved_tokens: list[int] = field(default_factory=list)
    # the reasoning budget (runtime/sampling/reasoning_budget.py), made when the start and end tags
    # are known and a budget (>= 0) or reasoning_control asks for it: the tags' token ids, and what
    # is forced to end a reasoning block (the budget message, then the first end tag)
    reasoning_budget_tokens: int = -1
    reasoning_control: bool = False
    reasoning_start: list[int] = field(default_factory=list)
    reasoning_end: list[list[int]] = field(default_factory=list)
    reasoning_forced: list[int] = field(default_factory=list)


@dataclass
class CompletionTask:
    prompt_tokens: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    n_predict: int = -1  # -1 = until EOS / context end
    n_indent: int = 0
    stop: list[str] = field(default_factory=list)
    stop_matcher: Any = None  # runtime.serving.stop_match.StopMatcher of `stop`, built once (Engine.submit)
    id_slot: int = -1
    cache_prompt: bool = True
    n_cache_reuse: int | None = None  # None = server's --cache-reuse
    n_keep: int = 0  # tokens of the prompt a context shift keeps (-1: all; the server's --keep when absent)
    n_discard: int = 0  # tokens a context shift drops after them (0: half of the rest)
    stream: bool = False
    return_tokens: bool = False
    t_max_predict_ms: int = -1
    return_progress: bool = False  # stream PromptProgress events while the prompt is read
    timings_per_token: bool = False  # each streamed TokenOut carries the running Timings
    grammar_prefix: str = ""  # text of a prefilled assistant turn the grammar has already seen
    generation_prompt: str = ""  # a chat's assistant-turn opening (+ prefill), echoed in generation_settings
    lora: dict[int, float] | None = None  # per-request adapter scales (unlisted: 0); None = the server's
    is_parent: bool = False  # the first of `n` completions (b1: no context shift for a shared prompt)
    is_child: bool = False  # one of the n - 1 extra completions of `n`: its slot keeps no cache afterwards
    chat_format: str = "Content-only"  # echoed in generation_settings: llama.cpp's name of the parser format
    user_starts: list[int] = field(default_factory=list)  # chat: token positions where user messages begin
    cmpl_id: str = ""  # an OpenAI-style completion's id ("chatcmpl-..."): /v1/chat/completions/control finds it
    infill: bool = False  # an /infill task: like llama-server's, it never saves to or loads from --cache-ram
    # images / audio clips of the prompt (runtime.vision.media.MediaChunk: where their tokens sit in
    # prompt_tokens, which are negative ids there; their preprocessed inputs, opaque to api/)
    media: list[Any] = field(default_factory=list)


@dataclass
class EmbeddingTask:
    prompt_tokens: list[int]
    pooling: str = "mean"  # mean | cls | last | none
    normalize: int = 2  # --embd-normalize: -1 none, 0 max-abs, 1 taxicab, 2 euclidean, >2 p-norm
    media: list[Any] = field(default_factory=list)  # as CompletionTask.media

    @property
    def splittable(self) -> bool:
        """Whether its prompt may be read in several batches (b1's can_split): pooling last, or rank
        (tritium's rerankers are causal and read the last token); the other poolings are of one batch."""
        return self.pooling in ("last", "rank")


@dataclass
class TokenProb:
    id: int
    token: str
    bytes: list[int]
    logprob: float


@dataclass
class TokenOut:
    """One sampled token, with the text it completed (may be "" while a UTF-8 sequence or a
    possible stop string is held back; held text is released in a later event)."""
    id: int
    text: str
    probs: list[TokenProb] | None = None  # top n_probs candidates, when requested
    logprob: float | None = None
    timings: "Timings | None" = None  # with CompletionTask.timings_per_token, and on a stop word
    n_cached: int = 0  # prompt tokens the task reused from the cache
    n_decoded: int = 0  # tokens generated so far, this one included (some are not streamed: UTF-8)


@dataclass
class Timings:
    cache_n: int = 0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    draft_n: int = 0  # speculative decoding: draft tokens proposed, and accepted (listed when draft_n > 0)
    draft_n_accepted: int = 0

    def as_dict(self) -> dict[str, Any]:
        steps = max(self.predicted_n - 1, 0)  # the first token comes from the prompt's logits: no decode step
        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": self.prompt_ms / self.prompt_n if self.prompt_n else 0.0,
            "prompt_per_second": 1e3 * self.prompt_n / self.prompt_ms if self.prompt_ms > 0 else 0.0,
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": self.predicted_ms / steps if steps else 0.0,
            "predicted_per_second": 1e3 / self.predicted_ms * steps if self.predicted_ms > 0 else 0.0,
        } | ({"draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted} if self.draft_n > 0 else {})


@dataclass
class PromptProgress:
    """How far a streamed task with `return_progress` is in reading its prompt (llama-server's
    `prompt_progress`): sent once when the task starts (processed == cache) and after every batch."""
    total: int  # prompt tokens
    cache: int  # reused from the cache
    processed: int  # in the KV cache now, the cached ones included
    time_ms: int  # since the task started
    timings: Timings

    def as_dict(self) -> dict[str, Any]:
        """llama-server's `prompt_progress` object."""
        return {"total": self.total, "cache": self.cache, "processed": self.processed, "time_ms": self.time_ms}


@dataclass
class CompletionResult:
    content: str
    tokens: list[int]
    id_slot: int
    stop_type: str  # "eos" | "limit" | "word" | "none"
    stopping_word: str
    truncated: bool
    n_prompt_tokens: int  # tokens_evaluated
    n_decoded: int  # tokens_predicted
    tokens_cached: int
    has_new_line: bool
    timings: Timings
    probs: list[TokenOut] = field(default_factory=list)


@dataclass
class TaskError:
    """An error raised while a task runs (after it was accepted)."""
    code: int
    message: str
    type: str
    extra: dict[str, Any] = field(default_factory=dict)
