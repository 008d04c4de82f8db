"""The engine's counters for `/metrics` (llama-server's `llamacpp:` series).

Counters are cumulative; the gauges (`prompt_tokens_seconds`, `predicted_tokens_seconds`,
`n_busy_slots_per_decode`) average over the window since the previous read, which `snapshot`
resets. Only the engine thread touches a `Metrics` (the API reads it through `Engine.metrics`,
which runs `snapshot` between steps).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Metrics:
    t_start: int = field(default_factory=lambda: int(time.time()))  # Unix seconds, when the engine was made
    n_prompt_tokens_processed_total: int = 0
    n_prompt_tokens_cached_total: int = 0
    t_prompt_processing_total: float = 0.0  # seconds
    n_tokens_predicted_total: int = 0
    t_tokens_generation_total: float = 0.0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0
    n_tokens_max: int = 0
    n_draft_tokens_total: int = 0  # speculative decoding: tokens drafted, accepted, verify steps
    n_draft_accepted_total: int = 0
    n_draft_verify_total: int = 0
    n_accepted_per_pos: list[int] = field(default_factory=list)  # accepted draft tokens at each draft position
    # window since the last scrape
    n_prompt_tokens_processed: int = 0
    t_prompt_processing: float = 0.0
    n_tokens_predicted: int = 0
    t_tokens_generation: float = 0.0
    n_decode: int = 0
    n_busy_slots: int = 0

    def on_forward(self, n_rows: int) -> None:
        """One batched forward over `n_rows` slots."""
        self.n_decode_total += 1
        self.n_decode += 1
        self.n_busy_slots_total += n_rows
        self.n_busy_slots += n_rows

    def on_spec_done(self, n_draft: int, n_accepted: int, n_verify: int, per_pos: list[int]) -> None:
        """A finished task's speculation (llama-server adds a slot's stats when its prediction
        ends, metrics_on_prediction): drafted, accepted, verify steps, accepted per position."""
        self.n_draft_tokens_total += n_draft
        self.n_draft_accepted_total += n_accepted
        self.n_draft_verify_total += n_verify
        if len(self.n_accepted_per_pos) < len(per_pos):
            self.n_accepted_per_pos.extend([0] * (len(per_pos) - len(self.n_accepted_per_pos)))
        for i, n in enumerate(per_pos):
            self.n_accepted_per_pos[i] += n

    def on_prompt_done(self, n_processed: int, n_cached: int, seconds: float) -> None:
        self.n_prompt_tokens_processed_total += n_processed
        self.n_prompt_tokens_processed += n_processed
        self.n_prompt_tokens_cached_total += n_cached
        self.t_prompt_processing_total += seconds
        self.t_prompt_processing += seconds

    def on_finish(self, n_decoded: int, seconds: float, n_tokens: int) -> None:
        """A completion ended after `n_decoded` tokens generated in `seconds`; `n_tokens`: the
        tokens its slot's cache held at the end (prompt + generated - 1)."""
        self.n_tokens_predicted_total += n_decoded
        self.n_tokens_predicted += n_decoded
        self.t_tokens_generation_total += seconds
        self.t_tokens_generation += seconds
        self.n_tokens_max = max(self.n_tokens_max, n_tokens)

    def snapshot(self, requests_processing: int, requests_deferred: int, reset: bool = True) -> dict[str, float]:
        """The values `/metrics` prints; starts a new gauge window unless `reset` is False."""
        d = {
            "t_start": self.t_start,
            "prompt_tokens_total": self.n_prompt_tokens_processed_total,
            "prompt_tokens_cached_total": self.n_prompt_tokens_cached_total,
            "prompt_seconds_total": self.t_prompt_processing_total,
            "tokens_predicted_total": self.n_tokens_predicted_total,
            "tokens_predicted_seconds_total": self.t_tokens_generation_total,
            "n_decode_total": self.n_decode_total,
            "n_tokens_max": self.n_tokens_max,
            "spec_decode_num_draft_tokens_total": self.n_draft_tokens_total,
            "spec_decode_num_accepted_tokens_total": self.n_draft_accepted_total,
            "spec_decode_num_drafts_total": self.n_draft_verify_total,
            "spec_decode_num_accepted_tokens_per_pos_total": list(self.n_accepted_per_pos),
            "prompt_tokens_seconds": (self.n_prompt_tokens_processed / self.t_prompt_processing
                                      if self.t_prompt_processing else 0.0),
            "predicted_tokens_seconds": (self.n_tokens_predicted / self.t_tokens_generation
                                         if self.t_tokens_generation else 0.0),
            "requests_processing": requests_processing,
            "requests_deferred": requests_deferred,
            "n_busy_slots_per_decode": self.n_busy_slots / self.n_decode if self.n_decode else 0.0,
        }
        if reset:
            self.reset_window()
        return d

    def reset_window(self) -> None:
        """A new gauge window (llama-server's reset_bucket)."""
        self.n_prompt_tokens_processed = 0
        self.t_prompt_processing = 0.0
        self.n_tokens_predicted = 0
        self.t_tokens_generation = 0.0
        self.n_decode = 0
        self.n_busy_slots = 0


# the gauges averaged over the window since the previous scrape
WINDOW_GAUGES = ("prompt_tokens_seconds", "predicted_tokens_seconds", "n_busy_slots_per_decode")
