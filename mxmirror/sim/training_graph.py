"""The training graph exactly as MXNet 1.9.1 builds it, in its execution order.

This mirrors ``GraphExecutor::InitFullGraph`` and the ``MXGradient`` pass
(src/executor/graph_executor.cc, src/nnvm/gradient.cc): head-gradient hints,
one mirror copy per mirrored node, each op's backward nodes (from its learned
template), gradient aggregation (``add_n`` below 8 terms, a ``_grad_add`` chain
with control dependencies above), ``_copy`` for duplicated gradients, and
finally the post-order DFS from the outputs that gives the node order MXNet's
memory planner and executor use.
"""

from __future__ import annotations

from mxmirror.errors import PlanError
from mxmirror.ir.graph import PARAM, Graph, Node

INPLACE_SUM_CAP = 8  # MXNET_EXEC_INPLACE_GRAD_SUM_CAP default
ZERO_OPS = ("zeros_like", "_zeros")


class TNode:
    """A node of the training graph."""

    __slots__ = ("cdeps", "eid", "fwd", "inputs", "name", "op", "role", "sizes")

    def __init__(self, op: str | None, name: str, inputs: list, sizes: list[int],
                 role: str, fwd: int | None = None) -> None:
        self.op = op  # None: variable
        self.name = name
        self.inputs: list[tuple[TNode, int]] = inputs
        self.cdeps: list[TNode] = []
        self.sizes = sizes  # elements per output
        self.role = role  # var, fwd, mirror, bwd, sum, zeros, hint, copy
        self.fwd = fwd  # forward node id this node belongs to
        self.eid = -1  # first entry id, set by order()

    def __repr__(self) -> str:
        return f"TNode({self.op}, {self.name}, {self.role})"


class TrainingGraph:
    """Training graph nodes in MXNet's order, with entry ids and outputs."""

    def __init__(self, nodes: list[TNode], outputs: list[tuple[TNode, int]],
                 num_forward_outputs: int) -> None:
        self.nodes = nodes
        self.outputs = outputs
        self.num_forward_outputs = num_forward_outputs
        eid = 0
        for n in nodes:
            n.eid = eid
            eid += len(n.sizes)
        self.num_entries = eid

    def entry(self, e: tuple[TNode, int]) -> int:
        return e[0].eid + e[1]


def build(graph: Graph, mirror: set[int] | None = None) -> TrainingGraph:
    """Build the forward + backward (+ mirror) training graph for a mirror set (node ids)."""
    mirror = mirror_from_attrs(graph) if mirror is None else mirror
    topo = graph.forward_order
    fwd: dict[int, TNode] = {}
    for n in topo:
        if n.is_variable:
            fwd[n.id] = TNode(None, n.name, [], n.element_counts, "var", n.id)
        else:
            fwd[n.id] = TNode(n.op, n.name, [(fwd[s], k) for s, k in n.inputs], n.element_counts,
                              "fwd", n.id)
    outputs = [(fwd[h[0]], h[1]) for h in graph.heads]
    # the arguments in forward (DFS) order, which is MXNet's list_arguments order whatever
    # the order of graph.nodes (the segment model builds its sub-graphs in its own)
    xs = [n for n in topo if n.kind == PARAM]
    if not xs:
        return TrainingGraph(post_order_nodes(outputs), outputs, len(outputs))

    # head gradients: _identity_with_attr_like_rhs(_head_grad_i, output_i)
    grads: dict[int, list[list]] = {n.id: [[] for _ in n.shapes] for n in topo}
    for i, (t, k) in enumerate(outputs):
        size = t.sizes[k]
        var = TNode(None, f"_head_grad_{i}", [], [size], "var")
        hint = TNode("_identity_with_attr_like_rhs", f"_head_grad_{i}_id", [(var, 0), (t, k)],
                     [size], "hint")
        grads[t.fwd][k] = [(hint, 0)]

    # one mirror copy per mirrored node, its inputs the mirrors of mirrored inputs
    mirror_of: dict[int, TNode] = {}
    for n in topo:
        if n.is_variable or n.id not in mirror or n.op == "Dropout":
            mirror_of[n.id] = fwd[n.id]
        else:
            m = TNode(n.op, n.name + "_mirror", [(mirror_of[s], k) for s, k in n.inputs],
                      fwd[n.id].sizes, "mirror", n.id)
            mirror_of[n.id] = m

    for n in reversed(topo):
        if n.is_variable:
            continue
        agg = [_aggregate(g, size, n) for g, size in zip(grads[n.id], n.element_counts)]
        if not n.inputs:
            continue
        tpl = n.template
        if tpl is None:
            raise PlanError(f"no backward template for node {n.name} ({n.op})")
        fnode = mirror_of[n.id]
        made: list[TNode] = []

        def ref(r, fnode=fnode, made=made, agg=agg):
            kind = r[0]
            if kind == "ograd":
                return agg[r[1]]
            if kind == "in":
                return fnode.inputs[r[1]]
            if kind == "out":
                return (fnode, r[1])
            return (made[r[1]], r[2])

        sizes = n.backward_sizes
        for t, tn in enumerate(tpl.nodes):
            name = n.name + ("_backward" if len(tpl.nodes) == 1 else f"_backward{t}")
            b = TNode(tn.op, name, [ref(r) for r in tn.inputs], sizes[t], "bwd", n.id)
            if tn.control_fwd:
                b.cdeps.append(fnode)
            b.cdeps.extend(made[c] for c in tn.control_nodes)
            made.append(b)
        for (src, k), r in zip(n.inputs, tpl.input_grads):
            if r is not None:
                grads[src][k].append(ref(r))

    # gradients of the arguments, a _copy where one entry would be two outputs
    seen: set[tuple[int, int]] = set()
    for x in xs:
        g = _aggregate(grads[x.id][0], fwd[x.id].sizes[0], x)
        key = (id(g[0]), g[1])
        if key in seen:
            c = TNode("_copy", g[0].name + "_copy", [g], [g[0].sizes[g[1]]], "copy", x.id)
            g = (c, 0)
        seen.add(key)
        outputs.append(g)
    return TrainingGraph(post_order_nodes(outputs), outputs, len(graph.heads))


