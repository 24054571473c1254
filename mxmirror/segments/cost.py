"""What a segmented plan costs: forward work and kept bytes of its schedule (the dry run),
and the memory of its executors (pool, slots, masks, statistics): ``SegmentPlan``."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from math import prod
from typing import Any

from mxmirror.ir import backward
from mxmirror.ir.graph import Graph, itemsize
from mxmirror.segments.cuts import build_segments
from mxmirror.segments.model import Segments
from mxmirror.segments.schedule import (
    Forward,
    Operation,
    Release,
    Tree,
    binary_tree,
    operations,
    runs_forward,
)
from mxmirror.sim import memory_plan, training_graph


@dataclass
class DryRun:
    """What a schedule costs: forward FLOPs run and the peak of kept values."""

    forward_flops: float  # every segment forward run, the first pass included
    peak_state_bytes: int  # kept boundary values, at the worst moment
    peak_grad_bytes: int  # boundary gradients alive at the worst moment
    peak_bytes: int  # both together, at the worst moment
    runs: list[int] = field(default_factory=list)  # forward runs per segment


def dry_run(sg: Segments, tree: Tree) -> DryRun:
    """Replay the schedule of `tree` (schedule.operations) without MXNet: FLOPs run and the
    peak of kept bytes (real dtype sizes), counted where the executor counts them: at each
    forward (the state it runs from and the one it gives, besides the held states) and at
    each backward (its state; the gradients of its inputs added, those of its outputs
    dropped after; a value whose gradient's blocks are held apart, its partial sums:
    value_sums.Program). A value only the next segment reads (one-hop) and not held stays
    in its template's output and its gradient goes straight to its producer: not counted."""
    size = {e: sg.entry_bytes(e) for c in sg.crossing for e in c}
    free = [c - sg.one_hop for c in sg.crossing]  # per cut: the values counted when not held
    programs = sg.value_sums.programs  # values whose blocks are held apart (value_sums)
    held_count: dict = {}  # value -> held states holding it
    held = grads = 0  # bytes of the held values; of the boundary gradients alive
    grad_of: dict = {}  # value -> bytes of its gradient, alive
    flops, runs = 0.0, [0] * (sg.m + 1)
    peak = peak_state = peak_grad = 0

    def note(values) -> None:
        nonlocal peak, peak_state, peak_grad
        state = held + sum(size[e] for e in values if e not in held_count)
        peak_state, peak_grad = max(peak_state, state), max(peak_grad, grads)
        peak = max(peak, state + grads)

    for op in operations(tree, sg.m):
        kind = type(op)
        if kind is Release:
            for e in sg.crossing[op.cut]:
                n = held_count.pop(e) - 1
                if n:
                    held_count[e] = n
                else:
                    held -= size[e]
            continue
        seg = sg.segments[op.segment - 1]
        if runs_forward(op):
            flops += seg.flops
            runs[op.segment] += 1
        if kind is Forward:
            note(free[op.segment - 1] | free[op.segment])
            if op.keep:
                for e in sg.crossing[op.segment]:
                    n = held_count.get(e, 0)
                    if not n:
                        held += size[e]
                    held_count[e] = n + 1
            continue
        for e in seg.inputs:
            if e in programs:  # its partial sums held after this backward
                now = programs[e].held[op.segment] * size[e]
                grads += now - grad_of.get(e, 0)
                grad_of[e] = now
            elif e not in sg.one_hop and e not in grad_of:
                grad_of[e] = size[e]
                grads += size[e]
        note(free[op.segment - 1])
        for e in seg.outputs:
            grads -= grad_of.pop(e, 0)
    return DryRun(flops, peak_state, peak_grad, peak, runs[1:])


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

    @cached_property
    def operations(self) -> list[Operation]:
        """The schedule as it runs (schedule.operations): what the dry run counted and the
        segmented executor replays."""
        return operations(self.tree, self.segments.m)

    def bind_order(self) -> list[str]:
        return sorted(self.template_bytes, key=lambda k: -self.template_bytes[k])

    def describe(self) -> dict:
        return {"segments": self.segments.m, "templates": len(self.template_bytes),
                "pool_mb": round(self.pool_bytes / 2**20, 3),
                "staging_mb": round(self.staging_bytes / 2**20, 3),
                "kept_mb": round(self.dry.peak_bytes / 2**20, 3),
                "mask_mb": round(self.mask_bytes / 2**20, 3),
                "statistics_mb": round(self.statistics_bytes / 2**20, 3)}


def template_graphs(sg: Segments) -> dict[str, training_graph.TrainingGraph]:
    """Every template executor's training graph, by template key (the templates of one
    structure share one graph)."""
    graphs: dict[str, training_graph.TrainingGraph] = {}
    built: dict[str, training_graph.TrainingGraph] = {}  # by structure
    for seg in sg.segments:
        if seg.key in graphs:
            continue
        if seg.structure not in built:
            g = seg.graph
            if g.templates is None:
                raise ValueError("the graph has no templates: load it with the adapter")
            backward.attach(g)
            built[seg.structure] = training_graph.build(g, set())
        graphs[seg.key] = built[seg.structure]
    return graphs


def template_memory(sg: Segments) -> tuple[dict[str, int], dict[str, list[int]]]:
    """Simulated MXNet planned bytes and block sizes of every template's training graph."""
    totals, blocks = {}, {}
    simulated: dict[int, Any] = {}  # id of a shared graph -> its result
    for key, tg in template_graphs(sg).items():
        if id(tg) not in simulated:
            simulated[id(tg)] = memory_plan.simulate(tg)
        totals[key] = simulated[id(tg)].total_bytes
        blocks[key] = list(simulated[id(tg)].block_bytes)
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
    owner holds them as pairs of one BatchNorm op each (runtime.segmented.pool.pool_owner),
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
