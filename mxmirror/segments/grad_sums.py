"""Which weight gradients a template may add straight into the user's gradient array.

A weight read by several segments (an unrolled LSTM's layer weights) gets one gradient
contribution per use. MXNet's whole-graph executor sums them with its own expression, as
``sim.gradient_pass`` states it: the contributions in the order the gradient pass visits
their readers (``backward_order``), zeros dropped (a weight's never are, so the model keeps
every contribution); one is used as is; fewer than the in-place sum cap go to one
ElementWiseSum (``add_n``), whose CPU kernel adds 2-4 inputs right to left
(``a + (b + (c + d))``) and 5 or more left to right; more go to a left-to-right chain of
``_grad_add`` (``sum_op``). Float sums depend on that expression.

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

A segment holding several uses of a weight may instead get a slot per use
(``split_uses``, ``segments.build_segments``): every such slot is bound to the user's
weight and, grad_req ``add``, to the user's gradient array (MXNet takes one array as the
gradient of several arguments). No sum is made in the template then: each use's
operator adds its term onto the array, in the order the template's executor pushes
those operators (the engine runs the writes of one array in push order; ``_writers``
reads that order off the simulated training graph). That is a chain, MXNet's own sum
for 5 or more uses when the later uses are written first.

``weight_sums`` models these expressions on the graph and binds a weight in place only
where its sum is then MXNet's own expression, term for term; elsewhere the slot path
stays. Where the slot path is not MXNet's expression either (e.g. 2-4 uses in one segment
with some in another), the weight is inexact, and the planner does not use those
segments (``Segments.exact``; the same rule for values read in several segments:
``value_sums``).
"""

from __future__ import annotations

from math import prod
from typing import Any

from mxmirror.ir import backward
from mxmirror.ir.graph import PARAM, Graph
from mxmirror.sim import gradient_pass, training_graph

# rows of a FullyConnected input up to which BLAS reduces the weight's gradient in one
# block, so that accumulating (beta 1) rounds like writing and adding: measured exact up to
# 256 rows with MKL-DNN off on OpenBLAS here (not at 384); half that for other CPUs' blocks
_FC_ROWS = 128

Expr = Any  # a contribution (node id, input index), "user", or (op, operands...)


def split_uses(sg: Any) -> frozenset:
    """Weights worth a slot per use (segments.build_segments): read by several nodes of
    one segment, bound to the user's arrays, and not added in place with one slot. With a
    slot per use, each use's term is added onto the user's gradient by the operator that
    computes it, in the order the template's backward runs them: a chain, as MXNet sums 5
    or more terms (2 in either order), so that is exact where one slot (its own
    ElementWiseSum) is not."""
    graph = sg.graph
    many: set[str] = set()
    exact_adds: dict[str, bool] = {}  # every use's operator adds as "write, then add"
    for seg in sg.segments:
        readers: dict[str, set] = {}
        for nid in seg.nodes:
            for j, (src, _) in enumerate(graph.nodes[nid].inputs):
                v = graph.nodes[src]
                if v.is_variable and v.grad_req != "null":
                    readers.setdefault(v.name, set()).add(nid)
                    exact_adds[v.name] = exact_adds.get(v.name, True) and \
                        _adds_exactly(graph, (nid, j))
        many |= {name for name, r in readers.items() if len(r) > 1 and exact_adds[name]}
    if not many:
        return frozenset()
    bound = {key[1] for seg in sg.segments for name, key in seg.slots
             if (seg.key, name) in sg.user_slots}
    return frozenset(w for w in many & bound if not sg.weight_sums.get(w, ((), False))[0])


