"""The segment model: a forward graph cut into a chain of segments, run several times.

MXNet's attribute mirroring recomputes each node at most once. Plans that need
more (the paper's recursive O(log n) plan, or any budget tighter than one extra
forward) cut the forward graph at chosen cuts into segments; each segment is a
sub-graph (inputs: the values crossing the cut before it and the original
variables it reads; outputs: the values crossing the cut after it and the graph
heads it computes). Segments with the same structure and shapes share one
template (one executor at run time).

Forward keeps only the values crossing the cuts the tree stores. Backward
re-runs segments per a binary tree over the chain of cuts 0..m
(``tree[(s, e)] = mid``): to backpropagate segments s+1..e from the state at
cut s, run forward to ``mid`` keeping only that state, backpropagate (mid, e],
drop it, then backpropagate (s, mid]. A leaf (s, s+1) runs the segment's
forward then its backward. Binary midpoints give the paper's recursion
(O(log n) stored states, O(n log n) recompute); ``planners.multilevel`` chooses
the tree for a byte budget.

This module is planning only: what a segmented plan keeps, recomputes and
costs (``build_segments``, the walkers, ``dry_run``, ``make_segment_plan``).
``executor.SegmentedExecutor`` runs it on MXNet.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from math import prod
from typing import Any

from . import memory, ops, training_graph
from .errors import PlanError
from .graph import AUX, INPUT, OP, PARAM, Entry, Graph, Node

Tree = dict[tuple[int, int], int]
_STRIP = {"__force_mirroring__", "__mirror_stage__", "mirror_stage"}
_PREFIX = {"state": "_s", "arg": "_a", "aux": "_x", "mask": "_m", "ograd": "_g", "hgrad": "_h"}


# ----------------------------------------------------------------- segments
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
        from .grad_sums import weight_sums

        return weight_sums(self)

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
    last_reader: dict[Entry, int] = {}
    for nd in order:
        for src, k in nd.inputs:
            if not graph.nodes[src].is_variable:
                last_reader[(src, k)] = max(last_reader.get((src, k), 0), seg_of[nd.id])
    for nd in graph.nodes:
        if not nd.is_variable and ops.is_random(nd.op) and nd.op != "Dropout":
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
                   [nd.id for nd in order if nd.op == "Dropout"])
    for i in range(1, m + 1):
        ids = [order[p].id for p in range(bounds[i - 1] + 1, bounds[i] + 1)]
        outputs = sorted((e for e in crossing[i] if seg_of[e[0]] == i), key=lambda e: (pos[e[0]],
                                                                                       e[1]))
        heads = [j for j, h in enumerate(graph.heads) if seg_of.get(h[0]) == i]
        segs.append(_make_segment(out, i, ids, outputs, heads, split))
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


def _make_segment(sg: Segments, index: int, ids: list[int], outputs: list[Entry],
                  heads: list[int], split: frozenset) -> Segment:
    """The segment as a graph of its own (Graph IR, built from the parent's nodes) and its
    MXNet symbol JSON (what the executor binds)."""
    graph = sg.graph
    sub: list[Node] = []
    local: dict[int, int] = {}
    var_of: dict[tuple, int] = {}
    slots: list[tuple[str, tuple]] = []
    inputs: list[Entry] = []
    ids_set = set(ids)

    def add(op: str, ins: list[Entry], shapes: list[tuple], dtypes: list[str],
            attrs: dict | None = None, flops: float = 0.0) -> int:
        sub.append(Node(len(sub), f"_o{len(sub)}", op, attrs or {}, ins, OP, list(shapes),
                        list(dtypes), flops=flops, visible=len(shapes)))
        return len(sub) - 1

    def like(e: Entry) -> tuple[list[tuple], list[str]]:
        return [sub[e[0]].shapes[e[1]]], [sub[e[0]].dtypes[e[1]]]

    def var(key: tuple, shape: tuple, dtype: str, grad: str) -> int:
        if key not in var_of:
            # one counter per kind, so that slots of the same role get the same name in
            # every template and share one array (shared_buffer)
            prefix = _PREFIX[key[0]]
            name = f"{prefix}{sum(1 for _, k in slots if k[0] == key[0])}"
            kind = AUX if key[0] == "aux" else (INPUT if grad == "null" else PARAM)
            if kind == AUX:  # shared_exec lends its aux arrays by name: name the shape
                name += "_" + "x".join(map(str, shape)) + "_" + dtype
            sub.append(Node(len(sub), name, None, kind=kind, shapes=[tuple(shape)],
                            dtypes=[dtype], grad_req="null" if kind == AUX else grad))
            var_of[key] = len(sub) - 1
            slots.append((name, key))
            if key[0] == "state":
                inputs.append(key[1])
        return var_of[key]

    def ref(src: int, k: int, reader: int | None = None) -> Entry:
        nd = graph.nodes[src]
        if nd.is_variable:
            kind = "aux" if nd.kind == AUX else "arg"
            use = (reader,) if nd.name in split else ()  # a slot per reading node
            return (var((kind, nd.name) + use, nd.shapes[0], nd.dtypes[0],
                        "null" if nd.grad_req == "null" else "write"), 0)
        if src in local:
            return (local[src], k)
        return (var(("state", (src, k)), nd.shapes[k], nd.dtypes[k], "write"), 0)

    # boundary inputs first, largest first: slots of a role are then named by size in
    # every template, and the arrays they share across templates stay small
    ext = []
    for nid in ids:
        for src, k in graph.nodes[nid].inputs:
            if not graph.nodes[src].is_variable and src not in ids_set and (src, k) not in ext:
                ext.append((src, k))
    for src, k in sorted(ext, key=lambda e: -graph.entry_bytes(e)):
        ref(src, k)
    flops = 0.0
    for nid in ids:
        nd = graph.nodes[nid]
        flops += nd.flops
        ins = [ref(s, k, nid) for s, k in nd.inputs]
        if nd.op == "Dropout":
            src = graph.nodes[nd.inputs[0][0]]
            k = nd.inputs[0][1]
            mask = var(("mask", nid), src.shapes[k], src.dtypes[k], "null")
            local[nid] = add("elemwise_mul", [ins[0], (mask, 0)], *like(ins[0]))
        else:
            attrs = {k: v for k, v in nd.attrs.items() if k not in _STRIP}
            local[nid] = add(nd.op, ins, nd.shapes[:nd.visible], nd.dtypes[:nd.visible],
                             attrs, nd.flops)
    # Outputs: every boundary value under BlockGrad (in place, no head gradient), then the
    # graph heads, then one MakeLoss(dot(value, gradient-input)) per value that needs a
    # gradient from outside: its backward hands the gradient input to the value exactly
    # (1 * g), and MXNet allocates no head-gradient array per executor for a loss.
    head_refs: list[Entry] = []
    losses = []
    # (of equal size, the last made first where weights have a slot per use: the backward
    # then visits, and writes, the later uses of a weight first, as MXNet's sum adds them)
    outputs = sorted(outputs[::-1] if split else outputs, key=lambda e: -graph.entry_bytes(e))
    for e in outputs:
        # the value leaves flat (the executor reads it through views of that shape): with
        # MKL-DNN, the reshape reorders a blocked layout to plain once, and both the output
        # and the loss read that
        flat = _flat(add, (local[e[0]], e[1]), sub)
        head_refs.append((add("BlockGrad", [flat], *like(flat)), 0))
        g = var(("ograd", e), (prod(graph.nodes[e[0]].shapes[e[1]]),),
                graph.nodes[e[0]].dtypes[e[1]], "null")
        losses.append((flat, g))
    for j in heads:
        s, k = graph.heads[j]
        mine = (local[s], k)
        if graph.nodes[s].op in ops.LOSSES or graph.nodes[s].op in ("BlockGrad",
                                                                    "stop_gradient"):
            head_refs.append(mine)
        else:
            head_refs.append((add("BlockGrad", [mine], *like(mine)), 0))
            losses.append((_flat(add, mine, sub), var(("hgrad", j),
                                                       (prod(graph.nodes[s].shapes[k]),),
                                                       graph.nodes[s].dtypes[k], "null")))
    for flat, g in losses:
        # loss = dot(o, g) of two vectors: its backward gives o the gradient g exactly
        # (1 * g_i), and the forward is one BLAS dot product (MXNet's sum over all axes of
        # o * g cost as much as a convolution; the same dot of a row and a column, a gemm
        # of m = n = 1, ran 15x slower than this vector dot). The gradient-input slot g is
        # flat too (the executor fills it through a view of the value's shape): a reshape
        # of it would be a copy made in the forward, before the executor has filled it
        dtype = sub[flat[0]].dtypes[flat[1]]
        total = add("dot", [flat, (g, 0)], [(1,)], [dtype])
        head_refs.append((add("MakeLoss", [(total, 0)], [(1,)], [dtype]), 0))
    sub_graph = Graph(sub, head_refs, templates=graph.templates)
    text = to_json(sub_graph)
    args = [n for n in sub if n.is_variable and n.kind != AUX]
    shapes = {n.name: n.shapes[0] for n in args}
    types = {n.name: n.dtypes[0] for n in sub if n.is_variable}
    req = {n.name: n.grad_req for n in args}
    key = json.dumps([text, sorted(shapes.items()), sorted(types.items()),
                      sorted(req.items())])
    sg.slot_shapes[key] = shapes
    sg.slot_types[key] = types
    sg.slot_req[key] = req
    return Segment(index, ids, inputs, list(outputs), heads, slots, text, key, flops,
                   sub_graph, key)


def _flat(add: Any, value: Entry, sub: list[Node]) -> Entry:
    """`value` reshaped (in place) to one dimension, a node added with `add`."""
    n, dtype = prod(sub[value[0]].shapes[value[1]]), sub[value[0]].dtypes[value[1]]
    return (add("Reshape", [value], [(n,)], [dtype], {"shape": "(-1,)"}), 0)


def to_json(graph: Graph) -> str:
    """MXNet symbol JSON of a graph built here. A mutated input (aux state) is read at
    version 1, as MXNet writes it; at version 0 BatchNorm's update of its running
    statistics is lost."""
    nodes = []
    for n in graph.nodes:
        if n.is_variable:
            nodes.append({"op": "null", "name": n.name, "inputs": []})
            continue
        node = {"op": n.op, "name": n.name, "inputs": [
            [s, k, 1 if graph.nodes[s].kind == AUX else 0] for s, k in n.inputs]}
        if n.attrs:
            node["attrs"] = n.attrs
        nodes.append(node)
    data = {"nodes": nodes,
            "arg_nodes": [n.id for n in graph.nodes if n.is_variable],
            "heads": [[s, k, 0] for s, k in graph.heads],
            "attrs": {"mxnet_version": ["int", 10901]}}
    return json.dumps(data, sort_keys=True)


# ----------------------------------------------------------------- schedules
def binary_tree(m: int, lo: int = 0, hi: int | None = None) -> Tree:
    """The paper's recursion with k = 1: split every range at its midpoint."""
    hi = m if hi is None else hi
    tree: Tree = {}
    stack = [(lo, hi)]
    while stack:
        s, e = stack.pop()
        if e - s < 2:
            continue
        mid = (s + e) // 2
        tree[(s, e)] = mid
        stack += [(s, mid), (mid, e)]
    return tree


def store_all_tree(m: int) -> Tree:
    """Keep every cut (one recomputation per segment): the sqrt plan's shape."""
    return {(s, m): s + 1 for s in range(m - 1)}


def spine(tree: Tree, m: int) -> list[int]:
    """Cuts stored by the first forward pass: 0 = s0 < s1 < ... < m-1."""
    out, s = [0], 0
    while m - s > 1:
        s = tree[(s, m)]
        out.append(s)
    return out


class Driver:
    """What a schedule walk does per step; subclassed by the executor and the dry run."""

    def fwd(self, i: int, state: dict, first: bool) -> dict:  # pragma: no cover
        raise NotImplementedError

    def forward_backward(self, i: int, state: dict) -> None:  # pragma: no cover
        raise NotImplementedError

    def hold(self, state: dict) -> None:
        pass

    def release(self, state: dict) -> None:
        pass


def walk_forward(drv: Driver, tree: Tree, m: int) -> dict[int, dict]:
    """First (training) forward: run every segment, keep the states on the spine."""
    keep = set(spine(tree, m))
    stored = {0: {}}
    drv.hold(stored[0])
    state: dict = {}
    for i in range(1, m + 1):
        state = drv.fwd(i, state, True)
        if i in keep:
            stored[i] = state
            drv.hold(state)
    return stored


def walk_backward(drv: Driver, tree: Tree, m: int, stored: dict[int, dict]) -> None:
    """Backward per the tree, from the states the first forward stored."""
    sp = spine(tree, m)
    drv.forward_backward(m, stored[sp[-1]])
    for j in range(len(sp) - 2, -1, -1):
        drv.release(stored.pop(sp[j + 1]))
        _walk_range(drv, tree, sp[j], sp[j + 1], stored[sp[j]])
    drv.release(stored.pop(0))


def _walk_range(drv: Driver, tree: Tree, s: int, e: int, state_s: dict) -> None:
    if e == s + 1:
        drv.forward_backward(e, state_s)
        return
    mid = tree[(s, e)]
    st = state_s
    for i in range(s + 1, mid + 1):
        st = drv.fwd(i, st, False)
    drv.hold(st)
    _walk_range(drv, tree, mid, e, st)
    drv.release(st)
    del st
    _walk_range(drv, tree, s, mid, state_s)


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
                raise ValueError("the graph has no template source: load it with the adapter")
            g.templates(g)
            res = simulated[seg.structure] = memory.simulate(training_graph.build(g, set()))
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
            b = prod(shapes[name]) * _itemsize(types[name])
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
        per = prod(shape) * _itemsize(dtype)
        total += len(names) * per + len(names) // 2 * 4 * per
    return total


def _itemsize(dtype: str) -> int:
    return {"float16": 2, "float64": 8, "int64": 8, "uint8": 1, "int8": 1}.get(dtype, 4)


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
