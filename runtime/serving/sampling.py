"""A request's sampler over the model's vocabulary: set up when its task is admitted (penalty
history, DRY sequence breakers, grammar, lazy grammar triggers) and used after each forward
(`sample_rows`, token pieces and probabilities).

`Vocabulary` bundles what this needs of the tokenizer and keeps the grammar compiler (built on
first use, it caches compiled grammars by text); the engine owns one.
"""
from __future__ import annotations

import concurrent.futures
import threading
from collections import OrderedDict

import torch

from grammar import SAMPLER_INIT_FAILED, GrammarTooLarge
from runtime.sampling.reasoning_budget import ReasoningBudget, utf8_is_complete
from runtime.sampling.sampler import Sampled, SamplerState, sample_batch
from runtime.sampling.samplers import dry_breaker_ids
from runtime.serving.plan import StepPlan
from runtime.serving.slots import Request, Slot
from runtime.serving.stop_match import StopMatcher, StopScan
from runtime.tasks import TokenProb

INT_MAX = (1 << 31) - 1  # an unlimited budget (reasoning_control alone)


class GrammarError(ValueError):
    """A request's grammar does not parse (answered with a 400)."""


class Vocabulary:
    def __init__(self, tokenizer, eog: frozenset[int], control: set[int], special: bool = False):
        """`special` (--special): control tokens are rendered as text too (then `control` is empty)."""
        self.tokenizer, self.eog, self.control, self.special = tokenizer, eog, control, special
        self._grammar_compiler = None
        self._compiler_lock = threading.Lock()
        self._precompiler: concurrent.futures.ThreadPoolExecutor | None = None
        self._failed: OrderedDict[str, Exception] = OrderedDict()  # grammar text -> its error, from precompile

    def precompile(self, gbnf: str) -> concurrent.futures.Future | None:
        """Compile `gbnf` in a worker thread (None when it is compiled already), so that a large
        grammar never stalls the engine thread; admission then finds it in the compiler's cache
        (or its error)."""
        compiler = self._compiler()
        if compiler.cached(gbnf):
            return None
        if self._precompiler is None:
            self._precompiler = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tritium-grammar")

        def run() -> None:
            try:
                compiler.compile(gbnf)
            except Exception as e:  # noqa: BLE001 - reported when the task is admitted
                with self._compiler_lock:
                    self._failed[gbnf] = e
                    while len(self._failed) > 16:
                        self._failed.popitem(last=False)
        return self._precompiler.submit(run)

    def piece(self, tok: int) -> bytes:
        """The bytes a sampled token adds to the text (control tokens add none)."""
        return b"" if tok in self.control else self.tokenizer.piece(tok)

    def token_prob(self, tok: int, logprob: float) -> TokenProb:
        """A candidate as llama-server lists it: its piece without special rendering (a control or
        unknown token shows as "", as without --special)."""
        b = self.tokenizer.piece(tok, special=self.special)
        return TokenProb(tok, b.decode("utf-8", "replace"), list(b), logprob)

    # ---- set-up at admission ---------------------------------------------------------------
    def start_sampler(self, req: Request, grammar_prefix: str = "") -> None:
        """req.sampler for the task's params, its history primed with the prompt; a grammar is
        compiled now (GrammarError when it does not parse) and either constrains from the start,
        after `grammar_prefix` (a prefilled assistant turn), or waits for a trigger word (lazy)."""
        p = req.task.params
        req.sampler = SamplerState(p, self.eog)
        if p.dry_multiplier > 0:
            req.sampler.dry_breakers = (p.dry_breaker_ids if p.dry_breaker_ids is not None
                                        else dry_breaker_ids(self.tokenizer, p.dry_sequence_breakers))
        req.sampler.history.extend(t for t in req.prompt if t >= 0)  # (media rows are no tokens)
        req.sampler.budget = self.reasoning_budget(p, req.task.generation_prompt)
        if not p.grammar:
            return
        try:
            matcher = self._compile_grammar(p.grammar)
        except GrammarTooLarge as e:  # tritium's bounds: named
            raise GrammarError(str(e)) from e
        except Exception as e:  # noqa: BLE001 - b1-0c1e570's answer; the parser's message is the cause
            raise GrammarError(SAMPLER_INIT_FAILED) from e
        if p.grammar_lazy and p.grammar_triggers:
            # unconstrained until a trigger word appears in the output (tool_choice auto)
            req.lazy_grammar, req.lazy_triggers = matcher, list(p.grammar_triggers)
            req.lazy_scan = StopScan(StopMatcher(req.lazy_triggers))
        else:
            req.sampler.grammar = matcher
            if grammar_prefix:
                self._advance_grammar_over(matcher, grammar_prefix)

    def reasoning_budget(self, p, generation_prompt: str) -> ReasoningBudget | None:
        """The budget sampler of a task (common_sampler_init): when the reasoning tags are known and
        a budget or reasoning_control asks for it; it has read the generation prompt's tokens."""
        if not (p.reasoning_start and p.reasoning_end and (p.reasoning_budget_tokens >= 0 or p.reasoning_control)):
            return None

        def utf8_complete(tok: int) -> bool:
            return utf8_is_complete(self.tokenizer.piece(tok, special=False))
        budget = ReasoningBudget([list(p.reasoning_start)], [list(e) for e in p.reasoning_end],
                                 list(p.reasoning_forced), p.reasoning_budget_tokens if p.reasoning_budget_tokens >= 0
                                 else INT_MAX, utf8_complete)
        if generation_prompt:
            toks = self.tokenizer.encode(generation_prompt, add_special=False, parse_special=True)
            for i, t in enumerate(toks):
                piece = self.tokenizer.piece(t)
                if i == 0 and piece[:1].isspace() and not generation_prompt[:1].isspace():
                    continue  # some tokenizers add a space before the first special token
                budget.accept(t)
        return budget

    @staticmethod
    def _advance_grammar_over(matcher, text: str) -> None:
        """Feed text already in the prompt (a prefilled assistant turn) through the grammar, as
        llama-server primes a chat grammar with what the assistant turn already holds."""
        try:
            matcher.advance_bytes(text.encode("utf-8"))
        except Exception:  # noqa: BLE001 - text outside the grammar: the grammar starts from the top
            pass

    def _compiler(self):
        with self._compiler_lock:
            if self._grammar_compiler is None:
                from grammar import GrammarCompiler, Vocab
                vocab = Vocab(self.tokenizer.token_pieces(), set(self.eog))
                self._grammar_compiler = GrammarCompiler(vocab)
            return self._grammar_compiler

    def _compile_grammar(self, gbnf: str):
        with self._compiler_lock:
            failed = self._failed.pop(gbnf, None)
        if failed is not None:
            raise failed
        return self._compiler().matcher(gbnf)