def weight_sums(sg: Any) -> dict[str, tuple[frozenset, bool]]:
    """Weight name -> (its slots added in place, whether the segmented executor then sums
    its gradient with MXNet's own expression), for every weight a segment reads."""
    graph = sg.graph
    cap = gradient_pass.inplace_sum_cap()
    # per weight: its template slots, and per segment its slots with their contributions
    # in the template's own order
    slots: dict[str, set] = {}
    groups: dict[str, dict[int, list]] = {}
    for seg in sg.segments:
        local = _template_contributions(seg)
        for name, key in seg.slots:
            if key[0] == "arg" and sg.slot_req[seg.key].get(name) != "null":
                slots.setdefault(key[1], set()).add((seg.key, name))
                groups.setdefault(key[1], {}).setdefault(seg.index, []).append(
                    (name, local.get(name, [])))
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
    MXNet's gradient pass collects them (its readers' backward order, inputs in order)."""
    out: dict[int, list] = {}
    for nd in gradient_pass.backward_order(order):
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
    local = _contributions(sub, sub.forward_order)
    return {sub.nodes[var].name: [(parent[n], j) for n, j in cs]
            for var, cs in local.items() if all(n in parent for n, _ in cs)}


def _segmented(user: Expr, groups: dict[int, list], sg: Any, graph: Graph, cap: int,
               bound: frozenset) -> Expr:
    """The sum the segmented executor computes, segments backward from the last: in place
    where its template's slots are bound (each slot's terms onto the user's array, in the
    order the template's backward writes them), else each slot's sum added in slot order."""
    acc = user
    for i in sorted(groups, reverse=True):
        seg = sg.segments[i - 1]
        uses = groups[i]
        if any((seg.key, name) in bound for name, _ in uses):
            ranked = _write_order(seg, [name for name, _ in uses])
            if ranked is None:
                return ("unknown",)
            for _, terms in sorted(uses, key=lambda u: ranked[u[0]]):
                acc = _into(acc, terms, graph, cap) if terms else acc
        else:
            for _, terms in uses:
                if terms:
                    acc = _sum(terms, cap) if acc is None else _plus(acc, _sum(terms, cap))
    return acc


def _write_order(seg: Any, names: list[str]) -> dict[str, int] | None:
    """Slot name -> position, in the template executor's run order, of the node that
    writes the gradient of that slot (MXNet pushes the nodes of its training graph in
    that order, and the engine runs the writes of one array in push order). None where
    two slots share a writer, or the sub-graph has no backward templates."""
    if len(names) == 1:
        return {names[0]: 0}
    writers = _writers(seg.graph, seg.structure)
    if writers is None:
        return None
    ranked = {name: writers[name] for name in names}
    return ranked if len(set(ranked.values())) == len(ranked) else None


_WRITERS: dict[str, dict[str, int] | None] = {}  # segment structure -> _writers


def _writers(sub: Graph, structure: str) -> dict[str, int] | None:
    """Parameter slot name -> position of its gradient's writer in the training graph of
    a template (the same for every template of that structure)."""
    if structure not in _WRITERS:
        if len(_WRITERS) > 256:
            _WRITERS.clear()
        out = None
        if sub.templates is not None:
            backward.attach(sub)
            tg = training_graph.build(sub, set())
            pos = {id(n): i for i, n in enumerate(tg.nodes)}
            params = [n.name for n in sub.forward_order if n.kind == PARAM]
            out = {name: pos[id(tg.outputs[tg.num_forward_outputs + j][0])]
                   for j, name in enumerate(params)}
        _WRITERS[structure] = out
    return _WRITERS[structure]


def _into(acc: Expr, terms: list, graph: Graph, cap: int) -> Expr:
    """`terms` summed by MXNet's gradient aggregation into an array holding `acc`
    (grad_req add; None: write)."""
    if acc is None:
        return _sum(terms, cap)
    if len(terms) == 1:
        c = terms[0]
        return _plus(acc, c) if _adds_exactly(graph, c) else ("addto", acc, c)
    if len(terms) >= 5 and gradient_pass.sum_op(len(terms), cap) == "add_n":
        # ElementWiseSum's kernel: onto the array, one by one
        for t in terms:
            acc = _plus(acc, t)
        return acc
    return _plus(acc, _sum(terms, cap))


def _sum(terms: list, cap: int) -> Expr:
    """AggregateGradient's expression for `terms` (ElementWiseSum or a _grad_add chain)."""
    op = gradient_pass.sum_op(len(terms), cap)
    if op is None:
        return terms[0]
    if op == "add_n" and len(terms) <= 4:
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
