"""Which weight gradients a template may add straight into the user's gradient array.

A weight read by several segments (an unrolled LSTM's layer weights) gets one gradient
contribution per use. MXNet's whole-graph executor sums them with its own expression
(``AggregateGradient`` in src/executor/graph_executor.cc of 1.9.1): the contributions in
the reverse of the forward DFS order (nnvm's gradient pass), zeros dropped (a weight's
never are, so the model keeps every contribution); one is used
as is; fewer than ``MXNET_EXEC_INPLACE_GRAD_SUM_CAP`` (8) go to one ``ElementWiseSum``,
whose CPU kernel adds 2-4 inputs right to left (``a + (b + (c + d))``) and 5 or more left
to right; more go to a left-to-right chain of ``_grad_add``. Float sums depend on that
expression.

The segmented executor sums a weight's gradient segment by segment, last segment first.
Either (the slot path) the template writes its own sum into a slot, which is then added
into the user's array; or (in place) the template's gradient *is* the user's array,
bound with grad_req ``add``, which saves the slot (the user's array is zeroed before the
backward where the user asked for ``write``). In place, the template's last gradient
operator accumulates: ``ElementWiseSum`` adds its inputs one by one onto the array for 5-7
inputs, else adds its whole sum; a single contribution is accumulated by the operator
that computes it, which rounds like a separate add only for FullyConnected's bias and,
with few rows, its weight (one BLAS block, see ``_FC_ROWS``); Embedding, Convolution and
others do not (measured).

``weight_sums`` models all three expressions on the graph and binds a weight in place
only where its sum is then MXNet's own expression, term for term; elsewhere the slot path
stays (which may itself differ from MXNet, e.g. when a segment holds several of a
weight's uses: issue 13, item 5).
"""

from __future__ import annotations

import os
from math import prod
from typing import Any

from .graph import Graph, post_order

# rows of a FullyConnected input up to which BLAS reduces the weight's gradient in one
# block, so that accumulating (beta 1) rounds like writing and adding: measured exact up to
# 256 rows with MKL-DNN off on OpenBLAS here (not at 384); half that for other CPUs' blocks
_FC_ROWS = 128

Expr = Any  # a contribution (node id, input index), "user", or (op, operands...)


def added_in_place(sg: Any) -> frozenset:
    """(template key, slot name) of the user-bound parameter slots (Segments.user_slots)
    whose gradient the template adds straight into the user's gradient array. `sg`: a
    segments.Segments."""
    return frozenset(s for slots, _ in weight_sums(sg).values() for s in slots)


def weight_sums(sg: Any) -> dict[str, tuple[frozenset, bool]]:
    """Weight name -> (its slots added in place, whether the segmented executor then sums
    its gradient with MXNet's own expression), for every weight a segment reads."""
    graph = sg.graph
    cap = int(os.environ.get("MXNET_EXEC_INPLACE_GRAD_SUM_CAP", "8"))
    # per weight: its template slots, and its contributions per segment in the template's
    # own order
    slots: dict[str, set] = {}
    groups: dict[str, dict[int, list]] = {}
    for seg in sg.segments:
        local = _template_contributions(seg)
        for name, key in seg.slots:
            if key[0] == "arg" and sg.slot_req[seg.key].get(name) != "null":
                slots.setdefault(key[1], set()).add((seg.key, name))
                groups.setdefault(key[1], {})[seg.index] = local.get(name, [])
    out = {}
    for var, v in _contributions(graph, graph.forward_order).items():
        name = graph.nodes[var].name
        if name not in groups:
            continue
        user = "user" if graph.nodes[var].grad_req == "add" else None
        whole = _into(user, v, graph, cap)
        bound = frozenset(slots[name] & sg.user_slots)
        if bound and _segmented(user, groups[name], sg, graph, cap, bound) == whole:
            out[name] = (bound, True)
        else:
            out[name] = (frozenset(), _segmented(user, groups[name], sg, graph, cap,
                                                 frozenset()) == whole)
    return out


