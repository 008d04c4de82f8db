"""`GET /metrics`: llama-server's Prometheus text (server_task_result_metrics::to_metrics).

llama-server writes every item as `# HELP`, `# TYPE`, value, with the `llamacpp:` prefix, counters
first, and prints values with C++ stream defaults (6 significant digits: `0.436448`, `207`).
prometheus-client's own exposition would write `207.0` and drop `_total` from counter TYPE lines,
so the text is rendered here; the tests parse it back with `prometheus_client.parser`.
Values come from `Engine.metrics()` (counters cumulative, gauges averaged over the window since the
previous read, which the engine resets on each read).
"""
from __future__ import annotations

from typing import Any, Mapping

PREFIX = "llamacpp:"

# (name, help) in llama-server's order
COUNTERS = [
    ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "Total time spent processing prompts"),
    ("tokens_predicted_total", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "Total time spent generating tokens"),
    ("n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding"),
    ("n_tokens_max", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model"),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps"),
]
GAUGES = [
    ("prompt_tokens_seconds", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "Average generation throughput in tokens/s"),
    ("requests_processing", "Number of requests processing"),
    ("requests_deferred", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call"),
    # not in b1-0c1e570 (older llama-server builds had it): the KV-cache load inference-aware
    # gateways and autoscalers route on, beside requests_deferred (README "Scaling out")
    ("kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage"),
]

PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"


def format_value(x: float) -> str:
    """A double as `std::ostream << x` prints it (precision 6, %g style)."""
    x = float(x)
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return f"{x:g}"


def render(values: Mapping[str, Any]) -> str:
    """Prometheus text for a dict of metric values keyed with or without the `llamacpp:` prefix;
    a missing metric is 0."""
    vals = {k[len(PREFIX):] if k.startswith(PREFIX) else k: v for k, v in values.items()}
    out = []
    for kind, items in (("counter", COUNTERS), ("gauge", GAUGES)):
        for name, help_text in items:
            out.append(f"# HELP {PREFIX}{name} {help_text}\n")
            out.append(f"# TYPE {PREFIX}{name} {kind}\n")
            out.append(f"{PREFIX}{name} {format_value(vals.get(name, 0) or 0)}\n")
    per_pos = vals.get(PER_POS) or []
    if per_pos:  # a labeled counter, one series per draft position, once a draft was verified
        out.append(f"# HELP {PREFIX}{PER_POS} Accepted tokens per draft position\n# TYPE {PREFIX}{PER_POS} counter\n")
        out.extend(f'{PREFIX}{PER_POS}{{position="{i}"}} {n}\n' for i, n in enumerate(per_pos))
    return "".join(out)
