"""The paper's "drop bn-relu": recompute only cheap ops, keep expensive outputs."""

from __future__ import annotations

from ..graph import Graph
from ..plan import Plan
from .common import mirror_blockers, op_order, score, segment_mirror


def cheap_mirror(graph: Graph) -> tuple[set[int], dict[int, str]]:
    blockers = mirror_blockers(graph)
    return segment_mirror(graph, op_order(graph), [], blockers, only_cheap=True), blockers


def plan(graph: Graph, budget_bytes: int | None = None) -> Plan:
    mirror, blockers = cheap_mirror(graph)
    base = score(graph, set())
    s = score(graph, mirror)
    if s.planned_bytes >= base.planned_bytes:  # nothing to gain: keep the graph as it is
        mirror, s = set(), base
    return Plan("cheap", graph, set(s.mirror), [], base.planned_bytes, s.planned_bytes,
                s.recompute_ratio, skipped=_names(graph, blockers))


def _names(graph: Graph, blockers: dict[int, str]) -> dict[str, str]:
    return {graph.nodes[i].name: why for i, why in blockers.items()}