def _contributions(graph: Graph, order: list) -> dict[int, list]:
    """Variable id -> its gradient contributions (reader id, input index), in the order
    MXNet's gradient pass collects them (reverse forward order, inputs in order)."""
    out: dict[int, list] = {}
    for nd in reversed(order):
        if nd.is_variable:
            continue
        for j, (src, _) in enumerate(nd.inputs):
            if graph.nodes[src].is_variable and graph.nodes[src].grad_req != "null":
                out.setdefault(src, []).append((nd.id, j))
    return out


def _template_contributions(seg: Any) -> dict[str, list]:
    """Slot name -> its contributions in the template's own gradient pass (DFS from the
    template's heads), named by the parent graph's node ids (the template's first op
    nodes are the segment's nodes, in order)."""
    sub = seg.graph
    ops_ = [n.id for n in sub.nodes if not n.is_variable]
    parent = dict(zip(ops_, seg.nodes))
    order = [sub.nodes[i] for i in post_order([h[0] for h in sub.heads],
                                              lambda i: [s for s, _ in sub.nodes[i].inputs])]
    local = _contributions(sub, order)
    return {sub.nodes[var].name: [(parent[n], j) for n, j in cs]
            for var, cs in local.items() if all(n in parent for n, _ in cs)}


def _segmented(user: Expr, groups: dict[int, list], sg: Any, graph: Graph, cap: int,
               bound: set) -> Expr:
    """The sum the segmented executor computes, segments backward from the last, each
    in place where its template's slot is bound."""
    acc = user
    for i in sorted(groups, reverse=True):
        seg = sg.segments[i - 1]
        terms = groups[i]
        if not terms:
            continue
        if any(seg.key == key for key, _ in bound):
            acc = _into(acc, terms, graph, cap)
        else:
            acc = _sum(terms, cap) if acc is None else _plus(acc, _sum(terms, cap))
    return acc


def _into(acc: Expr, terms: list, graph: Graph, cap: int) -> Expr:
    """`terms` summed by MXNet's gradient aggregation into an array holding `acc`
    (grad_req add; None: write)."""
    if acc is None:
        return _sum(terms, cap)
    if len(terms) == 1:
        c = terms[0]
        return _plus(acc, c) if _adds_exactly(graph, c) else ("addto", acc, c)
    if 5 <= len(terms) < cap:  # ElementWiseSum's kernel: onto the array, one by one
        for t in terms:
            acc = _plus(acc, t)
        return acc
    return _plus(acc, _sum(terms, cap))


def _sum(terms: list, cap: int) -> Expr:
    """AggregateGradient's expression for `terms` (ElementWiseSum or a _grad_add chain)."""
    if len(terms) == 1:
        return terms[0]
    if len(terms) < cap and len(terms) <= 4:
        acc = terms[-1]
        for t in reversed(terms[:-1]):
            acc = _plus(t, acc)
        return acc
    acc = terms[0]
    for t in terms[1:]:
        acc = _plus(acc, t)
    return acc


def _plus(a: Expr, b: Expr) -> Expr:
    """a + b: IEEE addition is commutative, so the operands are kept in a fixed order."""
    return ("+",) + tuple(sorted((a, b), key=hash))


def _adds_exactly(graph: Graph, c: tuple) -> bool:
    """Whether the operator making contribution `c` with grad_req add rounds like writing
    it and adding (FullyConnected's bias; its weight over at most _FC_ROWS rows)."""
    nd = graph.nodes[c[0]]
    if nd.op != "FullyConnected" or c[1] not in (1, 2):
        return False
    if c[1] == 2:
        return True
    src, k = nd.inputs[0]
    shape = graph.nodes[src].shapes[k]
    flat = str(nd.attrs.get("flatten", "True")).lower() in ("true", "1")
    rows = shape[0] if flat else prod(shape[:-1])
    return rows <= _FC_ROWS
