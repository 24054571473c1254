"""Least recompute whose planned memory fits a byte budget.

The answer is read from the Pareto front over every plan family (planners.front):
monotone in the budget, and impossible only below the smallest figure any family
reaches, which the error names with the policy that reached it.
"""

from __future__ import annotations

from mxmirror.planning.analysis import Analysis
from mxmirror.planning.budget_front import choose_within
from mxmirror.planning.choice import Choice


def choose(a: Analysis, budget_bytes: int | None = None) -> Choice:
    return choose_within(a, budget_bytes)
