"""MXNet symbol JSON written from the Graph IR, and mirror attributes set in symbol JSON:
the one place mxmirror emits symbol JSON."""

from __future__ import annotations

import json

from mxmirror.ir.graph import AUX, Graph

MIRROR_KEY = "__force_mirroring__"


def to_json(graph: Graph) -> str:
    """MXNet symbol JSON of a graph built here. A mutated input (aux state) is read at
    version 1, as MXNet writes it; at version 0 BatchNorm's update of its running
    statistics is lost."""
    nodes = []
    for n in graph.nodes:
        if n.is_variable:
            nodes.append({"op": "null", "name": n.name, "inputs": []})
            continue
        node = {"op": n.op, "name": n.name, "inputs": [
            [s, k, 1 if graph.nodes[s].kind == AUX else 0] for s, k in n.inputs]}
        if n.attrs:
            node["attrs"] = n.attrs
        nodes.append(node)
    data = {"nodes": nodes,
            "arg_nodes": [n.id for n in graph.nodes if n.is_variable],
            "heads": [[s, k, 0] for s, k in graph.heads],
            "attrs": {"mxnet_version": ["int", 10901]}}
    return json.dumps(data, sort_keys=True)


def annotate_json(symbol_json: str, mirrored: set[int] | frozenset[int]) -> str:
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


def node_table(symbol_json: str) -> list[tuple[str, str]]:
    """(name, op) of every node, in the symbol's order: a Graph's nodes, by id, without
    reading the graph (op "null": a variable)."""
    return [(n["name"], n["op"]) for n in json.loads(symbol_json)["nodes"]]


def strip_json(symbol_json: str) -> str:
    """The symbol without any mirror attribute (the unplanned graph); the text itself when
    it has none."""
    return annotate_json(symbol_json, set()) if MIRROR_KEY in symbol_json else symbol_json
