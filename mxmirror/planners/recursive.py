"""The paper's recursive plan (Section 4.2, k = 1): O(log n) memory, O(n log n) recompute.

The forward graph is cut at every candidate cut into a chain of segments; the
backward pass splits every range of segments at its midpoint, keeps only the
state there, and recurses (segmented.binary_tree). Each segment's forward is
run about log2(n) times, so this needs the segmented executor (MXNet's
attribute mirroring recomputes a node at most once).
"""

from __future__ import annotations

from ..graph import Graph
from ..plan import Plan
from ..segments import binary_tree
from .multilevel import chain, segmented_plan


def plan(graph: Graph, budget_bytes: int | None = None) -> Plan:
    sg, sp = chain(graph)
    assert sp.tree == binary_tree(sg.m)
    return segmented_plan("recursive", graph, sp,
                          notes=[f"{sg.m} segments, binary recursion: each segment's "
                                 f"forward runs at most {max(sp.dry.runs, default=0)} times"])
