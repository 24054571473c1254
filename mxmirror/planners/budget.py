"""Least recompute whose planned memory fits a byte budget.

The family searched, from no recompute upward: no plan, cheap ops only,
segment plans that recompute only cheap ops, then full segment plans over a
grid of segment sizes. Each is scored by the simulator; the one with the least
recompute that fits wins. When none fits, the error states the smallest figure
reachable so the user can pick a budget.
"""

from __future__ import annotations

from ..errors import PlanError
from ..graph import Graph
from ..plan import Plan
from .cheap import _names, cheap_mirror
from .common import score, segment_mirror
from .sqrt import candidates


def plan(graph: Graph, budget_bytes: int | None = None) -> Plan:
    base = score(graph, set())
    if base.planned_bytes <= budget_bytes:
        return Plan("budget", graph, set(), [], base.planned_bytes, base.planned_bytes, 0.0)
    order, cuts, blockers, cands = candidates(graph, steps=17, spread=8.0)
    options = [(set(), [], base)]
    cm, _ = cheap_mirror(graph)
    options.append((cm, [], score(graph, cm)))
    seen = {frozenset(), frozenset(cm)}
    for _, chosen, mirror in cands:
        for m in (segment_mirror(graph, order, chosen, blockers, only_cheap=True), mirror):
            if frozenset(m) in seen:
                continue
            seen.add(frozenset(m))
            options.append((m, chosen, score(graph, m)))
    fits = [o for o in options if o[2].planned_bytes <= budget_bytes]
    if not fits:
        smallest = min(o[2].planned_bytes for o in options)
        raise PlanError(f"budget {budget_bytes / 2**20:.0f} MB is below the smallest planned "
                        f"memory reachable with at most one recomputation per node "
                        f"({smallest / 2**20:.0f} MB); raise the budget")
    mirror, chosen, s = min(fits, key=lambda o: (o[2].recompute_ratio, o[2].planned_bytes))
    ckpts = [graph.nodes[i].name for c in chosen for i in sorted(c.keep)]
    return Plan("budget", graph, mirror, ckpts, base.planned_bytes, s.planned_bytes,
                s.recompute_ratio, skipped=_names(graph, blockers))
