"""The segment model: a forward graph cut into a chain of segments, run several times.

MXNet's attribute mirroring recomputes each node at most once. Plans that need
more (the paper's recursive O(log n) plan, or any budget tighter than one extra
forward) cut the forward graph at chosen cuts into segments (``cuts``); each segment
is a sub-graph (``subgraph``: inputs are the values crossing the cut before it and
the original variables it reads; outputs the values crossing the cut after it and
the graph heads it computes). Segments with the same structure and shapes share one
template (one executor at run time). ``schedule`` lists the operations a schedule runs
(segment forwards and backwards, states kept and dropped), ``cost`` what they keep,
recompute and allocate. All of it is planning: ``runtime.segmented`` replays the same
operations on MXNet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from mxmirror.ir.graph import Entry, Graph


@dataclass
class Segment:
    """One piece of the forward graph between two consecutive cuts."""

    index: int  # 1-based: segment i runs from cut i-1 to cut i
    nodes: list[int]  # op node ids in forward order
    inputs: list[Entry]  # values produced by earlier segments that this one reads
    outputs: list[Entry]  # values produced here and read by later segments
    heads: list[int]  # indices into graph.heads computed here
    slots: list[tuple[str, tuple]]  # (variable name in the sub-symbol, source)
    # sources: ("arg", name) or, a slot per use, ("arg", name, reading node); ("aux", name);
    # ("state"|"ograd", entry); ("mask", Dropout node); ("hgrad", head index)
    json: str  # the sub-symbol, canonical names (equal for equal structure)
    key: str  # template key: the structure, and the weights it binds (weight_set_keys)
    flops: float = 0.0
    graph: Graph | None = field(default=None, repr=False)  # the sub-graph as Graph IR
    structure: str = ""  # json + slot shapes, dtypes, grad_req: equal for equal memory


@dataclass
class Segments:
    """The forward graph cut into a chain of segments."""

    graph: Graph
    cuts: list[int]  # positions in op order after which the graph is cut
    segments: list[Segment]
    crossing: list[frozenset]  # crossing[i]: entries alive at cut i (0: none)
    dropouts: list[int]  # Dropout node ids in forward order
    slot_shapes: dict[str, dict[str, tuple]] = field(default_factory=dict)  # key -> shapes
    slot_types: dict[str, dict[str, str]] = field(default_factory=dict)
    slot_req: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def m(self) -> int:
        return len(self.segments)

    def entry_bytes(self, e: Entry) -> int:
        return self.graph.entry_bytes(e)

    def state_bytes(self, i: int) -> int:
        return sum(self.entry_bytes(e) for e in self.crossing[i])

    @cached_property
    def user_slots(self) -> frozenset:
        """(template key, slot name) of the parameter slots that read the same variable in
        every segment of their template (a template of one segment, an LSTM layer's weights
        in every step): bound to the user's own array, never copied."""
        var: dict[tuple[str, str], set] = {}
        for seg in self.segments:
            for name, key in seg.slots:
                if key[0] == "arg":
                    var.setdefault((seg.key, name), set()).add(key[1])
        return frozenset(k for k, v in var.items() if len(v) == 1)

    @cached_property
    def weight_sums(self) -> dict[str, tuple[frozenset, bool]]:
        """grad_sums.weight_sums: per weight, its slots added in place and whether its
        gradient is then MXNet's own sum."""
        from mxmirror.segments.grad_sums import weight_sums

        return weight_sums(self)

    @cached_property
    def value_sums(self) -> Any:
        """value_sums.value_sums: how the runner combines the gradient of each value read
        in several segments, and the values no combination sums as MXNet does."""
        from mxmirror.segments.value_sums import value_sums

        return value_sums(self)

    @property
    def exact(self) -> bool:
        """Whether the segmented executor computes every gradient sum these segments split
        with MXNet's own expression (every weight's, every value's): else the planner does
        not use them."""
        return all(exact for _, exact in self.weight_sums.values()) and \
            not self.value_sums.inexact

    @cached_property
    def grad_slots(self) -> frozenset:
        """The user slots whose gradient the template adds straight into the user's
        gradient array, no slot between (grad_sums.weight_sums)."""
        return frozenset(s for slots, _ in self.weight_sums.values() for s in slots)

    @cached_property
    def one_hop(self) -> frozenset:
        """Values read only by the segment right after their producer's: in a forward,
        the value goes straight from the producer's output into the reader's slot (copied
        out only if its state is held); its gradient goes straight from the reader's
        gradient slot into the producer's gradient-input slot (the next backward is the
        producer's), never held in between."""
        out = set()
        for i in range(1, self.m):
            before = self.crossing[i - 1]
            after = self.crossing[i + 1] if i + 1 < self.m else frozenset()
            out |= {e for e in self.crossing[i] if e not in before and e not in after}
        return frozenset(out)


