"""Backward templates attached to a graph's op nodes, by look-up in its TemplateTable.

What each op node needs of its template: the template itself, its hidden forward outputs
(BatchNorm's mean and variance, Dropout's mask, a pooling workspace) and the elements of
every output of every backward node. ``specs`` says what the MXNet side must learn for a
graph (``adapter.reader`` learns what the table lacks); ``attach`` never learns: a
signature missing from the table is an error, so planning needs no MXNet.
"""

from __future__ import annotations

from math import prod

from mxmirror.errors import PlanError
from mxmirror.ir.graph import AUX, Graph, Node
from mxmirror.ir.templates import Template, TemplateTable, signature

Spec = dict  # what a learner needs to bind one op alone (see spec())


def spec(graph: Graph, n: Node) -> Spec:
    """What the learner needs to bind this node alone, and what its template depends on."""
    return {"op": n.op, "attrs": {k: v for k, v in n.attrs.items() if not k.startswith("__")},
            "shapes": [list(graph.nodes[s].shapes[k]) for s, k in n.inputs],
            "dtypes": [graph.nodes[s].dtypes[k] for s, k in n.inputs],
            "aux": [j for j, (s, _) in enumerate(n.inputs) if graph.nodes[s].kind == AUX],
            "num_visible": len(n.shapes[:n.visible]),
            "out_shapes": [list(x) for x in n.shapes[:n.visible]]}


def key(sp: Spec, literal: bool = False) -> str:
    return signature(sp["op"], sp["attrs"], sp["shapes"], sp["aux"], sp["dtypes"],
                     literal=literal, out_shapes=sp["out_shapes"])


def lookup(table: TemplateTable, sp: Spec) -> Template | None:
    """The template of a spec: by its signature, or by its exact shapes where the template
    learned for the signature depends on them (``Template.literal``)."""
    tpl = table.get(key(sp))
    return table.get(key(sp, literal=True)) if tpl is not None and tpl.literal else tpl


def missing(table: TemplateTable, specs: list[Spec]) -> dict[str, Spec]:
    """The signatures to learn for `specs` (a literal template's exact key once its
    signature is known), each with one spec."""
    out: dict[str, Spec] = {}
    for sp in specs:
        if lookup(table, sp) is None:
            out.setdefault(key(sp, literal=table.get(key(sp)) is not None), sp)
    return out


def attach(graph: Graph) -> None:
    """Give every op node without a template its template from ``graph.templates``, its
    hidden outputs' shapes and its backward nodes' sizes. PlanError where the table has no
    template for a node (the MXNet side learns them before planning)."""
    table = graph.templates
    for n in graph.op_nodes:
        if n.template is not None:
            continue
        tpl = lookup(table, spec(graph, n)) if table is not None else None
        if tpl is None:
            raise PlanError(f"no backward template for {n.name} ({n.op})")
        n.template = tpl
        in_shapes = [graph.nodes[s].shapes[k] for s, k in n.inputs]
        for ref in tpl.fwd_out_shapes[len(n.shapes):]:
            if ref[0] == "in":
                n.shapes.append(tuple(in_shapes[ref[1]]))
            elif ref[0] == "out":
                n.shapes.append(tuple(n.shapes[ref[1]]))
            else:
                n.shapes.append(tuple(ref[1]))
            n.dtypes.append(n.dtypes[0] if n.dtypes else "float32")
        n.backward_sizes = [[_ref_size(s, in_shapes, n.shapes) for s in tn.out_shapes]
                            for tn in tpl.nodes]


def _ref_size(ref: tuple, in_shapes: list[tuple], out_shapes: list[tuple]) -> int:
    """Elements of a template shape reference: like input j, like output k, or literal."""
    if ref[0] == "in":
        return prod(in_shapes[ref[1]])
    if ref[0] == "out":
        return prod(out_shapes[ref[1]])
    return prod(ref[1])
