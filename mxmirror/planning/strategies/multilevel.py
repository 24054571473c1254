"""Least recompute under a byte budget when segments may be recomputed several times:
the multi-level DP's schedule (planners.dp) run by the segmented executor, on the chains
whose segments sum every gradient as MXNet does (else the one-recompute plan)."""

from __future__ import annotations

from mxmirror.planning.analysis import Analysis
from mxmirror.planning.budget_front import one_recompute_instead
from mxmirror.planning.choice import Choice, segmented_choice
from mxmirror.planning.dp import chains, no_exact_chain, plan_for_budget


def choose(a: Analysis, budget_bytes: int | None = None) -> Choice:
    if not chains(a):
        return one_recompute_instead(a, budget_bytes, no_exact_chain(a))
    return segmented_choice(a, plan_for_budget(a, budget_bytes))
