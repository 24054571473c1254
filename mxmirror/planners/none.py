"""No plan: MXNet's default in-place + sharing, nothing recomputed."""

from __future__ import annotations

from ..graph import Graph
from ..plan import Plan
from .common import score


def plan(graph: Graph, budget_bytes: int | None = None) -> Plan:
    base = score(graph, set())
    return Plan("none", graph, set(), [], base.planned_bytes, base.planned_bytes, 0.0)
