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

from ..analysis import Analysis
from ..errors import PlanError
from .cheap import cheap_mirror
from .common import Choice, best_of, candidates, mirror_choice, segment_mirror, segmented_choice
from .dp import plan_for_budget


def choose(a: Analysis, budget_bytes: int | None = None) -> Choice:
    if a.baseline.planned_bytes <= budget_bytes:
        return Choice(a.baseline)
    options = _options(a)
    fits = [o for o in options if o.score.planned_bytes <= budget_bytes]
    if fits:
        return min(fits, key=lambda o: (o.score.recompute_ratio, o.score.planned_bytes))
    one_recompute = min(o.score.planned_bytes for o in options)
    try:
        sp = plan_for_budget(a, budget_bytes)
    except PlanError as exc:
        raise PlanError(f"{exc} (with at most one recomputation per node: "
                        f"{one_recompute / 2**20:.0f} MB)") from None
    return segmented_choice(a, sp, (
        f"no plan with one recomputation per node fits (smallest "
        f"{one_recompute / 2**20:.0f} MB): segments are recomputed several times by the "
        f"segmented executor",))


def one_recompute(a: Analysis, budget_bytes: int | None = None) -> Choice:
    """The best plan recomputing each node at most once: the least recompute that fits the
    budget, else (or without a budget) the least memory; no plan if nothing is lower."""
    options = _options(a)
    fits = [o for o in options if budget_bytes is not None
            and o.score.planned_bytes <= budget_bytes]
    if fits:
        return min(fits, key=lambda o: (o.score.recompute_ratio, o.score.planned_bytes))
    return min(options, key=lambda o: (o.score.planned_bytes, o.score.recompute_ratio))


def _options(a: Analysis) -> list[Choice]:
    """Every one-recompute plan budget weighs, no plan first."""
    options = [Choice(a.baseline), mirror_choice(a, cheap_mirror(a))]
    seen = {frozenset(), frozenset(cheap_mirror(a))}
    for c in candidates(a, steps=17, spread=8.0):
        for m in (segment_mirror(a, c.cuts, only_cheap=True), c.mirror):
            if frozenset(m) not in seen:
                seen.add(frozenset(m))
                options.append(mirror_choice(a, m, c.cuts))
    # the sqrt policy's own pick too: budget never recomputes more than sqrt where sqrt fits
    sq = best_of(a, candidates(a))
    if sq is not None:
        options.append(mirror_choice(a, sq[1].mirror, sq[1].cuts))
    return options
