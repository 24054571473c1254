"""Paper Algorithm 3: segments by a byte budget, the budget searched around sqrt(x*y).

Every candidate plan is scored by the simulator (MXNet's own planner, no bind)
and the smallest is kept.
"""

from __future__ import annotations

import math

from ..graph import Graph
from ..plan import Plan
from .cheap import _names
from .common import (
    Score,
    checkpoint_names,
    find_cuts,
    greedy_cuts,
    mirror_blockers,
    node_bytes,
    op_order,
    score,
    segment_mirror,
)


def candidates(graph: Graph, steps: int = 9, spread: float = 4.0):
    """(budget, chosen cuts, mirror set) around the paper's B = sqrt(x*y)."""
    order = op_order(graph)
    cuts = find_cuts(graph)
    blockers = mirror_blockers(graph)
    if not cuts:
        return order, cuts, blockers, []
    every = greedy_cuts(order, cuts, 0)
    x = sum(c.bytes for c in every)
    seg, y = 0, 0
    cut_pos = {c.pos for c in every}
    for i, n in enumerate(order):
        seg += node_bytes(n)
        if i in cut_pos:
            y, seg = max(y, seg), 0
    y = max(y, seg)
    b0 = math.sqrt(max(x, 1) * max(y, 1))
    mid = greedy_cuts(order, cuts, b0)
    with_losses, without = (score(graph, segment_mirror(graph, order, mid, blockers,
                                                        mirror_losses=flag)).planned_bytes
                            for flag in (True, False))
    flag = with_losses <= without
    out = []
    for k in range(steps):
        b = b0 * spread ** (2 * k / (steps - 1) - 1)
        chosen = greedy_cuts(order, cuts, b)
        out.append((b, chosen, segment_mirror(graph, order, chosen, blockers,
                                              mirror_losses=flag)))
    return order, cuts, blockers, out


def best_of(graph: Graph, cands) -> tuple[Score, set[int], list]:
    best = None
    seen = set()
    for _, chosen, mirror in cands:
        key = frozenset(mirror)
        if key in seen:
            continue
        seen.add(key)
        s = score(graph, mirror)
        if best is None or s.planned_bytes < best[0].planned_bytes:
            best = (s, mirror, chosen)
    return best


def plan(graph: Graph, budget_bytes: int | None = None) -> Plan:
    base = score(graph, set())
    order, cuts, blockers, cands = candidates(graph)
    result = best_of(graph, cands) if cands else None
    if result is None or result[0].planned_bytes >= base.planned_bytes:
        p = Plan("sqrt", graph, set(), [], base.planned_bytes, base.planned_bytes, 0.0,
                 skipped=_names(graph, blockers))
        p.notes.append("no cut lowers memory: the graph is left as it is")
        return p
    s, mirror, chosen = result
    ckpts = checkpoint_names(graph, chosen)
    return Plan("sqrt", graph, set(s.mirror), ckpts, base.planned_bytes, s.planned_bytes,
                s.recompute_ratio, skipped=_names(graph, blockers))
