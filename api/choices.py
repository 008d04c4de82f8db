"""Several completions of one prompt (`n` / `n_cmpl`), as llama-server b1-0c1e570 makes them: the
first task as asked, then `n - 1` copies that take any slot and, unless the seed is random, the
seeds `seed + 1`, `seed + 2`... (a copy's slot is emptied when it ends: "do not keep context of the
child slots - the parent's context is enough"). Their results come back in order, each with its `index`; an
OpenAI response lists them as `choices` (usage and timings are the first one's).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from api.errors import ApiError
from api.params import Fields
from runtime.tasks import CompletionTask

RANDOM_SEED = 0xFFFFFFFF


def n_choices(body: dict[str, Any], n_parallel: int) -> int:
    """`n_cmpl` (alias `n`): 1 <= n <= --parallel, else llama-server's 400."""
    f = Fields(body)
    for key in ("n_cmpl", "n"):
        if f.has(key):
            n = f.integer(key, 1)
            if n < 1 or n > n_parallel:
                raise ApiError(f"Field '{key}': Value must be between 1 <= value <= {n_parallel}, but got {n}")
            return n
    return 1


def with_children(task: CompletionTask, n: int) -> list[CompletionTask]:
    """The task and its `n - 1` children (any slot; seed + j unless random)."""
    out = [dataclasses.replace(task, is_parent=True) if n > 1 else task]
    for j in range(1, n):
        seed = task.params.seed
        params = dataclasses.replace(task.params, seed=seed if seed == RANDOM_SEED else (seed + j) & 0xFFFFFFFF)
        out.append(dataclasses.replace(task, params=params, id_slot=-1, is_child=True))
    return out
