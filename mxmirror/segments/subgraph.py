"""A segment as a graph of its own: the sub-graph MXNet binds as one template.

Inputs are the values crossing the cut before the segment (state slots) and the
original variables it reads (parameter, statistic slots); outputs are the values
crossing the cut after it (flat, under BlockGrad) and the graph heads it computes,
each value that needs a gradient from outside closed by ``MakeLoss(dot(value, g))``.
Dropout becomes a multiplication with a mask slot, so every recomputation replays it.
"""

from __future__ import annotations

import json
from math import prod
from typing import Any

from mxmirror.ir import ops
from mxmirror.ir.backward import Spec
from mxmirror.ir.graph import AUX, FLOAT_DTYPES, INPUT, OP, PARAM, Entry, Graph, Node
from mxmirror.ir.symbol_json import to_json
from mxmirror.segments.model import Segment, Segments

_STRIP = {"__force_mirroring__", "__mirror_stage__", "mirror_stage"}


_PREFIX = {"state": "_s", "arg": "_a", "aux": "_x", "mask": "_m", "ograd": "_g", "hgrad": "_h"}


def make_segment(sg: Segments, index: int, ids: list[int], outputs: list[Entry],
                  heads: list[int], split: frozenset) -> Segment:
    """The segment as a graph of its own (Graph IR, built from the parent's nodes) and its
    MXNet symbol JSON (what the executor binds)."""
    graph = sg.graph
    sub: list[Node] = []
    local: dict[int, int] = {}
    var_of: dict[tuple, int] = {}
    slots: list[tuple[str, tuple]] = []
    per_kind: dict[str, int] = {}  # slots made so far, by kind
    inputs: list[Entry] = []
    ids_set = set(ids)

    def add(op: str, ins: list[Entry], shapes: list[tuple], dtypes: list[str],
            attrs: dict | None = None, flops: float = 0.0) -> int:
        sub.append(Node(len(sub), f"_o{len(sub)}", op, attrs or {}, ins, OP, list(shapes),
                        list(dtypes), flops=flops, visible=len(shapes)))
        return len(sub) - 1

    def like(e: Entry) -> tuple[list[tuple], list[str]]:
        return [sub[e[0]].shapes[e[1]]], [sub[e[0]].dtypes[e[1]]]

    def var(key: tuple, shape: tuple, dtype: str, grad: str) -> int:
        if key not in var_of:
            # one counter per kind, so that slots of the same role get the same name in
            # every template and share one array (shared_buffer)
            name = f"{_PREFIX[key[0]]}{per_kind.get(key[0], 0)}"
            per_kind[key[0]] = per_kind.get(key[0], 0) + 1
            kind = AUX if key[0] == "aux" else (INPUT if grad == "null" else PARAM)
            if kind == AUX:  # shared_exec lends its aux arrays by name: name the shape
                name += "_" + "x".join(map(str, shape)) + "_" + dtype
            sub.append(Node(len(sub), name, None, kind=kind, shapes=[tuple(shape)],
                            dtypes=[dtype], grad_req="null" if kind == AUX else grad))
            var_of[key] = len(sub) - 1
            slots.append((name, key))
            if key[0] == "state":
                inputs.append(key[1])
        return var_of[key]

    def ref(src: int, k: int, reader: int | None = None) -> Entry:
        nd = graph.nodes[src]
        if nd.is_variable:
            kind = "aux" if nd.kind == AUX else "arg"
            use = (reader,) if nd.name in split else ()  # a slot per reading node
            return (var((kind, nd.name) + use, nd.shapes[0], nd.dtypes[0],
                        "null" if nd.grad_req == "null" else "write"), 0)
        if src in local:
            return (local[src], k)
        return (var(("state", (src, k)), nd.shapes[k], nd.dtypes[k], "write"), 0)

    # boundary inputs first, largest first: slots of a role are then named by size in
    # every template, and the arrays they share across templates stay small
    ext = []
    for nid in ids:
        for src, k in graph.nodes[nid].inputs:
            if not graph.nodes[src].is_variable and src not in ids_set and (src, k) not in ext:
                ext.append((src, k))
    for src, k in sorted(ext, key=lambda e: -graph.entry_bytes(e)):
        ref(src, k)
    flops = 0.0
    for nid in ids:
        nd = graph.nodes[nid]
        flops += nd.flops
        ins = [ref(s, k, nid) for s, k in nd.inputs]
        if ops.replayed_with_mask(nd.op):
            src = graph.nodes[nd.inputs[0][0]]
            k = nd.inputs[0][1]
            mask = var(("mask", nid), src.shapes[k], src.dtypes[k], "null")
            local[nid] = add("elemwise_mul", [ins[0], (mask, 0)], *like(ins[0]))
        else:
            attrs = {k: v for k, v in nd.attrs.items() if k not in _STRIP}
            local[nid] = add(nd.op, ins, nd.shapes[:nd.visible], nd.dtypes[:nd.visible],
                             attrs, nd.flops)
            copy = sub[local[nid]]  # the node's own template: same op, inputs and shapes
            copy.template, copy.backward_sizes = nd.template, nd.backward_sizes
            copy.shapes, copy.dtypes = list(nd.shapes), list(nd.dtypes)
    # Outputs: every boundary value under BlockGrad (in place, no head gradient), then the
    # graph heads, then one MakeLoss(dot(value, gradient-input)) per value that needs a
    # gradient from outside: its backward hands the gradient input to the value exactly
    # (1 * g), and MXNet allocates no head-gradient array per executor for a loss.
    head_refs: list[Entry] = []
    losses = []
    # (of equal size, the last made first where weights have a slot per use: the backward
    # then visits, and writes, the later uses of a weight first, as MXNet's sum adds them)
    outputs = sorted(outputs[::-1] if split else outputs, key=lambda e: -graph.entry_bytes(e))
    for e in outputs:
        # the value leaves flat (the executor reads it through views of that shape): with
        # MKL-DNN, the reshape reorders a blocked layout to plain once, and both the output
        # and the loss read that
        flat = _flat(add, (local[e[0]], e[1]), sub)
        head_refs.append((add("BlockGrad", [flat], *like(flat)), 0))
        g = var(("ograd", e), (prod(graph.nodes[e[0]].shapes[e[1]]),),
                graph.nodes[e[0]].dtypes[e[1]], "null")
        losses.append((flat, g))
    for j in heads:
        s, k = graph.heads[j]
        mine = (local[s], k)
        if graph.nodes[s].op in ops.LOSSES or graph.nodes[s].op in ("BlockGrad",
                                                                    "stop_gradient"):
            head_refs.append(mine)
        else:
            head_refs.append((add("BlockGrad", [mine], *like(mine)), 0))
            losses.append((_flat(add, mine, sub), var(("hgrad", j),
                                                       (prod(graph.nodes[s].shapes[k]),),
                                                       graph.nodes[s].dtypes[k], "null")))
    for flat, g in losses:
        # loss = dot(o, g) of two vectors: its backward gives o the gradient g exactly
        # (1 * g_i), and the forward is one BLAS dot product (MXNet's sum over all axes of
        # o * g cost as much as a convolution; the same dot of a row and a column, a gemm
        # of m = n = 1, ran 15x slower than this vector dot). The gradient-input slot g is
        # flat too (the executor fills it through a view of the value's shape): a reshape
        # of it would be a copy made in the forward, before the executor has filled it
        dtype = sub[flat[0]].dtypes[flat[1]]
        total = add("dot", [flat, (g, 0)], [(1,)], [dtype])
        head_refs.append((add("MakeLoss", [(total, 0)], [(1,)], [dtype]), 0))
    sub_graph = Graph(sub, head_refs, templates=graph.templates)
    text = to_json(sub_graph)
    args = [n for n in sub if n.is_variable and n.kind != AUX]
    shapes = {n.name: n.shapes[0] for n in args}
    types = {n.name: n.dtypes[0] for n in sub if n.is_variable}
    req = {n.name: n.grad_req for n in args}
    key = json.dumps([text, sorted(shapes.items()), sorted(types.items()),
                      sorted(req.items())])
    sg.slot_shapes[key] = shapes
    sg.slot_types[key] = types
    sg.slot_req[key] = req
    return Segment(index, ids, inputs, list(outputs), heads, slots, text, key, flops,
                   sub_graph, key)


