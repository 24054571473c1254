"""Least recompute whose planned memory fits a byte budget.

The family searched, from no recompute upward: no plan, cheap ops only,
segment plans that recompute only cheap ops, then full segment plans over a
grid of segment sizes, and the sqrt policy's own plan. Each is scored by the
simulator; the one with the least recompute that fits wins. When none fits,
segments are recomputed several times (the multi-level DP on the segmented
executor); only if even that cannot fit does the error state the smallest
figure reachable.
"""

from __future__ import annotations

from ..errors import PlanError
from ..graph import Graph
from ..plan import Plan
from .cheap import _names, cheap_mirror
from .common import checkpoint_names, score, segment_mirror
from .sqrt import best_of, candidates


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
        names = checkpoint_names(graph, chosen)
        for m in (segment_mirror(graph, order, chosen, blockers, only_cheap=True), mirror):
            if frozenset(m) in seen:
                continue
            seen.add(frozenset(m))
            options.append((m, names, score(graph, m)))
    # the sqrt policy's own pick too: budget never recomputes more than sqrt where sqrt fits
    sq_cands = candidates(graph)[3]
    if sq_cands:
        s, mirror, chosen = best_of(graph, sq_cands)
        options.append((mirror, checkpoint_names(graph, chosen), s))
    fits = [o for o in options if o[2].planned_bytes <= budget_bytes]
    if not fits:
        return _multilevel(graph, budget_bytes, base.planned_bytes,
                           min(o[2].planned_bytes for o in options))
    _, ckpts, s = min(fits, key=lambda o: (o[2].recompute_ratio, o[2].planned_bytes))
    return Plan("budget", graph, set(s.mirror), list(ckpts), base.planned_bytes, s.planned_bytes,
                s.recompute_ratio, skipped=_names(graph, blockers))


def _multilevel(graph: Graph, budget_bytes: int, baseline: int, one_recompute: int) -> Plan:
    """No plan with one recomputation per node fits: recompute several times (the multi-level
    DP run by the segmented executor), or say what the smallest reachable figure is."""
    from . import multilevel

    try:
        sp = multilevel.plan_for_budget(graph, budget_bytes)
    except PlanError as exc:
        raise PlanError(f"{exc} (with at most one recomputation per node: "
                        f"{one_recompute / 2**20:.0f} MB)") from None
    return multilevel.segmented_plan(
        "budget", graph, sp, baseline,
        notes=[f"no plan with one recomputation per node fits (smallest "
               f"{one_recompute / 2**20:.0f} MB): segments are recomputed several times "
               f"by the segmented executor"])
