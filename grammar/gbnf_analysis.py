"""Whole-grammar checks of a lowered GBNF grammar, all iterative and linear in its size.

  * `find_cycle(graph)` - a cycle of a directed graph, by depth-first search on an explicit stack
  * `nullable_rules(g)` - which rules may match "" (a worklist: each element is looked at a
    bounded number of times, so a 20000-rule chain costs what its text costs, not 20000 passes)
  * `check_left_recursion(g)` - llama.cpp's left-recursion refusal, and tritium's bound on
    repeating an item that may be empty (`MAX_NULLABLE_REPEAT`)

Nothing here recurses: a client's grammar of any shape costs stack depth independent of its size.
"""
from __future__ import annotations

from collections import deque


def find_cycle(graph: list[set[int]] | list[list[int]]) -> tuple[list[int], int] | None:
    """A cycle of a directed graph (node -> successors), found by iterative depth-first search:
    (the DFS path when the cycle closed, the node it closed on), or None when acyclic."""
    state = [0] * len(graph)  # 0 new, 1 on the current path, 2 done
    for start in range(len(graph)):
        if state[start]:
            continue
        stack = [(start, iter(graph[start]))]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state[nxt] == 1:
                return [r for r, _ in stack], nxt
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(graph[nxt])))
    return None


def nullable_rules(g) -> list[bool]:
    """nullable[r]: rule r may match the empty string. Worklist over (rule, alternative) counters:
    an alternative becomes nullable when the last of its elements does."""
    n = len(g.rule_alts)
    nullable = [False] * n
    watchers: list[list[int]] = [[] for _ in range(n)]  # rule -> alternatives waiting on it
    pending: list[int] = []  # per alternative: elements not yet known to be nullable
    alt_rule: list[int] = []
    queue: deque[int] = deque()
    for r, alts in enumerate(g.rule_alts):
        for alt in alts:
            a = len(pending)
            alt_rule.append(r)
            if any(e[0] == "char" for e in alt):
                pending.append(-1)  # never nullable
                continue
            waiting = 0
            for e in alt:
                if e[0] == "rep" and e[2] == 0:
                    continue  # `x{0,n}` matches "" whatever x is
                watchers[e[1]].append(a)
                waiting += 1
            pending.append(waiting)
            if waiting == 0 and not nullable[r]:
                nullable[r] = True
                queue.append(r)
    while queue:
        x = queue.popleft()
        for a in watchers[x]:
            pending[a] -= 1
            r = alt_rule[a]
            if pending[a] == 0 and not nullable[r]:
                nullable[r] = True
                queue.append(r)
    return nullable


def element_nullable(e, nullable: list[bool]) -> bool:
    if e[0] == "char":
        return False
    return nullable[e[1]] or (e[0] == "rep" and e[2] == 0)


def generated(name: str) -> bool:
    base, _, k = name.rpartition("_")
    return bool(base) and k.isdigit()


def user_name(g, r: int) -> str:
    """The user's rule a generated rule belongs to (`item_3` -> `item`)."""
    name = g.rule_names[r]
    while generated(name):
        name = name.rpartition("_")[0]
    return name


def check_left_recursion(g) -> None:
    from .gbnf import MAX_NULLABLE_REPEAT, GrammarError, GrammarTooLarge  # gbnf imports this module
    n = len(g.rule_names)
    nullable = nullable_rules(g)
    left: list[set[int]] = [set() for _ in range(n)]
    for r in range(n):
        for alt in g.rule_alts[r]:
            for e in alt:
                if e[0] == "char":
                    break
                left[r].add(e[1])
                if not element_nullable(e, nullable):
                    break
            for e in alt:
                if e[0] == "rep" and nullable[e[1]] and (e[3] < 0 or e[3] > MAX_NULLABLE_REPEAT):
                    rng = f"{{{e[2]},{'' if e[3] < 0 else e[3]}}}"
                    raise GrammarTooLarge(f"rule '{user_name(g, r)}' repeats an item that may be empty {rng} times; "
                                          f"the limit for such an item is {MAX_NULLABLE_REPEAT} (left recursion)")
    found = find_cycle(left)
    if found is not None:
        path, nxt = found
        cycle = path[path.index(nxt):]
        user = next((g.rule_names[r] for r in cycle if not generated(g.rule_names[r])),
                    next((g.rule_names[r] for r in reversed(path) if not generated(g.rule_names[r])),
                         g.rule_names[nxt]))
        raise GrammarError(f"left recursion in rule '{user}' (a rule can reach itself without consuming "
                           f"input; this includes repeating an item that may be empty)")
