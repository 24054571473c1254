"""Graph IR: the forward graph as plain Python values, no MXNet needed.

A Graph is built by the MXNet adapter (``adapter.reader.load_graph``), read from its own
JSON (``ir.graph_json``) or built by hand in tests. Nodes are in MXNet's own topological
order (the order of the symbol's JSON), every output entry has a shape, a real dtype size
and bytes, and every operator node carries its backward template (what MXNet's gradient
pass builds for it), so that the training graph can be simulated without MXNet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from math import prod
from typing import Any

from mxmirror.errors import PlanError
from mxmirror.ir.templates import Template, TemplateTable

# Variable kinds, decided from how the symbol is bound, never from names.
PARAM = "param"  # argument with a gradient (grad_req != 'null')
INPUT = "input"  # argument without a gradient (data, labels, initial states)
AUX = "aux"  # auxiliary state (BatchNorm moving mean/var)
OP = "op"

DTYPE_BYTES = {
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "uint8": 1, "int8": 1, "bool": 1, "int16": 2, "uint16": 2,
    "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
}


# the dtypes a gradient flows through: an integer value (ids, positions, a mask) never needs
# one, and MXNet binds no loss or gradient of one
FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})


def itemsize(dtype: str) -> int:
    """Bytes of one element of `dtype` (4 for a dtype this table does not know)."""
    return DTYPE_BYTES.get(dtype, 4)

Entry = tuple[int, int]  # (node id, output index)


@dataclass
class Node:
    """One node of the forward graph."""

    id: int
    name: str
    op: str | None  # None for a variable
    attrs: dict[str, str] = field(default_factory=dict)
    inputs: list[Entry] = field(default_factory=list)
    kind: str = OP
    shapes: list[tuple[int, ...]] = field(default_factory=list)  # every output, hidden ones too
    dtypes: list[str] = field(default_factory=list)
    flops: float = 0.0
    template: Template | None = None
    grad_req: str = "null"  # for variables
    # elements of each output of each backward template node (set with the template)
    backward_sizes: list[list[int]] = field(default_factory=list)
    visible: int = 1  # outputs the symbol exposes; the template may add hidden ones after

    @property
    def is_variable(self) -> bool:
        return self.op is None

    @property
    def num_outputs(self) -> int:
        return len(self.shapes)

    def out_bytes(self, index: int = 0) -> int:
        """Real bytes of one output (its dtype's size, not MXNet's 4-byte assumption)."""
        return prod(self.shapes[index]) * itemsize(self.dtypes[index])

    @cached_property
    def element_counts(self) -> list[int]:
        """Elements of each output, hidden ones included (read for every training graph
        built; the adapter completes ``shapes`` before anything reads this)."""
        return [prod(s) for s in self.shapes]


@dataclass
class Graph:
    """The forward graph: nodes in topological order and the symbol's heads."""

    nodes: list[Node]
    heads: list[Entry]
    # the templates of its signatures (ir.backward.attach); graphs derived from this one
    # (the segment model's sub-graphs) share them
    templates: TemplateTable | None = field(default=None, repr=False)

    @property
    def op_nodes(self) -> list[Node]:
        return [n for n in self.nodes if not n.is_variable]

    @cached_property
    def forward_order(self) -> list[Node]:
        """DFS post-order from the heads (MXNet's DFSVisit); equals JSON order for saved
        symbols. Planners build hundreds of training graphs from one forward graph."""
        return [self.nodes[i] for i in post_order(
            [h[0] for h in self.heads], lambda i: [src for src, _ in self.nodes[i].inputs])]

    @cached_property
    def op_order(self) -> list[Node]:
        """The op nodes in forward order: positions on the chain planners cut."""
        return [n for n in self.forward_order if not n.is_variable]

    @cached_property
    def last_reads(self) -> dict[Entry, int]:
        """Op output -> position in ``op_order`` of the last op node that reads it (absent:
        no op reads it). What crosses a cut follows from it (planning, the segment model)."""
        pos = {n.id: i for i, n in enumerate(self.op_order)}
        last: dict[Entry, int] = {}
        for i, n in enumerate(self.op_order):
            for e in n.inputs:
                if e[0] in pos:
                    last[e] = i
        return last

    @cached_property
    def consumers(self) -> dict[int, list[int]]:
        """node id -> ids of the op nodes that read any of its outputs."""
        cons: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for src, _ in n.inputs:
                if not cons[src] or cons[src][-1] != n.id:
                    cons[src].append(n.id)
        return cons

    def by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def entry_bytes(self, entry: Entry) -> int:
        return self.nodes[entry[0]].out_bytes(entry[1])

    @property
    def forward_flops(self) -> float:
        return sum(n.flops for n in self.nodes)



