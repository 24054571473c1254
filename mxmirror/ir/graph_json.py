"""A Graph as JSON and back: the forward graph with its shapes, dtypes, kinds, FLOPs and
the templates of its signatures, so that it can be planned where MXNet is not importable
(tests/test_structure.py) or kept beside a plan."""

from __future__ import annotations

from typing import Any

from mxmirror.ir import backward
from mxmirror.ir.graph import Graph, Node
from mxmirror.ir.templates import Template


def dump(graph: Graph) -> dict[str, Any]:
    """The graph as JSON values (visible outputs only: the templates give the rest)."""
    return {
        "nodes": [{"id": n.id, "name": n.name, "op": n.op, "attrs": n.attrs,
                   "inputs": [list(e) for e in n.inputs], "kind": n.kind,
                   "shapes": [list(s) for s in n.shapes[:n.visible]],
                   "dtypes": n.dtypes[:n.visible], "flops": n.flops,
                   "grad_req": n.grad_req, "visible": n.visible} for n in graph.nodes],
        "heads": [list(h) for h in graph.heads],
        "templates": {k: t.to_json() for k, t in (graph.templates or {}).items()},
    }


def load(data: dict[str, Any]) -> Graph:
    """The graph `dump` wrote, its templates attached again (no MXNet)."""
    nodes = [Node(id=d["id"], name=d["name"], op=d["op"], attrs=dict(d["attrs"]),
                  inputs=[(s, k) for s, k in d["inputs"]], kind=d["kind"],
                  shapes=[tuple(s) for s in d["shapes"]], dtypes=list(d["dtypes"]),
                  flops=float(d["flops"]), grad_req=d["grad_req"], visible=d["visible"])
             for d in data["nodes"]]
    graph = Graph(nodes, [(s, k) for s, k in data["heads"]],
                  templates={k: Template.from_json(t) for k, t in data["templates"].items()})
    backward.attach(graph)
    return graph
