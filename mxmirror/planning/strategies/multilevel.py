"""Least recompute under a byte budget when segments may be recomputed several times:
the multi-level DP's schedule (planners.dp) run by the segmented executor."""

from __future__ import annotations

from mxmirror.planning.analysis import Analysis
from mxmirror.planning.choice import Choice, segmented_choice
from mxmirror.planning.dp import plan_for_budget


def choose(a: Analysis, budget_bytes: int | None = None) -> Choice:
    return segmented_choice(a, plan_for_budget(a, budget_bytes))
