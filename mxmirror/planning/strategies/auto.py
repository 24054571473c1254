"""Policy ``auto``: the budget policy on the memory the bind's device has free.

The caller measures the budget (``device_memory.auto_budget``: free memory less
arguments, gradients, aux states and a margin) or the user gives one. Where
everything fits nothing is recomputed; where even the smallest plan does not fit,
the smallest plan is used (the best chance to fit) and a note says so.
"""

from __future__ import annotations

from mxmirror.errors import PlanError
from mxmirror.planning.analysis import Analysis
from mxmirror.planning.budget_front import choose_within
from mxmirror.planning.choice import Choice


def choose(a: Analysis, budget_bytes: int | None = None) -> Choice:
    if budget_bytes is None:
        raise PlanError("policy 'auto' needs the bind's context to measure free memory "
                        "(mxmirror.plan(..., ctx=...), the bind hook) or a budget")
    return choose_within(a, budget_bytes, or_smallest=True)
