"""The Plan value and writing it into a symbol as MXNet's own mirror attributes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .graph import Graph

MIRROR_KEY = "__force_mirroring__"


@dataclass
class Plan:
    """What to recompute, what to keep, and what it costs."""

    policy: str
    graph: Graph
    mirror_ids: set[int]  # ids (JSON node index) of recomputed nodes
    checkpoints: list[str]  # names of kept segment boundaries
    baseline_bytes: int
    planned_bytes: int
    recompute_ratio: float  # extra forward FLOPs / forward FLOPs
    plan_seconds: float = 0.0
    skipped: dict[str, str] = field(default_factory=dict)  # node -> why it was not mirrored
    source_json: str | None = None  # the symbol as given, for Plan.symbol
    notes: list[str] = field(default_factory=list)
    # segmented plans (several recomputations per node): a segments.SegmentPlan, run by
    # mxmirror.simple_bind through executor.SegmentedExecutor; None for attribute plans
    segmented: Any = None

    @property
    def mirrored(self) -> list[str]:
        """Names of the recomputed nodes, in graph order."""
        return [n.name for n in self.graph.nodes if n.id in self.mirror_ids]

    @property
    def baseline_mb(self) -> float:
        return self.baseline_bytes / 2**20

    @property
    def planned_mb(self) -> float:
        return self.planned_bytes / 2**20

    @property
    def symbol(self) -> Any:
        """A copy of the symbol with the plan in its attributes; plain MXNet binds it."""
        import mxnet as mx

        if self.segmented is not None:
            from .errors import PlanError

            raise PlanError(f"policy {self.policy!r} recomputes nodes more than once, which "
                            f"MXNet's own executor cannot do: bind it with "
                            f"mxmirror.simple_bind or inside mxmirror.enabled()")
        if self.source_json is None:
            raise ValueError("this plan was made from a graph without a symbol")
        return mx.sym.load_json(annotate_json(self.source_json, self.mirror_ids))

    def to_dict(self) -> dict:
        return {
            "policy": self.policy,
            "nodes": len(self.graph.op_nodes),
            "mirrored": list(self.mirrored),
            "checkpoints": list(self.checkpoints),
            "baseline_mb": round(self.baseline_mb, 3),
            "planned_mb": round(self.planned_mb, 3),
            "recompute_ratio": round(self.recompute_ratio, 4),
            "plan_seconds": round(self.plan_seconds, 3),
            **({"segmented": self.segmented.describe()} if self.segmented is not None else {}),
        }

    def summary(self) -> str:
        return (f"mxmirror: policy={self.policy} baseline={self.baseline_mb:.0f} MB "
                f"planned={self.planned_mb:.0f} MB recompute={self.recompute_ratio:.2f}x "
                f"mirrored={len(self.mirrored)} nodes")


def annotate_json(symbol_json: str, mirrored: set[int]) -> str:
    """Set __force_mirroring__ on exactly the mirrored nodes (by index); clear it elsewhere."""
    data = json.loads(symbol_json)
    for i, node in enumerate(data["nodes"]):
        if node["op"] == "null":
            continue
        key = "attrs" if "attrs" in node or "attr" not in node else "attr"
        attrs = dict(node.get(key) or {})
        attrs.pop(MIRROR_KEY, None)
        if i in mirrored:
            attrs[MIRROR_KEY] = "True"
        node[key] = attrs
    return json.dumps(data)


def strip_json(symbol_json: str) -> str:
    """The symbol without any mirror attribute (the unplanned graph)."""
    return annotate_json(symbol_json, set())
