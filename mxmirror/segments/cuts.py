"""Cutting the forward graph into a chain of segments at chosen op-order positions."""

from __future__ import annotations

import json

from mxmirror.errors import PlanError
from mxmirror.ir import ops
from mxmirror.ir.graph import Entry, Graph
from mxmirror.segments.model import Segment, Segments
from mxmirror.segments.subgraph import make_segment


def chain_cuts(graph: Graph, cuts: list[int]) -> list[int]:
    """The cuts a chain is made of: sorted, distinct, each with an op after it."""
    return sorted({c for c in cuts if 0 <= c < len(graph.op_order) - 1})


def segment_flops(graph: Graph, cuts: list[int]) -> list[float]:
    """Each segment's forward FLOPs (as build_segments counts them), without building the
    segments: what a recompute bound needs of a chain."""
    out, bounds = [], chain_cuts(graph, cuts) + [len(graph.op_order) - 1]
    flops = 0.0
    for p, nd in enumerate(graph.op_order):
        flops += nd.flops
        if p == bounds[len(out)]:
            out.append(flops)
            flops = 0.0
    return out


def build_segments(graph: Graph, cuts: list[int]) -> Segments:
    """Cut the graph after the given op-order positions (pure Graph IR, no MXNet). A weight
    that a segment reads more than once gets a slot per use there, each bound to the user's
    arrays, where that adds its gradient in place exactly as MXNet sums it and one slot
    would not (grad_sums.split_uses)."""
    from .grad_sums import split_uses

    cuts = chain_cuts(graph, cuts)
    sg = _cut(graph, cuts, frozenset())
    split = split_uses(sg)
    while split:  # each round drops the weights whose uses the last one did not add exactly
        trial = _cut(graph, cuts, split)
        kept = split & {w for w, (slots, exact) in trial.weight_sums.items() if slots and exact}
        if kept == split:
            return trial
        split = kept
    return sg


def _cut(graph: Graph, cuts: list[int], split: frozenset) -> Segments:
    """The segments of `cuts` (chain_cuts), a slot per use for the weights in `split`."""
    order = graph.op_order
    n = len(order)
    pos = {nd.id: i for i, nd in enumerate(order)}
    seg_of = {}
    bounds = [-1] + cuts + [n - 1]
    for s in range(len(bounds) - 1):
        for p in range(bounds[s] + 1, bounds[s + 1] + 1):
            seg_of[order[p].id] = s + 1
    # the segment of an entry's last reader (segments follow op positions)
    last_reader = {e: seg_of[order[p].id] for e, p in graph.last_reads.items()}
    for nd in graph.nodes:
        if not nd.is_variable and ops.is_random(nd.op, nd.attrs) \
                and not ops.replayed_with_mask(nd.op):
            raise PlanError(f"node {nd.name} ({nd.op}) draws random numbers: the segmented "
                            f"executor can only replay Dropout; use policy 'sqrt' or 'budget'")
        if not nd.is_variable and nd.op in ops.STATEFUL:
            raise PlanError(f"node {nd.name} ({nd.op}) is stateful or control flow: the "
                            f"segmented executor cannot replay it")
    for h in graph.heads:
        if graph.nodes[h[0]].is_variable:
            raise PlanError(f"output {graph.nodes[h[0]].name} is a variable; the segmented "
                            f"executor needs every output computed by an op")
    m = len(bounds) - 1
    # an entry made in segment a and last read in segment r crosses cuts a .. r-1
    starts: dict[int, list[Entry]] = {}
    ends: dict[int, list[Entry]] = {}
    for e, r in last_reader.items():
        if seg_of[e[0]] < r:
            starts.setdefault(seg_of[e[0]], []).append(e)
            ends.setdefault(r, []).append(e)
    crossing = [frozenset()]
    live: set[Entry] = set()
    for i in range(1, m + 1):
        live.update(starts.get(i, ()))
        live.difference_update(ends.get(i, ()))
        crossing.append(frozenset(live))
    segs = []
    out = Segments(graph, cuts, segs, crossing,
                   [nd.id for nd in order if ops.replayed_with_mask(nd.op)])
    for i in range(1, m + 1):
        ids = [order[p].id for p in range(bounds[i - 1] + 1, bounds[i] + 1)]
        outputs = sorted((e for e in crossing[i] if seg_of[e[0]] == i), key=lambda e: (pos[e[0]],
                                                                                       e[1]))
        heads = [j for j, h in enumerate(graph.heads) if seg_of.get(h[0]) == i]
        segs.append(make_segment(out, i, ids, outputs, heads, split))
    _key_by_weight_set(out)
    return out


def _key_by_weight_set(sg: Segments) -> None:
    """One template per weight set: where segments of one structure read, in a parameter
    slot, variables that several segments read (an LSTM layer's weights in each of its
    steps), they get a template per set of such variables, so that the template binds the
    user's arrays (Segments.user_slots) instead of copying a weight in per run. Slots whose
    variable is read by one segment only (a step's data and label, a ResNet unit's
    weights) do not split: their values are copied in, one template serves them all."""
    readers: dict[str, int] = {}
    groups: dict[str, list[Segment]] = {}
    for seg in sg.segments:
        groups.setdefault(seg.key, []).append(seg)
        for _, slot in seg.slots:
            if slot[0] == "arg":
                readers[slot[1]] = readers.get(slot[1], 0) + 1
    for key, segs in groups.items():
        shared = sorted({name for seg in segs for name, slot in seg.slots
                         if slot[0] == "arg" and readers[slot[1]] > 1})
        sets = [[dict(seg.slots)[n][1] for n in shared] for seg in segs]
        if len({json.dumps(v) for v in sets}) < 2:
            continue
        for seg, weights in zip(segs, sets):
            seg.key = json.dumps([key, weights])
            for table in (sg.slot_shapes, sg.slot_types, sg.slot_req):
                table[seg.key] = table[key]
