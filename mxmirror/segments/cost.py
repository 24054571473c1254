"""What a segmented plan costs: forward work and kept bytes of its schedule (the dry run),
and the memory of its executors (pool, slots, masks, statistics): ``SegmentPlan``."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Any

from mxmirror.ir import backward
from mxmirror.ir.graph import Entry, Graph, itemsize
from mxmirror.segments.cuts import build_segments
from mxmirror.segments.model import Segments
from mxmirror.segments.schedule import Driver, Tree, binary_tree, walk_backward, walk_forward
from mxmirror.sim import memory_plan, training_graph


@dataclass
class DryRun:
    """What a schedule costs: forward FLOPs run and the peak of kept values."""

    forward_flops: float  # every segment forward run, the first pass included
    peak_state_bytes: int  # kept boundary values, at the worst moment
    peak_grad_bytes: int  # boundary gradients alive at the worst moment
    peak_bytes: int  # both together, at the worst moment
    runs: list[int] = field(default_factory=list)  # forward runs per segment


class _DryDriver(Driver):
    def __init__(self, sg: Segments) -> None:
        self.sg = sg
        self.held: dict[int, dict] = {}
        self.grads: dict[Entry, int] = {}
        self.flops = 0.0
        self.runs = [0] * (sg.m + 1)
        self.peak = self.peak_state = self.peak_grad = 0
        self.live: int | None = None

    def _note(self, *extra: dict) -> None:
        alive: set = set()
        for d in self.held.values():
            alive |= set(d)
        for d in extra:  # a one-hop value not held stays in its template's output
            alive |= {e for e in d if e not in self.sg.one_hop}
        sb = sum(self.sg.entry_bytes(e) for e in alive)
        gb = sum(self.grads.values())
        self.peak_state = max(self.peak_state, sb)
        self.peak_grad = max(self.peak_grad, gb)
        self.peak = max(self.peak, sb + gb)

    def hold(self, state):
        self.held[id(state)] = state

    def release(self, state):
        self.held.pop(id(state), None)

    def fwd(self, i, state, first):
        seg = self.sg.segments[i - 1]
        self.flops += seg.flops
        self.runs[i] += 1
        new = {e: 1 for e in self.sg.crossing[i]}
        self._note(state, new)
        self.live = i
        return new

    def forward_backward(self, i, state):
        seg = self.sg.segments[i - 1]
        if self.live != i:
            self.flops += seg.flops
            self.runs[i] += 1
        self.live = None
        for e in seg.inputs:
            if e not in self.sg.one_hop:
                self.grads[e] = self.sg.entry_bytes(e)
        self._note(state)
        for e in seg.outputs:
            self.grads.pop(e, None)


def dry_run(sg: Segments, tree: Tree) -> DryRun:
    """Walk the schedule without MXNet: FLOPs run and peak kept bytes (real dtype sizes)."""
    drv = _DryDriver(sg)
    stored = walk_forward(drv, tree, sg.m)
    walk_backward(drv, tree, sg.m, stored)
    return DryRun(drv.flops, drv.peak_state, drv.peak_grad, drv.peak, drv.runs[1:])


# ----------------------------------------------------------------- memory model
@dataclass
class SegmentPlan:
    """Everything the executor needs, and what the plan predicts it costs."""

    cuts: list[int]  # op-order positions
    tree: Tree
    segments: Segments
    template_bytes: dict[str, int]  # per template: MXNet's planned intermediates
    template_blocks: dict[str, list[int]]
    pool_bytes: int  # one shared pool: blocks matched as MXNet's shared_exec does
    staging_bytes: int  # template slots for boundary values, their gradients, head grads
    mask_bytes: int  # Dropout masks, kept for the whole step
    output_bytes: int  # copies of the graph outputs
    statistics_bytes: int  # BatchNorm statistics on the pool's owner (statistics_bytes)
    dry: DryRun

    @property
    def planned_bytes(self) -> int:
        return (self.pool_bytes + self.staging_bytes + self.mask_bytes + self.output_bytes
                + self.statistics_bytes + self.dry.peak_bytes)

    def bind_order(self) -> list[str]:
        return sorted(self.template_bytes, key=lambda k: -self.template_bytes[k])

    def describe(self) -> dict:
        return {"segments": self.segments.m, "templates": len(self.template_bytes),
                "pool_mb": round(self.pool_bytes / 2**20, 3),
                "staging_mb": round(self.staging_bytes / 2**20, 3),
                "kept_mb": round(self.dry.peak_bytes / 2**20, 3),
                "mask_mb": round(self.mask_bytes / 2**20, 3),
                "statistics_mb": round(self.statistics_bytes / 2**20, 3)}


def template_memory(sg: Segments) -> tuple[dict[str, int], dict[str, list[int]]]:
    """Simulated MXNet planned bytes and block sizes of every template's training graph."""
    totals, blocks = {}, {}
    simulated: dict[str, Any] = {}  # structure -> result (templates of one structure)
    for seg in sg.segments:
        if seg.key in totals:
            continue
        res = simulated.get(seg.structure)
        if res is None:
            g = seg.graph
            if g.templates is None:
                raise ValueError("the graph has no templates: load it with the adapter")
            backward.attach(g)
            res = simulated[seg.structure] = memory_plan.simulate(training_graph.build(g, set()))
        totals[seg.key] = res.total_bytes
        blocks[seg.key] = list(res.block_bytes)
    return totals, blocks


