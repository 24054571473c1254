"""Graph IR: the forward graph as plain Python values, no MXNet needed.

A Graph is built by the MXNet adapter (``mxnet_adapter.load_graph``) or by hand
in tests. Nodes are in MXNet's own topological order (the order of the symbol's
JSON), every output entry has a shape, a real dtype size and bytes, and every
operator node carries its backward template (what MXNet's gradient pass builds
for it), so that the training graph can be simulated without MXNet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from .templates import Template

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

    @property
    def is_variable(self) -> bool:
        return self.op is None

    @property
    def num_outputs(self) -> int:
        return len(self.shapes)

    def out_bytes(self, index: int = 0) -> int:
        """Real bytes of one output (its dtype's size, not MXNet's 4-byte assumption)."""
        return prod(self.shapes[index]) * DTYPE_BYTES.get(self.dtypes[index], 4)

    def attr(self, key: str) -> str | None:
        return self.attrs.get(key)


@dataclass
class Graph:
    """The forward graph: nodes in topological order and the symbol's heads."""

    nodes: list[Node]
    heads: list[Entry]

    def __post_init__(self) -> None:
        self._consumers: dict[int, list[int]] | None = None

    @property
    def op_nodes(self) -> list[Node]:
        return [n for n in self.nodes if not n.is_variable]

    def consumers(self) -> dict[int, list[int]]:
        """node id -> ids of the op nodes that read any of its outputs."""
        if self._consumers is None:
            cons: dict[int, list[int]] = {n.id: [] for n in self.nodes}
            for n in self.nodes:
                for src, _ in n.inputs:
                    if not cons[src] or cons[src][-1] != n.id:
                        cons[src].append(n.id)
            self._consumers = cons
        return self._consumers

    def by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def entry_bytes(self, entry: Entry) -> int:
        return self.nodes[entry[0]].out_bytes(entry[1])

    @property
    def forward_flops(self) -> float:
        return sum(n.flops for n in self.nodes)

    def grad_args(self) -> list[Node]:
        """Arguments that get a gradient, in MXNet's list_arguments order."""
        return [n for n in self.nodes if n.kind == PARAM]
