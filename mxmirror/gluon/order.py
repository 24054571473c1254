"""The order in which plain Gluon's autograd would run a backward, replayed on a small
graph of what was recorded: which backward comes first, and in which order each sum
takes its terms.

Planned calls are not on autograd's tape, so backward.py runs their backwards itself; to
end with the same BatchNorm statistics (updated in backward, in the order the backwards
run) and the same rounding of every gradient sum as plain Gluon, it follows the order
MXNet 1.9.1 would have used had each planned call been a CachedOp node of the tape:
Imperative::Backward differentiates every variable the heads reach, in the post-order DFS
of the forward graph (src/imperative/imperative.cc); the gradient pass visits the nodes in
reverse of that order, appending each node's input gradients to its inputs' lists, and
sums a list with ElementWiseSum below 8 terms, else with a chain of _grad_add whose terms
wait for the partial sum (src/nnvm/gradient.cc, src/executor/graph_executor.cc
AggregateGradient; zeros dropped); the backward nodes then run in the post-order DFS from
the variables' gradients, in the variables' order. Each op's backward is modelled as one
node reading every output's gradient (its inputs from the forward pass are visited
already), except ops whose gradient is zero.
"""

from __future__ import annotations

from collections.abc import Iterator

SUM_CAP = 8  # MXNET_EXEC_INPLACE_GRAD_SUM_CAP: from 8 terms a chain of _grad_add

# ops whose gradient MXNet makes of zeros (MakeZeroGradNodes and the like): no dependency
ZERO_GRADIENT = frozenset({
    "BlockGrad", "stop_gradient", "zeros_like", "ones_like", "_zeros", "_ones", "_full",
    "argmax", "argmin", "argmax_channel", "argsort", "sort", "topk", "one_hot", "round",
    "rint", "floor", "ceil", "trunc", "fix", "sign", "shape_array", "size_array",
    "_equal", "_not_equal", "_greater", "_greater_equal", "_lesser", "_lesser_equal",
    "broadcast_equal", "broadcast_not_equal", "broadcast_greater",
    "broadcast_greater_equal", "broadcast_lesser", "broadcast_lesser_equal",
    "_equal_scalar", "_not_equal_scalar", "_greater_scalar", "_greater_equal_scalar",
    "_lesser_scalar", "_lesser_equal_scalar", "logical_not",
})


class Node:
    """A node of the replayed graph: a variable (op None), an op of the tape, or a planned
    call (`call` set), with its inputs as (node, output index) entries."""

    def __init__(self, name: str, op: str | None = None, inputs: list | None = None,
                 num_outputs: int = 1, needs_grad: bool = False, call: object = None) -> None:
        self.name = name
        self.op = op
        self.inputs: list[tuple[Node, int]] = list(inputs or [])
        self.num_outputs = num_outputs
        self.needs_grad = needs_grad
        self.call = call

    @property
    def is_variable(self) -> bool:
        return self.op is None and self.call is None


class _Grad:
    """A node of the gradient graph: a backward (of `of`), a sum, or a head gradient."""

    def __init__(self, of: Node | None = None, inputs: list | None = None) -> None:
        self.of = of
        self.inputs: list[_Grad] = list(inputs or [])
        self.control: list[_Grad] = []


def _post_order(heads: list, inputs) -> Iterator:
    """nnvm's PostOrderDFSVisit: heads in order, inputs in order, each node once."""
    seen = set()
    for head in heads:
        if id(head) in seen:
            continue
        seen.add(id(head))
        stack = [(head, 0)]
        while stack:
            node, i = stack[-1]
            ins = inputs(node)
            if i == len(ins):
                stack.pop()
                yield node
                continue
            stack[-1] = (node, i + 1)
            nxt = ins[i]
            if id(nxt) not in seen:
                seen.add(id(nxt))
                stack.append((nxt, 0))


def _aggregate(terms: list) -> _Grad | None:
    """AggregateGradient: None for no term (zeros), the term itself, a sum, or a chain."""
    terms = [t for t in terms if t is not None]
    if not terms:
        return None
    if len(terms) == 1:
        return terms[0]
    if len(terms) < SUM_CAP:
        return _Grad(inputs=terms)
    total = terms[0]
    for prev, term in zip(terms, terms[1:]):
        if term is not prev:
            term.control.append(total)
        total = _Grad(inputs=[total, term])
    return _Grad(inputs=[total])


def replay(heads: list[tuple[Node, int]]) -> tuple[list[Node], dict]:
    """The op nodes (tape ops and planned calls) in the order plain autograd runs their
    backwards, and for every entry (node, output index) the nodes whose backwards give its
    gradient (None for a head's given gradient), in the order its sum takes them."""
    topo = list(_post_order([n for n, _ in heads], lambda n: [e[0] for e in n.inputs]))
    terms: dict[tuple[int, int], list[_Grad | None]] = {}
    owner: dict[int, Node] = {id(n): n for n in topo}
    for n, k in heads:
        terms[id(n), k] = [_Grad()]  # the head gradient: a variable of the gradient graph
    for node in reversed(topo):
        if node.is_variable or not node.inputs:
            continue
        ograds = [_aggregate(terms.get((id(node), k), [])) for k in range(node.num_outputs)]
        grad = None
        if node.op not in ZERO_GRADIENT:
            grad = _Grad(of=node, inputs=[g for g in ograds if g])
        for src, k in node.inputs:
            terms.setdefault((id(src), k), []).append(grad)
    xs = [n for n in topo if n.is_variable and n.needs_grad]
    outputs = [_aggregate(terms.get((id(x), 0), [])) for x in xs]
    order = [g.of for g in _post_order([g for g in outputs if g is not None],
                                        lambda g: g.inputs + g.control) if g.of is not None]
    contributors = {key: [g.of for g in grads if g is not None]
                    for key, grads in terms.items() if key[0] in owner}
    return order, {(owner[i], k): v for (i, k), v in contributors.items()}


def from_json(graph: dict, known: dict[str, Node] | None = None) -> tuple[dict, list]:
    """Nodes of a recorded graph (autograd.get_symbol(...).tojson(), parsed) by name, added
    to `known` (names are unique on the tape: varN, nullN, node_N), and its heads."""
    known = {} if known is None else known
    rows = graph["node_row_ptr"]
    made = []
    for i, spec in enumerate(graph["nodes"]):
        name = spec["name"]
        node = known.get(name)
        if node is None:
            if spec["op"] == "null":
                node = Node(name, needs_grad=not name.startswith("null"))
            else:
                node = Node(name, op=spec["op"], num_outputs=rows[i + 1] - rows[i])
                node.inputs = [(made[j], k) for j, k, _ in spec["inputs"]]
            known[name] = node
        made.append(node)
    return known, [(made[j], k) for j, k, _ in graph["heads"]]
