"""Recomputing a node more than once: a chain of MXNet executors driven by mxmirror.

MXNet's attribute mirroring recomputes each node at most once. Plans that need
more (the paper's recursive O(log n) plan, or any budget tighter than one extra
forward) are run here: the forward graph is cut at chosen cuts into segments,
each segment becomes a sub-symbol (inputs: the values crossing the cut before
it and the original variables it reads; outputs: the values crossing the cut
after it and the graph heads it computes) and is bound as an ordinary MXNet
executor. All executors draw on one memory pool (``shared_exec``), and
segments with the same structure and shapes share one executor ("template"):
the values, parameters, BatchNorm statistics and Dropout masks of a segment
are copied into the template's slots before it runs, and gradients and
updated statistics copied back out after its backward.

Forward keeps only the values crossing the cuts the schedule stores.
Backward re-runs segments per a schedule: a binary tree over the chain of
cuts 0..m (``tree[(s, e)] = mid``): to backpropagate segments s+1..e from the
state at cut s, run forward to ``mid`` keeping only that state, backpropagate
(mid, e], drop it, then backpropagate (s, mid]. A leaf (s, s+1) runs the
segment's forward then its backward on the same executor. Binary midpoints
give the paper's recursion (O(log n) stored states, O(n log n) recompute);
``planners.multilevel`` chooses the tree for a byte budget.

Correctness:
- BatchNorm: MXNet 1.9.1 updates running statistics in the backward pass, so
  each segment's backward, which runs exactly once per step, updates them once.
- Dropout: replaced in the sub-symbols by a multiplication with a mask input;
  the masks are drawn once per training forward with MXNet's own Dropout
  (on ones, in the graph's forward order), so every recomputation sees the
  same mask, and with the same seed the masks are bit-identical to those of an
  unplanned executor (tests/test_segmented.py).
- Parameter gradients are accumulated across segments (shared weights of an
  unrolled LSTM), honouring grad_req write/add/null.

This module imports MXNet only inside functions: the schedule and memory model
(``Schedule``, ``build_segments``, ``dry_run``) work on the Graph IR alone.
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

from . import ops
from .errors import PlanError
from .graph import AUX, Entry, Graph

log = logging.getLogger("mxmirror")

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
    json: str  # the sub-symbol, canonical names (equal for equal structure)
    key: str  # template key: json + slot shapes, dtypes, grad_req
    flops: float = 0.0


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


def crossing_bytes(graph: Graph) -> list[int]:
    """Bytes of the values produced at or before each op position and read after it."""
    from .planners.common import op_order

    order = op_order(graph)
    pos = {nd.id: i for i, nd in enumerate(order)}
    last: dict[Entry, int] = {}
    for nd in order:
        for src, k in nd.inputs:
            if src in pos:
                last[(src, k)] = max(last.get((src, k), -1), pos[nd.id])
    delta = [0] * (len(order) + 1)
    for (src, k), end in last.items():
        if end > pos[src]:
            delta[pos[src]] += graph.entry_bytes((src, k))
            delta[end] -= graph.entry_bytes((src, k))
    out, run = [], 0
    for i in range(len(order)):
        run += delta[i]
        out.append(run)
    return out


def build_segments(graph: Graph, cuts: list[int]) -> Segments:
    """Cut the graph after the given op-order positions (pure Graph IR, no MXNet)."""
    from .planners.common import op_order

    order = op_order(graph)
    n = len(order)
    cuts = sorted({c for c in cuts if 0 <= c < n - 1})
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
    crossing = [frozenset()]
    for i in range(1, m + 1):
        crossing.append(frozenset(e for e, r in last_reader.items()
                                  if seg_of[e[0]] <= i < r))
    segs = []
    out = Segments(graph, cuts, segs, crossing,
                   [nd.id for nd in order if nd.op == "Dropout"])
    for i in range(1, m + 1):
        ids = [order[p].id for p in range(bounds[i - 1] + 1, bounds[i] + 1)]
        outputs = sorted((e for e in crossing[i] if seg_of[e[0]] == i), key=lambda e: (pos[e[0]],
                                                                                       e[1]))
        heads = [j for j, h in enumerate(graph.heads) if seg_of.get(h[0]) == i]
        segs.append(_make_segment(out, i, ids, outputs, heads))
    return out


def _make_segment(sg: Segments, index: int, ids: list[int], outputs: list[Entry],
                  heads: list[int]) -> Segment:
    graph = sg.graph
    nodes: list[dict] = []
    local: dict[int, int] = {}
    var_of: dict[tuple, int] = {}
    slots: list[tuple[str, tuple]] = []
    shapes, types, req = {}, {}, {}
    inputs: list[Entry] = []
    ids_set = set(ids)

    def var(key: tuple, shape: tuple, dtype: str, grad: str | None) -> int:
        if key not in var_of:
            # one counter per kind, so that slots of the same role get the same name in
            # every template and share one array (shared_buffer)
            prefix = _PREFIX[key[0]]
            name = f"{prefix}{sum(1 for _, k in slots if k[0] == key[0])}"
            if key[0] == "aux":  # shared_exec lends its aux arrays by name: name the shape
                name += "_" + "x".join(map(str, shape)) + "_" + dtype
            nodes.append({"op": "null", "name": name, "inputs": []})
            var_of[key] = len(nodes) - 1
            slots.append((name, key))
            if key[0] != "aux":
                shapes[name] = tuple(shape)
                req[name] = grad
            types[name] = dtype
            if key[0] == "state":
                inputs.append(key[1])
        return var_of[key]

    def ref(src: int, k: int) -> list[int]:
        nd = graph.nodes[src]
        if nd.is_variable:
            kind = "aux" if nd.kind == AUX else "arg"
            # a mutated input (aux state) is read at version 1, as MXNet writes it; at
            # version 0 BatchNorm's update of its running statistics is lost
            return [var((kind, nd.name), nd.shapes[0], nd.dtypes[0],
                        "null" if nd.grad_req == "null" else "write"), 0,
                    1 if kind == "aux" else 0]
        if src in local:
            return [local[src], k, 0]
        return [var(("state", (src, k)), nd.shapes[k], nd.dtypes[k], "write"), 0, 0]

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
        ins = [ref(s, k) for s, k in nd.inputs]
        if nd.op == "Dropout":
            src = graph.nodes[nd.inputs[0][0]]
            shape = src.shapes[nd.inputs[0][1]]
            mask = var(("mask", nid), shape, src.dtypes[nd.inputs[0][1]], "null")
            nodes.append({"op": "elemwise_mul", "name": f"_o{len(nodes)}", "inputs":
                          [ins[0], [mask, 0, 0]]})
        else:
            attrs = {k: v for k, v in nd.attrs.items() if k not in _STRIP}
            node = {"op": nd.op, "name": f"_o{len(nodes)}", "inputs": ins}
            if attrs:
                node["attrs"] = attrs
            nodes.append(node)
        local[nid] = len(nodes) - 1
    # Outputs: every boundary value under BlockGrad (in place, no head gradient), then the
    # graph heads, then one MakeLoss(sum(value * gradient-input)) per value that needs a
    # gradient from outside: its backward hands the gradient input to the value exactly
    # (1 * g), and MXNet allocates no head-gradient array per executor for a loss.
    def add(op: str, ins: list, attrs: dict | None = None) -> int:
        nodes.append({"op": op, "name": f"_o{len(nodes)}", "inputs": ins,
                      **({"attrs": attrs} if attrs else {})})
        return len(nodes) - 1

    head_refs, losses = [], []
    outputs = sorted(outputs, key=lambda e: -graph.entry_bytes(e))
    for e in outputs:
        head_refs.append([add("BlockGrad", [[local[e[0]], e[1], 0]]), 0, 0])
        g = var(("ograd", e), graph.nodes[e[0]].shapes[e[1]], graph.nodes[e[0]].dtypes[e[1]],
                "null")
        losses.append((e, g))
    for j in heads:
        s, k = graph.heads[j]
        if graph.nodes[s].op in ops.LOSSES or graph.nodes[s].op in ("BlockGrad",
                                                                    "stop_gradient"):
            head_refs.append([local[s], k, 0])
        else:
            head_refs.append([add("BlockGrad", [[local[s], k, 0]]), 0, 0])
            losses.append(((s, k), var(("hgrad", j), graph.nodes[s].shapes[k],
                                       graph.nodes[s].dtypes[k], "null")))
    for (s, k), g in losses:
        # loss = sum(o * g): its backward gives o the gradient g exactly (1 * g_i), and
        # the product is a temporary (not an output kept in the pool)
        mul = add("elemwise_mul", [[local[s], k, 0], [g, 0, 0]])
        total = add("sum", [[mul, 0, 0]])
        head_refs.append([add("MakeLoss", [[total, 0, 0]]), 0, 0])
    data = {"nodes": nodes, "arg_nodes": [i for i, nd in enumerate(nodes) if nd["op"] == "null"],
            "heads": head_refs, "attrs": {"mxnet_version": ["int", 10901]}}
    text = json.dumps(data, sort_keys=True)
    key = json.dumps([text, sorted(shapes.items()), sorted(types.items()),
                      sorted(req.items())])
    sg.slot_shapes[key] = shapes
    sg.slot_types[key] = types
    sg.slot_req[key] = req
    return Segment(index, ids, inputs, list(outputs), heads, slots, text, key, flops)


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


class _Driver:
    """What a schedule walk does per step; subclassed by the executor and the dry run."""

    def fwd(self, i: int, state: dict, first: bool) -> dict:  # pragma: no cover
        raise NotImplementedError

    def fb(self, i: int, state: dict) -> None:  # pragma: no cover
        raise NotImplementedError

    def hold(self, state: dict) -> None:
        pass

    def release(self, state: dict) -> None:
        pass


def walk_forward(drv: _Driver, tree: Tree, m: int) -> dict[int, dict]:
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


def walk_backward(drv: _Driver, tree: Tree, m: int, stored: dict[int, dict]) -> None:
    """Backward per the tree, from the states the first forward stored."""
    sp = spine(tree, m)
    drv.fb(m, stored[sp[-1]])
    for j in range(len(sp) - 2, -1, -1):
        drv.release(stored.pop(sp[j + 1]))
        _walk_range(drv, tree, sp[j], sp[j + 1], stored[sp[j]])
    drv.release(stored.pop(0))


def _walk_range(drv: _Driver, tree: Tree, s: int, e: int, state_s: dict) -> None:
    if e == s + 1:
        drv.fb(e, state_s)
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


class _DryDriver(_Driver):
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
        for d in list(self.held.values()) + list(extra):
            alive |= set(d)
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

    def fb(self, i, state):
        seg = self.sg.segments[i - 1]
        if self.live != i:
            self.flops += seg.flops
            self.runs[i] += 1
        self.live = None
        for e in seg.inputs:
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
    dry: DryRun

    @property
    def planned_bytes(self) -> int:
        return (self.pool_bytes + self.staging_bytes + self.mask_bytes + self.output_bytes
                + self.dry.peak_bytes)

    def bind_order(self) -> list[str]:
        return sorted(self.template_bytes, key=lambda k: -self.template_bytes[k])

    def describe(self) -> dict:
        return {"segments": self.segments.m, "templates": len(self.template_bytes),
                "pool_mb": round(self.pool_bytes / 2**20, 3),
                "staging_mb": round(self.staging_bytes / 2**20, 3),
                "kept_mb": round(self.dry.peak_bytes / 2**20, 3),
                "mask_mb": round(self.mask_bytes / 2**20, 3)}


def template_memory(sg: Segments) -> tuple[dict[str, int], dict[str, list[int]]]:
    """Simulated MXNet planned bytes and block sizes of every template's training graph."""
    from . import memory, mxnet_adapter, schedule

    totals, blocks = {}, {}
    seen = {}
    for seg in sg.segments:
        if seg.key in seen:
            continue
        seen[seg.key] = True
        g = mxnet_adapter.load_graph(seg.json, sg.slot_shapes[seg.key],
                                     type_dict=sg.slot_types[seg.key],
                                     grad_req=sg.slot_req[seg.key])
        res = memory.simulate(schedule.build(g, set()))
        totals[seg.key] = res.total_bytes
        blocks[seg.key] = list(res.block_bytes)
    return totals, blocks


