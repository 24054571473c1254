"""MXNet 1.9.1's gradient pass, stated once: the rules both training-graph builders follow.

``GraphExecutor::InitFullGraph`` (src/executor/graph_executor.cc) and the ``MXGradient``
pass (src/nnvm/gradient.cc), tag 1.9.1:

- a head-gradient hint per output: ``_identity_with_attr_like_rhs(_head_grad_i, output_i)``;
- which nodes MXNet mirrors (``need_mirror``): never a variable or Dropout; a node whose
  ``__force_mirroring__`` is true; with ``MXNET_BACKWARD_DO_MIRROR=1`` every other node but
  Convolution, FullyConnected, Concat and SoftmaxOutput (``mirrored_by_mxnet``);
- one copy per mirrored node (``has_mirror_copy``), reading the copies of its mirrored
  inputs and the originals of the others: each node is recomputed at most once;
- each op's backward nodes from its learned template: a read of a forward input reads its
  copy where both the node and that input are mirrored, a read of the node's own output or
  a control dependency on the node reads its copy where the node is mirrored;
- nodes visited in reverse forward order, each adding its input gradients to its inputs'
  terms in input order (``backward_order``): the order a sum's terms come in;
- the terms summed by ``AggregateGradient`` (``aggregate``): none, ``_zeros_without_dtype``;
  zero ops (``zeros_like``, ``_zeros``) dropped, one kept if all are; one term as is; fewer
  than ``MXNET_EXEC_INPLACE_GRAD_SUM_CAP`` (8) one ``add_n`` (ElementWiseSum); more a chain
  of ``_grad_add`` whose terms' nodes wait for the partial sum before them (a control
  dependency, unless both terms come from one node), closed by an ``identity``;
- an argument gradient that is already another argument's gets a ``_copy``: one entry
  cannot be two outputs.

A ``Builder`` says how a node is made and what a read resolves to: ``training_graph.build``
makes objects for one mirror set, ``compiled.CompiledTraining`` integers for every mirror
set at once (a read that depends on the set is a switch). Both then order the nodes by the
post-order DFS from the outputs (``ir.graph.post_order``). The simulator plans for MXNet's
defaults (the cap of 8, as the match range of 16); ``inplace_sum_cap`` is what MXNet in
this process uses, for the segmented executor's sums (``segments.grad_sums``).
"""

from __future__ import annotations

import os
from collections.abc import Container, Iterator, Sequence
from typing import Any, Protocol

from mxmirror.errors import PlanError
from mxmirror.ir import ops
from mxmirror.ir.graph import PARAM, Graph, Node

INPLACE_SUM_CAP = 8  # MXNET_EXEC_INPLACE_GRAD_SUM_CAP's default
ZERO_OPS = frozenset({"zeros_like", "_zeros"})  # the zero_ops InitFullGraph passes
HEAD_GRAD_HINT = "_identity_with_attr_like_rhs"
DO_MIRROR_KEEPS = frozenset({"Convolution", "FullyConnected", "Concat", "SoftmaxOutput"})


def inplace_sum_cap() -> int:
    """The cap MXNet in this process sums gradients with (read once per process there)."""
    return int(os.environ.get("MXNET_EXEC_INPLACE_GRAD_SUM_CAP", str(INPLACE_SUM_CAP)))


def sum_op(terms: int, cap: int = INPLACE_SUM_CAP) -> str | None:
    """What AggregateGradient sums this many (non-zero) terms with: None (one term, used as
    is), ``add_n`` (one ElementWiseSum) or ``_grad_add`` (a chain)."""
    if terms == 1:
        return None
    return "add_n" if terms < cap else "_grad_add"


def has_mirror_copy(node: Node) -> bool:
    """Whether MXNet makes a mirror copy of the node when it is mirrored."""
    return not node.is_variable and not ops.never_mirrored(node.op)


def need_mirror(node: Node, do_mirror: bool = False) -> bool:
    """InitFullGraph's need_mirror: whether MXNet mirrors the node (``do_mirror``:
    MXNET_BACKWARD_DO_MIRROR=1, where force_mirroring='False' is no veto)."""
    if not has_mirror_copy(node):
        return False
    if _truthy(node.attrs.get("__force_mirroring__")):
        return True
    return do_mirror and node.op not in DO_MIRROR_KEEPS


def mirrored_by_mxnet(graph: Graph, do_mirror: bool = False) -> set[int]:
    """The nodes MXNet mirrors for the attributes on the symbol (and MXNET_BACKWARD_DO_MIRROR)."""
    return {n.id for n in graph.nodes if need_mirror(n, do_mirror)}


def _truthy(v: str | None) -> bool:
    return v is not None and v.strip().lower() in ("true", "1")


def backward_order(order: Sequence[Node]) -> Iterator[Node]:
    """The op nodes in the order the gradient pass visits them (reverse forward order)."""
    return (n for n in reversed(order) if not n.is_variable)


