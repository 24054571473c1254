"""Least recompute whose planned memory fits a byte budget.

The answer is read from the Pareto front over every plan family (planners.front):
monotone in the budget, and impossible only below the smallest figure any family
reaches, which the error names with the policy that reached it.
"""

from __future__ import annotations

from ..analysis import Analysis
from ..errors import PlanError
from .common import Choice
from .front import least_recompute, smallest


def choose(a: Analysis, budget_bytes: int | None = None) -> Choice:
    if a.baseline.planned_bytes <= budget_bytes:
        return Choice(a.baseline)
    point = least_recompute(a, budget_bytes)
    if point is None:
        low = smallest(a)
        raise PlanError(f"budget {budget_bytes / 2**20:.1f} MB is below the smallest planned "
                        f"memory any policy reaches: {low.planned_bytes / 2**20:.1f} MB (the "
                        f"{low.policy} plan, {low.recompute_ratio:.2f}x recompute); raise "
                        f"the budget")
    return Choice(point.choice.score, point.choice.checkpoints, point.choice.segments,
                  (f"least recompute within {budget_bytes / 2**20:.0f} MB: a {point.policy} "
                   f"plan",))
