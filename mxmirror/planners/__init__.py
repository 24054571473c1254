"""Planning policies, by name. Each takes a Graph and returns a Plan, scored by the simulator."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import PlanError
from ..graph import Graph
from ..plan import Plan
from . import budget, cheap, multilevel, none, optimal, recursive, sqrt

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
    if plan.segmented is None and plan.planned_bytes > plan.baseline_bytes:
        # never worse than no plan
        plan.mirror_ids, plan.checkpoints = set(), []
        plan.planned_bytes, plan.recompute_ratio = plan.baseline_bytes, 0.0
        plan.notes.append("no recomputation lowers memory here: the graph is left as it is")
    plan.plan_seconds = time.perf_counter() - start
    return plan