def staging_bytes(sg: Segments) -> int:
    """Template slots of activation size (boundary values and their gradients, gradient
    inputs, Dropout masks): shared by name across templates, so the largest per name."""
    size: dict[str, int] = {}
    for seg in sg.segments:
        shapes = sg.slot_shapes[seg.key]
        for name, key in seg.slots:
            if key[0] in ("arg", "aux"):
                continue  # parameter-like (as MXNet's own figure leaves arguments out)
            b = _size(shapes[name]) * 4
            size[name] = max(size.get(name, 0), b)
            if key[0] == "state":
                size["grad of " + name] = max(size.get("grad of " + name, 0), b)
    return sum(size.values())


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
                       dry_run(sg, tree))


# ----------------------------------------------------------------- the executor
def _raw_simple_bind():
    import mxnet as mx

    from . import bind

    return bind._originals.get("simple_bind", mx.sym.Symbol.simple_bind)


class SegmentedExecutor(_Driver):
    """An executor with the ``mx.executor.Executor`` interface that runs a SegmentPlan."""

    def __init__(self, symbol: Any, ctx: Any, plan: SegmentPlan, grad_req: Any = "write",
                 args: dict | None = None, args_grad: dict | None = None,
                 aux_states: dict | None = None, shared_exec: Any = None,
                 shared_arg_names: list[str] | None = None,
                 shared_buffer: dict | None = None) -> None:
        import mxnet as mx

        self._mx = mx
        self._symbol = symbol
        self.ctx = ctx
        self.plan = plan
        sg = self.sg = plan.segments
        graph = sg.graph
        self._arg_names = symbol.list_arguments()
        self._aux_names = symbol.list_auxiliary_states()
        self._out_names = symbol.list_outputs()
        var = {n.name: n for n in graph.nodes if n.is_variable}
        shared_arg_names = set(shared_arg_names or [])
        sx = shared_exec
        self.arg_dict, self.grad_dict, self.aux_dict = {}, {}, {}
        self._req = {}
        for name in self._arg_names:
            nd = var[name]
            shape, dtype = nd.shapes[0], nd.dtypes[0]
            if args is not None and args.get(name) is not None:
                arr = args[name]
            elif sx is not None and name in shared_arg_names and name in sx.arg_dict:
                arr = sx.arg_dict[name]
            elif shared_buffer is not None and name in shared_buffer and \
                    shared_buffer[name].size >= _size(shape):
                arr = shared_buffer[name].reshape(shape) if shared_buffer[name].shape != \
                    tuple(shape) else shared_buffer[name]
            else:
                arr = mx.nd.zeros(shape, ctx, dtype=dtype)
                if shared_buffer is not None and name not in shared_arg_names:
                    shared_buffer[name] = arr
            self.arg_dict[name] = arr
            req = nd.grad_req if nd.grad_req in ("write", "add", "null") else "write"
            self._req[name] = req
            if req == "null":
                self.grad_dict[name] = None
            elif args_grad is not None and args_grad.get(name) is not None:
                self.grad_dict[name] = args_grad[name]
            elif sx is not None and name in shared_arg_names and \
                    sx.grad_dict.get(name) is not None:
                self.grad_dict[name] = sx.grad_dict[name]
            else:
                self.grad_dict[name] = mx.nd.zeros(shape, ctx, dtype=dtype)
        for name in self._aux_names:
            nd = var[name]
            if aux_states is not None and aux_states.get(name) is not None:
                self.aux_dict[name] = aux_states[name]
            elif sx is not None and name in getattr(sx, "aux_dict", {}):
                self.aux_dict[name] = sx.aux_dict[name]
            else:
                self.aux_dict[name] = mx.nd.zeros(nd.shapes[0], ctx, dtype=nd.dtypes[0])
        self.outputs = [mx.nd.zeros(graph.nodes[h[0]].shapes[h[1]], ctx,
                                    dtype=graph.nodes[h[0]].dtypes[h[1]]) for h in graph.heads]
        # one executor per template, the largest first, all on its memory pool
        raw = _raw_simple_bind()
        self._execs: dict[str, Any] = {}
        owner = self._owner(raw)
        by_key = {seg.key: seg for seg in sg.segments}
        # slots of the same name share one array across templates (only one runs at a time
        # and every slot is filled right before its executor runs)
        self._slot_buffer = self._slot_arrays()
        for key in plan.bind_order():
            seg = by_key[key]
            sym = mx.sym.load_json(seg.json)
            ex = raw(sym, ctx, grad_req=sg.slot_req[key], type_dict=sg.slot_types[key],
                     shared_exec=owner, shared_buffer=self._slot_buffer,
                     **sg.slot_shapes[key])
            owner = owner or ex
            self._execs[key] = ex
        self._ones: dict[tuple, Any] = {}
        self._masks: dict[int, Any] = {}
        self._stored: dict[int, dict] | None = None
        self._live: int | None = None
        self._head_grads: list | None = None
        self._grads: dict = {}
        self._held: dict[int, dict] = {}
        self.peak_kept_bytes = 0  # measured: bytes of kept values and gradients at the peak
        self.forward_flops_run = 0.0  # measured: FLOPs of every segment forward executed

    def _slot_arrays(self) -> dict:
        """One array per slot name, as large as its largest use: every template binds a view
        of it (shared_buffer), so none re-allocates (and MXNet logs nothing)."""
        mx = self._mx
        need: dict[str, tuple[int, str]] = {}
        for seg in self.sg.segments:
            shapes, types = self.sg.slot_shapes[seg.key], self.sg.slot_types[seg.key]
            req = self.sg.slot_req[seg.key]
            for name, key in seg.slots:
                if key[0] == "aux":
                    continue
                names = [name] + (["grad of " + name] if req.get(name) != "null" else [])
                for n in names:
                    size, dtype = _size(shapes[name]), types[name]
                    old = need.get(n)
                    if old is not None and old[1] != dtype:
                        need[n] = (0, "")  # mixed dtypes: let MXNet allocate
                    elif old is None or (old[1] and size > old[0]):
                        need[n] = (size, dtype)
        return {n: mx.nd.zeros((size,), self.ctx, dtype=dtype)
                for n, (size, dtype) in need.items() if size}

    def _owner(self, raw: Any) -> Any:
        """The executor that owns the shared pool: forward-only, its outputs are the pool's
        blocks (segmented.pool_blocks), and it holds every template's aux slots (with
        shared_exec MXNet takes every auxiliary state from the owner, by name)."""
        mx = self._mx
        aux: dict[str, tuple] = {}
        by_name = self.sg.graph.by_name()
        for seg in self.sg.segments:
            for name, key in seg.slots:
                if key[0] == "aux":
                    nd = by_name[key[1]]
                    aux[name] = (tuple(nd.shapes[0]), nd.dtypes[0])
        outs, shapes, types = [], {}, {}
        for i, b in enumerate(pool_blocks(self.plan.template_blocks)):
            if b:
                outs.append(mx.sym.zeros(shape=(b // 4,), dtype="float32", name=f"_pool{i}"))
        groups: dict[tuple, list[str]] = {}
        for name, sd in aux.items():
            if len(sd[0]) != 1:
                raise PlanError(f"auxiliary state of shape {sd[0]}: the segmented executor "
                                f"only shares 1-D (BatchNorm) auxiliary states")
            groups.setdefault(sd, []).append(name)
        for j, ((shape, dtype), names) in enumerate(groups.items()):
            if len(names) % 2:
                names = names + [f"_pad{j}"]
            for i in range(0, len(names), 2):
                data = f"_d{j}_{i}"
                shapes[data] = (1, shape[0])
                types[data] = dtype
                outs.append(mx.sym.BatchNorm(
                    mx.sym.Variable(data), mx.sym.Variable(f"{data}_g"),
                    mx.sym.Variable(f"{data}_b"), mx.sym.Variable(names[i]),
                    mx.sym.Variable(names[i + 1]), name=f"{data}_bn"))
        if not outs:
            return None
        sym = mx.sym.Group(outs)
        types.update({n: sd[1] for n, sd in aux.items()})
        return raw(sym, self.ctx, grad_req="null", type_dict=types, **shapes)

    # -------------------------------------------------------------- interface
    @property
    def arg_arrays(self) -> list:
        return [self.arg_dict[n] for n in self._arg_names]

    @property
    def grad_arrays(self) -> list:
        return [self.grad_dict[n] for n in self._arg_names]

    @property
    def aux_arrays(self) -> list:
        return [self.aux_dict[n] for n in self._aux_names]

    @property
    def output_dict(self) -> dict:
        return dict(zip(self._out_names, self.outputs))

    def forward(self, is_train: bool = False, **kwargs: Any) -> list:
        for name, value in kwargs.items():
            if name not in self.arg_dict:
                raise ValueError(f"unknown argument {name!r}")
            _assign(self.arg_dict[name], value)
        self._draw_masks(is_train)
        self._stored = None
        self._grads = {}
        self._held = {}
        if is_train:
            self._stored = walk_forward(self, self.plan.tree, self.sg.m)
        else:
            state: dict = {}
            for i in range(1, self.sg.m + 1):
                state = self._run_forward(i, state, True, False)
            self._live = None
        return self.outputs

    def backward(self, out_grads: Any = None, is_train: bool = True) -> None:
        mx = self._mx
        if self._stored is None:
            raise PlanError("backward() needs a forward(is_train=True) first (the segmented "
                            "executor keeps only the states of one training forward)")
        if out_grads is None:
            out_grads = []
        elif isinstance(out_grads, mx.nd.NDArray):
            out_grads = [out_grads]
        elif isinstance(out_grads, dict):
            out_grads = [out_grads.get(n) for n in self._out_names]
        self._head_grads = list(out_grads) + [None] * (len(self.outputs) - len(out_grads))
        for name, req in self._req.items():
            if req == "write":
                self.grad_dict[name][:] = 0
        stored, self._stored = self._stored, None
        self._grads = {}
        walk_backward(self, self.plan.tree, self.sg.m, stored)
        self._grads = {}
        self._held = {}
        self._head_grads = None

    def copy_params_from(self, arg_params: dict, aux_params: dict | None = None,
                         allow_extra_params: bool = False) -> None:
        for name, array in arg_params.items():
            if name in self.arg_dict:
                _assign(self.arg_dict[name], array)
            elif not allow_extra_params:
                raise ValueError(f"Find name \"{name}\" that is not in the arguments")
        for name, array in (aux_params or {}).items():
            if name in self.aux_dict:
                _assign(self.aux_dict[name], array)
            elif not allow_extra_params:
                raise ValueError(f"Find name \"{name}\" that is not in the auxiliary states")

    def set_monitor_callback(self, callback: Any, monitor_all: bool = False) -> None:
        warnings.warn("mxmirror: the segmented executor does not support monitor callbacks; "
                      "ignored", stacklevel=2)

    def reshape(self, partial_shaping: bool = False, allow_up_sizing: bool = False,
                **kwargs: Any):
        raise PlanError("the segmented executor cannot reshape: bind again with the new "
                        "shapes (mxmirror.simple_bind plans them afresh)")

    def debug_str(self) -> str:
        import re

        parts, total = [], 0
        for ex in self._execs.values():
            text = ex.debug_str()
            m = re.search(r"Total (\d+) MB allocated", text)
            total += int(m.group(1)) if m else 0
            parts.append(text)
        head = (f"mxmirror segmented executor: {self.sg.m} segments, {len(self._execs)} "
                f"executors sharing one pool\nTotal {total} MB allocated (sum over the "
                f"executors)\n")
        return head + "\n".join(parts)

    @property
    def executors(self) -> dict:
        """The template executors (key -> MXNet executor), largest first."""
        return dict(self._execs)

    # -------------------------------------------------------------- running
    def _draw_masks(self, is_train: bool) -> None:
        mx = self._mx
        self._masks = {}
        graph = self.sg.graph
        for d in self.sg.dropouts:
            nd = graph.nodes[d]
            src, k = nd.inputs[0]
            shape = tuple(graph.nodes[src].shapes[k])
            dtype = graph.nodes[src].dtypes[k]
            ones = self._ones.get((shape, dtype))
            if ones is None:
                ones = self._ones[(shape, dtype)] = mx.nd.ones(shape, self.ctx, dtype=dtype)
            mode = nd.attrs.get("mode", "training")
            p = float(nd.attrs.get("p", "0.5"))
            if (not is_train and mode != "always") or p == 0.0:
                self._masks[d] = ones
                continue
            kw = {"p": p, "mode": "always"}
            if nd.attrs.get("axes") not in (None, "()", "[]"):
                kw["axes"] = nd.attrs["axes"]
            self._masks[d] = mx.nd.Dropout(ones, **kw)

    def _load(self, ex: Any, seg: Segment, state: dict) -> None:
        for name, key in seg.slots:
            kind = key[0]
            if kind == "state":
                state[key[1]].copyto(ex.arg_dict[name])
            elif kind == "arg":
                self.arg_dict[key[1]].copyto(ex.arg_dict[name])
            elif kind == "aux":
                self.aux_dict[key[1]].copyto(ex.aux_dict[name])
            elif kind == "mask":
                self._masks[key[1]].copyto(ex.arg_dict[name])

    def _run_forward(self, i: int, state: dict, first: bool, is_train: bool) -> dict:
        seg = self.sg.segments[i - 1]
        ex = self._execs[seg.key]
        self._load(ex, seg, state)
        ex.forward(is_train=is_train)
        self.forward_flops_run += seg.flops
        new = {e: v for e, v in state.items() if e in self.sg.crossing[i]}
        for j, e in enumerate(seg.outputs):
            new[e] = ex.outputs[j].copy()
        if first:
            base = len(seg.outputs)
            for j, h in enumerate(seg.heads):
                ex.outputs[base + j].copyto(self.outputs[h])
        self._note(state, new)
        self._live = i if is_train else None
        return new

    def fwd(self, i: int, state: dict, first: bool) -> dict:
        return self._run_forward(i, state, first, True)

    def hold(self, state: dict) -> None:
        self._held[id(state)] = state

    def release(self, state: dict) -> None:
        self._held.pop(id(state), None)

    def fb(self, i: int, state: dict) -> None:
        seg = self.sg.segments[i - 1]
        ex = self._execs[seg.key]
        if self._live != i:
            self._load(ex, seg, state)
            ex.forward(is_train=True)
            self.forward_flops_run += seg.flops
        self._live = None
        for name, key in seg.slots:
            if key[0] in ("ograd", "hgrad"):
                g = self._grads.get(key[1]) if key[0] == "ograd" else self._head_grads[key[1]]
                if g is None:
                    ex.arg_dict[name][:] = 0
                else:
                    g.copyto(ex.arg_dict[name])
        ex.backward()
        if any(key[0] == "aux" for _, key in seg.slots):
            # MXNet 1.9.1's BatchNorm backward updates the running statistics without
            # declaring them to the engine: wait, or the copy below races with the update
            self._mx.nd.waitall()
        for name, key in seg.slots:
            kind = key[0]
            if kind == "state":
                g = ex.grad_dict[name]
                if key[1] in self._grads:
                    self._grads[key[1]] += g
                else:
                    self._grads[key[1]] = g.copy()
            elif kind == "arg" and self._req[key[1]] != "null":
                self.grad_dict[key[1]] += ex.grad_dict[name]
            elif kind == "aux":
                ex.aux_dict[name].copyto(self.aux_dict[key[1]])
        self._note(state)
        for e in seg.outputs:
            self._grads.pop(e, None)

    def _note(self, *extra: dict) -> None:
        """Measured bytes of the kept values and boundary gradients (real NDArrays)."""
        alive: dict = {}
        for d in list(self._held.values()) + list(extra):
            for v in d.values():
                alive[id(v)] = v
        total = sum(_nbytes(v) for v in alive.values())
        total += sum(_nbytes(v) for v in self._grads.values())
        self.peak_kept_bytes = max(self.peak_kept_bytes, total)


def _size(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _nbytes(a: Any) -> int:
    import numpy as np

    return a.size * np.dtype(a.dtype).itemsize


def _assign(dst: Any, value: Any) -> None:
    import mxnet as mx

    if isinstance(value, mx.nd.NDArray):
        value.copyto(dst)
    else:
        dst[:] = value


class SegmentedBinding:
    """A segmented plan waiting for its bind (what bind.py routes to SegmentedExecutor)."""

    def __init__(self, plan: Any) -> None:
        self.plan = plan

    def bind(self, symbol: Any, ctx: Any, args: Any = None, args_grad: Any = None,
             aux_states: Any = None, shared_exec: Any = None, shared_arg_names: Any = None,
             shared_buffer: Any = None, **_ignored: Any) -> SegmentedExecutor:
        names = symbol.list_arguments()
        aux_names = symbol.list_auxiliary_states()

        def as_dict(values, keys):
            if values is None or isinstance(values, dict):
                return values
            return dict(zip(keys, values))

        if shared_exec is not None and not isinstance(shared_exec, SegmentedExecutor):
            shared_exec = shared_exec if hasattr(shared_exec, "arg_dict") else None
        return SegmentedExecutor(symbol, ctx, self.plan.segmented, args=as_dict(args, names),
                                 args_grad=as_dict(args_grad, names),
                                 aux_states=as_dict(aux_states, aux_names),
                                 shared_exec=shared_exec, shared_arg_names=shared_arg_names,
                                 shared_buffer=shared_buffer)