def maybe_trigger_grammar(req: Request) -> None:
    """Activate a lazy grammar at the first trigger word, feeding it the text from there (the
    trigger words are matched by a `StopScan`: work bounded by the new text)."""
    text = req.text.text
    if req.lazy_scan is None:
        req.lazy_scan = StopScan(StopMatcher(req.lazy_triggers))
    found = req.lazy_scan.feed(text)
    if not found:
        return
    start = min(found)[0]
    matcher, req.lazy_grammar = req.lazy_grammar, None
    try:
        matcher.advance_bytes(text[start:].encode("utf-8"))
    except Exception:  # noqa: BLE001 - the output already left the grammar: stay unconstrained
        return
    req.sampler.grammar = matcher


def sample_rows(plan: StepPlan, logits: torch.Tensor, need: list[Slot]) -> list[tuple[Slot, Sampled | Exception]]:
    """Sample the next token of each slot in `need` from its row of `logits` (`n_logits` rows per
    batch row that asked for logits, in batch order; the last one), all in one `sample_batch` call; a row whose
    sampling raised has its exception in place of the result (the other rows are unaffected)."""
    wanted = {id(s) for s in need}
    owners, keep, row = [], [], 0  # a row with n_logits rows is sampled at its last one
    for b, s in zip(plan.batch, plan.slots):
        if b.logits:
            row += b.n_logits
            if id(s) in wanted:
                owners.append(s)
                keep.append(row - 1)
    if not keep:
        return []
    sel = logits if len(keep) == logits.shape[0] else logits[torch.tensor(keep, device=logits.device)]
    results = sample_batch(sel, [s.req.sampler for s in owners])
    return list(zip(owners, results))