class Builder(Protocol):
    """How one builder makes the pass's nodes. Entries are (node, output index) pairs, or
    whatever ``read`` returns; ``of`` is the forward node id a node belongs to."""

    def forward(self, n: Node, inputs: list) -> Any:
        """n's own node (a variable, or the op reading `inputs`)."""

    def copy(self, n: Node, inputs: list) -> None:
        """n's mirror copy, reading `inputs`."""

    def node(self, op: str | None, sizes: list[int], inputs: list, role: str, name: str,
             of: int | None) -> Any:
        """A node of the backward pass (role: var, hint, bwd, zeros, sum, copy)."""

    def read(self, cond: int, src: int, k: int) -> Any:
        """Output k of forward node `src`: its copy where `src` (and `cond`, unless -1) is
        mirrored, else the original."""

    def control(self, node: Any, entry: Any) -> None:
        """`node` waits for the node that makes `entry`."""

    def op(self, entry: Any) -> str | None:
        """The op of the node that makes `entry`."""

    def size(self, entry: Any) -> int:
        """Elements of `entry`."""

    def name(self, node: Any) -> str:
        """The node's name (for the names MXNet derives from it)."""


def run(graph: Graph, b: Builder, mirror: Container[int] | None = None,
        terms: dict | None = None) -> tuple[list, int]:
    """The training graph's nodes made through `b`, in MXNet's construction order, with a
    copy of every node of `mirror` that has one (None: of every node that has one, for a
    builder of every mirror set); returns the outputs (forward heads, then one gradient per
    argument that gets one) and the number of forward heads. Where no argument gets a
    gradient, only the forward graph. `terms`, where given, gets every forward entry's
    gradient terms as the pass lists them, each as (origin, entry): origin ``("head", i)``
    for output i's head gradient, else (reading node id, input index)."""
    topo = graph.forward_order
    fwd: dict[int, Any] = {}
    for n in topo:
        fwd[n.id] = b.forward(n, [(fwd[s], k) for s, k in n.inputs])
    outputs = [(fwd[s], k) for s, k in graph.heads]
    # the arguments in forward (DFS) order, which is MXNet's list_arguments order whatever
    # the order of graph.nodes (the segment model builds its sub-graphs in its own)
    xs = [n for n in topo if n.kind == PARAM]
    if not xs:
        return outputs, len(outputs)

    grads: dict[int, list[list]] = {n.id: [[] for _ in n.shapes] for n in topo}
    for i, (s, k) in enumerate(graph.heads):
        size = graph.nodes[s].element_counts[k]
        var = b.node(None, [size], [], "var", f"_head_grad_{i}", None)
        hint = b.node(HEAD_GRAD_HINT, [size], [(var, 0), outputs[i]], "hint",
                      f"_head_grad_{i}_id", None)
        grads[s][k] = [(hint, 0)]
        if terms is not None:
            terms[(s, k)] = [(("head", i), (hint, 0))]

    for n in topo:
        if (mirror is None or n.id in mirror) and has_mirror_copy(n):
            b.copy(n, [b.read(-1, s, k) for s, k in n.inputs])

    for n in backward_order(topo):
        agg = [aggregate(b, g, size, n.id) for g, size in zip(grads[n.id], n.element_counts)]
        if not n.inputs:
            continue
        tpl = n.template
        if tpl is None:
            raise PlanError(f"no backward template for node {n.name} ({n.op})")
        made: list = []

        def ref(r, n=n, made=made, agg=agg):
            kind = r[0]
            if kind == "ograd":
                return agg[r[1]]
            if kind == "in":
                s, k = n.inputs[r[1]]
                return b.read(n.id, s, k)
            if kind == "out":
                return b.read(-1, n.id, r[1])
            return (made[r[1]], r[2])

        sizes = n.backward_sizes
        single = len(tpl.nodes) == 1
        for t, tn in enumerate(tpl.nodes):
            node = b.node(tn.op, sizes[t], [ref(r) for r in tn.inputs], "bwd",
                          n.name + ("_backward" if single else f"_backward{t}"), n.id)
            if tn.control_fwd:
                b.control(node, b.read(-1, n.id, 0))
            for c in tn.control_nodes:
                b.control(node, (made[c], 0))
            made.append(node)
        for j, ((src, k), r) in enumerate(zip(n.inputs, tpl.input_grads)):
            if r is not None:
                grads[src][k].append(ref(r))
                if terms is not None:
                    terms.setdefault((src, k), []).append(((n.id, j), grads[src][k][-1]))

    seen: set = set()
    for x in xs:
        g = aggregate(b, grads[x.id][0], x.element_counts[0], x.id)
        if g in seen:
            g = (b.node("_copy", [b.size(g)], [g], "copy", b.name(g[0]) + "_copy", x.id), 0)
        seen.add(g)
        outputs.append(g)
    return outputs, len(graph.heads)


def aggregate(b: Builder, terms: list, size: int, of: int) -> Any:
    """AggregateGradient: the one entry the gradient terms of a value come to."""
    if not terms:
        return (b.node("_zeros_without_dtype", [size], [], "zeros", "zeros_without_dtype", of),
                0)
    if len(terms) == 1:  # kept whether a zero op makes it or not
        return terms[0]
    kept = [e for e in terms if b.op(e) not in ZERO_OPS] or terms[:1]
    op = sum_op(len(kept))
    if op is None:
        return kept[0]
    if op == "add_n":
        return (b.node("add_n", [size], list(kept), "sum", "sum_grad", of), 0)
    ret = kept[0]
    for i in range(1, len(kept)):
        if kept[i - 1][0] != kept[i][0]:
            b.control(kept[i][0], ret)
        ret = (b.node("_grad_add", [size], [ret, kept[i]], "sum", f"sum_grad_{i}", of), 0)
    return (b.node("identity", [size], [ret], "sum", "sum_grad_final", of), 0)