def post_order(heads: Iterable, children: Callable) -> list:
    """Iterative post-order DFS, visiting children in order (nnvm PostOrderDFSVisit): the
    forward order, and the training graph's execution order (both builders). Nodes are
    any hashable values (ids, or objects compared by identity)."""
    order = []
    visited = set()
    for head in heads:
        if head in visited:
            continue
        visited.add(head)
        stack = [(head, iter(children(head)))]
        while stack:
            node, it = stack[-1]
            for child in it:
                if child not in visited:
                    visited.add(child)
                    stack.append((child, iter(children(child))))
                    break
            else:
                order.append(node)
                stack.pop()
    return order


def resident_bytes(graph: Graph) -> tuple[int, int, int]:
    """(arguments, argument gradients, aux states) in bytes, at their real dtypes."""
    args = grads = aux = 0
    for n in graph.nodes:
        if not n.is_variable:
            continue
        size = n.out_bytes(0)
        if n.kind == AUX:
            aux += size
        else:
            args += size
            if n.grad_req != "null":
                grads += size
    return args, grads, aux


GRAD_REQS = ("null", "write", "add")


def module_default(shaped: Iterable[str]) -> Callable[[str], str]:
    """Module's rule for an argument without a grad_req: the inputs given shapes (data,
    labels, initial states) get no gradient, every other argument is trained."""
    shaped = set(shaped)
    return lambda name: "null" if name in shaped else "write"


def normalize_grad_req(arguments: list[str], grad_req: Any,
                       default: Callable[[str], str]) -> dict[str, str]:
    """grad_req per argument, from what simple_bind/bind take (None, one string, a list in
    argument order, a dict); `default` gives the arguments it does not name. 'inplace'
    is kept (MXNet treats it as 'write'). PlanError for anything else."""
    if grad_req is None:
        req = {a: default(a) for a in arguments}
    elif isinstance(grad_req, str):
        req = dict.fromkeys(arguments, grad_req)
    elif isinstance(grad_req, (list, tuple)):
        if len(grad_req) != len(arguments):
            raise PlanError(f"grad_req has {len(grad_req)} entries for {len(arguments)} "
                            f"arguments")
        req = dict(zip(arguments, grad_req))
    else:
        unknown = set(grad_req) - set(arguments)
        if unknown:
            raise PlanError(f"grad_req names unknown arguments: {sorted(unknown)}")
        req = {a: grad_req[a] if a in grad_req else default(a) for a in arguments}
    bad = sorted({repr(v) for v in req.values() if v not in (*GRAD_REQS, "inplace")})
    if bad:  # as the user wrote them: 'bogus', not ['bogus']; any type (None, a list)
        raise PlanError(f"grad_req must be 'null', 'write' or 'add', not {', '.join(bad)}")
    return req


@dataclass
class BindInputs:
    """What the plan was made for: shapes, dtypes and grad_req of the symbol's inputs."""

    shapes: dict[str, tuple[int, ...]]
    type_dict: dict[str, str] | None
    grad_req: dict[str, str]