def staging_bytes(sg: Segments) -> int:
    """Every slot array the executor binds besides the pool and the statistics: activation
    slots (boundary values and their gradients, gradient inputs, Dropout masks) shared by
    name across templates, so the largest per name; parameter slots (weights, labels, data)
    per template, as each template has its own, and their gradients shared by name, except
    where the template adds into the user's gradient (Segments.grad_slots)."""
    shared: dict[str, int] = {}
    own = 0
    seen: set[str] = set()
    for seg in sg.segments:
        shapes, types, req = sg.slot_shapes[seg.key], sg.slot_types[seg.key], sg.slot_req[seg.key]
        for name, key in seg.slots:
            if key[0] == "aux":
                continue
            b = prod(shapes[name]) * itemsize(types[name])
            grad = b if req.get(name) != "null" else 0
            if key[0] == "arg":  # one copy per template, unless bound to the user's array
                own += b if seg.key not in seen and (seg.key, name) not in sg.user_slots else 0
            else:
                shared[name] = max(shared.get(name, 0), b)
            if grad and (seg.key, name) not in sg.grad_slots:  # else the user's gradient
                shared["grad of " + name] = max(shared.get("grad of " + name, 0), grad)
        seen.add(seg.key)
    return own + sum(shared.values())


def statistics_groups(sg: Segments) -> list[tuple[tuple, str, list[str]]]:
    """The auxiliary slots (BatchNorm statistics) the pool's owner holds, one per name, as
    (shape, dtype, names) groups, each padded to an even count with ``_pad<group>``: the
    owner holds them as pairs of one BatchNorm op each (executor.SegmentedExecutor._owner),
    as with shared_exec MXNet takes every auxiliary state from the owner, by name."""
    aux: dict[str, tuple[tuple, str]] = {}
    by_name = sg.graph.by_name()
    for seg in sg.segments:
        for name, key in seg.slots:
            if key[0] == "aux":
                nd = by_name[key[1]]
                aux[name] = (tuple(nd.shapes[0]), nd.dtypes[0])
    groups: dict[tuple, list[str]] = {}
    for name, sd in aux.items():
        groups.setdefault(sd, []).append(name)
    out = []
    for j, ((shape, dtype), names) in enumerate(groups.items()):
        out.append((shape, dtype, names + [f"_pad{j}"] * (len(names) % 2)))
    return out


def statistics_bytes(sg: Segments) -> int:
    """Bytes of every array the pool's owner holds for the statistics: each statistic (and
    pad), and per pair its BatchNorm's data (1, C), gamma, beta and output (1, C), all of
    the statistics' dtype."""
    total = 0
    for shape, dtype, names in statistics_groups(sg):
        per = prod(shape) * itemsize(dtype)
        total += len(names) * per + len(names) // 2 * 4 * per
    return total


def pool_blocks(blocks: dict[str, list[int]]) -> list[int]:
    """The pool the owner executor allocates: per rank, the largest block of any template.
    Every template then finds each of its blocks in it (largest first, smallest that fits),
    so binding the templates adds nothing: the pool is the least a shared pool can be."""
    ranked = [sorted(((b + 3) // 4 * 4 for b in bl), reverse=True) for bl in blocks.values()]
    n = max((len(r) for r in ranked), default=0)
    return [max(r[i] if i < len(r) else 0 for r in ranked) for i in range(n)]


def make_segment_plan(graph: Graph, cuts: list[int], tree: Tree | None = None,
                      sg: Segments | None = None, mem: tuple | None = None) -> SegmentPlan:
    """Segments, template memory and the dry run of a tree (binary when not given)."""
    sg = sg or build_segments(graph, cuts)
    tree = binary_tree(sg.m) if tree is None else tree
    totals, blocks = mem or template_memory(sg)
    pool = sum(pool_blocks(blocks))
    staging = staging_bytes(sg)
    masks = sum(graph.entry_bytes(graph.nodes[d].inputs[0]) for d in sg.dropouts) * 2
    outputs = sum(graph.entry_bytes(h) for h in graph.heads)
    return SegmentPlan(sg.cuts, tree, sg, totals, blocks, pool, staging, masks, outputs,
                       statistics_bytes(sg), dry_run(sg, tree))