def _flat(add: Any, value: Entry, sub: list[Node]) -> Entry:
    """`value` reshaped (in place) to one dimension, a node added with `add`."""
    n, dtype = prod(sub[value[0]].shapes[value[1]]), sub[value[0]].dtypes[value[1]]
    return (add("Reshape", [value], [(n,)], [dtype], {"shape": "(-1,)"}), 0)


def added_specs(graph: Graph) -> list[Spec]:
    """The specs of every node ``make_segment`` may add to a sub-graph of `graph` (its own
    nodes keep their templates): for any value that may cross a cut, its flat Reshape,
    BlockGrad, ``dot`` with its gradient input and MakeLoss (a float value: an integer one
    needs no gradient, and MXNet has no loss of one); for a head, its BlockGrad;
    for a Dropout, the multiplication with its mask. The MXNet side learns their templates
    with the graph's own, so that planning segments needs no MXNet."""
    values = {(tuple(n.shapes[k]), n.dtypes[k]) for n in graph.op_nodes
              for k in range(n.visible) if n.dtypes[k] in FLOAT_DTYPES}
    heads = {(tuple(graph.nodes[s].shapes[k]), graph.nodes[s].dtypes[k])
             for s, k in graph.heads if not graph.nodes[s].is_variable}
    masked = {(tuple(graph.nodes[n.inputs[0][0]].shapes[n.inputs[0][1]]),
               graph.nodes[n.inputs[0][0]].dtypes[n.inputs[0][1]])
              for n in graph.op_nodes if ops.replayed_with_mask(n.op)}

    def one(op: str, shapes: list, dtypes: list, out: list, attrs: dict | None = None) -> Spec:
        return {"op": op, "attrs": attrs or {}, "shapes": [list(x) for x in shapes],
                "dtypes": dtypes, "aux": [], "num_visible": len(out),
                "out_shapes": [list(x) for x in out]}

    out = []
    for shape, dtype in sorted(values):
        flat = (prod(shape),)
        out += [one("Reshape", [shape], [dtype], [flat], {"shape": "(-1,)"}),
                one("BlockGrad", [flat], [dtype], [flat]),
                one("dot", [flat, flat], [dtype, dtype], [(1,)]),
                one("MakeLoss", [(1,)], [dtype], [(1,)])]
    out += [one("BlockGrad", [shape], [dtype], [shape]) for shape, dtype in sorted(heads)]
    out += [one("elemwise_mul", [shape, shape], [dtype, dtype], [shape])
            for shape, dtype in sorted(masked)]
    return out
