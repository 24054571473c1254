"""Planning policies, by name. Each takes a Graph and returns a Plan, scored by the simulator."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import PlanError
from ..graph import Graph
from ..plan import Plan
from . import budget, cheap, multilevel, none, optimal, recursive, sqrt
from .common import prune_unread_mirrors, score

POLICIES: dict[str, Callable[..., Plan]] = {
    "none": none.plan,
    "sqrt": sqrt.plan,
    "cheap": cheap.plan,
    "budget": budget.plan,
    "optimal": optimal.plan,
    "recursive": recursive.plan,
    "multilevel": multilevel.plan,
}


def make_plan(graph: Graph, policy: str = "sqrt", budget_bytes: int | None = None) -> Plan:
    """Run a policy on a graph and time it."""
    fn = POLICIES.get(policy)
    if fn is None:
        raise PlanError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    if policy in ("budget", "multilevel") and budget_bytes is None:
        raise PlanError(f"policy {policy!r} needs a budget, e.g. --budget 800MB")
    start = time.perf_counter()
    plan = fn(graph, budget_bytes=budget_bytes)
    kept = plan.mirror_ids if plan.segmented is not None else prune_unread_mirrors(
        graph, plan.mirror_ids)  # a segmented plan's mirror_ids only name what reruns
    if kept != plan.mirror_ids:
        s = score(graph, kept)
        plan.mirror_ids, plan.planned_bytes, plan.recompute_ratio = (
            kept, s.planned_bytes, s.recompute_ratio)
    plan.plan_seconds = time.perf_counter() - start
    return plan