def post_order_nodes(outputs: list[tuple[TNode, int]]) -> list[TNode]:
    """post_order specialised to training nodes (inputs, then control deps): the hot path."""
    order: list[TNode] = []
    visited: set[int] = set()
    for head, _ in outputs:
        if id(head) in visited:
            continue
        visited.add(id(head))
        stack = [(head, 0)]
        while stack:
            node, i = stack[-1]
            n_in = len(node.inputs)
            total = n_in + len(node.cdeps)
            while i < total:
                child = node.inputs[i][0] if i < n_in else node.cdeps[i - n_in]
                i += 1
                if id(child) not in visited:
                    visited.add(id(child))
                    stack[-1] = (node, i)
                    stack.append((child, 0))
                    break
            else:
                order.append(node)
                stack.pop()
    return order


def _aggregate(v: list, size: int, n: Node) -> tuple[TNode, int]:
    """MXNet's AggregateGradient (graph_executor.cc)."""
    if not v:
        return (TNode("_zeros_without_dtype", "zeros_without_dtype", [], [size], "zeros",
                      n.id), 0)
    kept = [e for e in v if e[0].op not in ZERO_OPS]
    if not kept:
        kept = v[:1]
    if len(kept) == 1:
        return kept[0]
    if len(kept) < INPLACE_SUM_CAP:
        return (TNode("add_n", "sum_grad", list(kept), [size], "sum", n.id), 0)
    ret = kept[0]
    for i in range(1, len(kept)):
        if kept[i - 1][0] is not kept[i][0]:
            kept[i][0].cdeps.append(ret[0])
        ret = (TNode("_grad_add", f"sum_grad_{i}", [ret, kept[i]], [size], "sum", n.id), 0)
    return (TNode("identity", "sum_grad_final", [ret], [size], "sum", n.id), 0)


def mirror_from_attrs(graph: Graph) -> set[int]:
    """Nodes MXNet mirrors for the attributes already on the symbol (__force_mirroring__)."""
    return {n.id for n in graph.nodes
            if not n.is_variable and _truthy(n.attrs.get("__force_mirroring__"))}


def do_mirror_set(graph: Graph) -> set[int]:
    """What MXNET_BACKWARD_DO_MIRROR=1 mirrors (besides force_mirroring attributes)."""
    keep = {"Convolution", "FullyConnected", "Concat", "SoftmaxOutput", "Dropout"}
    return {n.id for n in graph.nodes if not n.is_variable and n.op not in keep}


def _truthy(v: str | None) -> bool:
    return v is not None and v.strip().lower() in ("true", "1")
