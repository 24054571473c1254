"""The training graph exactly as MXNet 1.9.1 builds it for one mirror set, in its order.

The reference builder: ``gradient_pass.run`` makes the nodes (head-gradient hints, one mirror
copy per mirrored node, each op's backward nodes from its learned template, gradient sums,
``_copy`` for duplicated gradients) as objects here, and the post-order DFS from the outputs
gives the node order MXNet's memory planner and executor use. ``compiled`` builds the same
for every mirror set at once.
"""

from __future__ import annotations

from mxmirror.ir.graph import Graph, Node, post_order
from mxmirror.sim import gradient_pass


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
    """Build the forward + backward (+ mirror) training graph for a mirror set (node ids;
    None: what the symbol's own attributes make MXNet mirror)."""
    mirror = gradient_pass.mirrored_by_mxnet(graph) if mirror is None else mirror
    outputs, num_forward = gradient_pass.run(graph, _Objects(), mirror)
    return TrainingGraph(post_order([t for t, _ in outputs], _children), outputs, num_forward)


def gradient_terms(graph: Graph) -> dict[tuple[int, int], list[tuple[tuple, bool]]]:
    """Every forward entry's gradient terms in the order MXNet's gradient pass lists them
    (``gradient_pass.run``), each as (origin, whether a zero op makes it: AggregateGradient
    drops those where others remain): origin ``("head", i)`` for output i's head gradient,
    else (reading node id, input index)."""
    terms: dict = {}
    gradient_pass.run(graph, _Objects(), set(), terms)
    return {e: [(origin, t[0].op in gradient_pass.ZERO_OPS) for origin, t in ts]
            for e, ts in terms.items()}


def _children(t: TNode) -> list[TNode]:
    """What runs before a training node: its inputs' nodes, then its control dependencies."""
    return [e[0] for e in t.inputs] + t.cdeps


class _Objects:
    """gradient_pass.Builder making TNodes for one mirror set: a copy exists only for a
    mirrored node, and a read resolves to the copy or the original at once."""

    def __init__(self) -> None:
        self.fwd: dict[int, TNode] = {}
        self.mirror_of: dict[int, TNode] = {}  # node id -> its copy, or its original

    def forward(self, n: Node, inputs: list) -> TNode:
        t = TNode(n.op, n.name, inputs, n.element_counts, "var" if n.is_variable else "fwd", n.id)
        self.fwd[n.id] = self.mirror_of[n.id] = t
        return t

    def copy(self, n: Node, inputs: list) -> None:
        self.mirror_of[n.id] = TNode(n.op, n.name + "_mirror", inputs, n.element_counts,
                                     "mirror", n.id)

    def node(self, op: str | None, sizes: list[int], inputs: list, role: str, name: str,
             of: int | None) -> TNode:
        return TNode(op, name, inputs, sizes, role, of)

    def read(self, cond: int, src: int, k: int) -> tuple[TNode, int]:
        if cond >= 0 and self.mirror_of[cond] is self.fwd[cond]:
            return (self.fwd[src], k)
        return (self.mirror_of[src], k)

    def control(self, node: TNode, entry: tuple[TNode, int]) -> None:
        node.cdeps.append(entry[0])

    def op(self, entry: tuple[TNode, int]) -> str | None:
        return entry[0].op

    def size(self, entry: tuple[TNode, int]) -> int:
        return entry[0].sizes[entry[1]]

    def name(self, node: TNode) -> str:
        return node.name
