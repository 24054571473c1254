"""What every policy shares: candidate cuts, what may be recomputed, scoring."""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass

from .. import memory, ops, training_graph
from ..graph import Graph, Node


@dataclass
class Cut:
    """A place where the forward graph can be split: the values crossing it are kept."""

    pos: int  # position in the op-node order
    keep: frozenset[int]  # node ids whose outputs cross the cut
    bytes: int  # MXNet-counted bytes of those outputs
    held: int = 0  # bytes keeping them holds until backward (see kept_bytes)


def op_order(graph: Graph) -> list[Node]:
    return graph.op_order


def mirror_blockers(graph: Graph) -> dict[int, str]:
    """Nodes that must never be recomputed, with the reason."""
    out = {}
    for n in graph.op_nodes:
        if ops.is_random(n.op):
            out[n.id] = "random op: recomputing would draw fresh randomness"
        elif not n.inputs:
            out[n.id] = "source op (no inputs): nothing to recompute, and MXNet may infer its " \
                        "shape only from its consumers"
        elif n.op in ops.STATEFUL:
            out[n.id] = "stateful or control-flow op: treated as opaque"
    return out


def node_bytes(n: Node) -> int:
    """Bytes as MXNet's planner counts them (4 per element, every output)."""
    return sum(n.element_counts) * memory.ELEMENT_BYTES


def find_cuts(graph: Graph) -> list[Cut]:
    """Candidate cuts: where the fewest bytes cross the forward graph.

    Walk the op nodes in topological order; the values crossing position i are
    those produced at or before i and read after i. Where a single value
    crosses, the graph splits there (an articulation point: a residual unit's
    output). Graphs with no such point (an unrolled LSTM carries c and h)
    split where the crossing bytes are a local minimum, so every candidate is
    a local minimum of the crossing bytes. ``mirror_stage`` tags add their
    groups as cuts (memonger's convention: one stage value, one cut).
    """
    order = op_order(graph)
    pos = {n.id: i for i, n in enumerate(order)}
    heads = {h[0] for h in graph.heads}
    last = {}
    for n in order:
        last[n.id] = pos[n.id]
    for n in order:
        for src, _ in n.inputs:
            if src in pos:
                last[src] = max(last[src], pos[n.id])
    crossing: list[tuple[frozenset[int], int]] = []
    live: dict[int, int] = {}
    for i, n in enumerate(order):
        if last[n.id] > i and n.id not in heads:
            live[n.id] = last[n.id]
        for k in [k for k, end in live.items() if end <= i]:
            del live[k]
        keep = frozenset(live) | ({n.id} if n.id not in heads else frozenset())
        crossing.append((keep, sum(node_bytes(graph.nodes[k]) for k in keep)))
    w = 4
    cuts = []
    for i, (keep, b) in enumerate(crossing[:-1]):
        lo, hi = max(0, i - w), min(len(crossing), i + w + 1)
        if keep and b <= min(c[1] for c in crossing[lo:hi]):
            if cuts and cuts[-1].keep == keep:
                continue
            cuts.append(Cut(i, keep, b))
    cuts += tagged_cuts(graph, order, pos)
    for c in cuts:
        c.held = kept_bytes(graph, c.keep)
    cuts.sort(key=lambda c: c.pos)
    return cuts


def backward_reads(node: Node) -> set[int]:
    """Input positions the node's backward reads (from its learned template)."""
    tpl = node.template
    if tpl is None:
        return set(range(len(node.inputs)))
    return {r[1] for tn in tpl.nodes for r in tn.inputs if r[0] == "in"}


def kept_bytes(graph: Graph, keep: frozenset[int]) -> int:
    """What keeping `keep` holds until backward: the kept outputs, plus the input entries
    their backward reads. A kept node's backward runs on the original node, so it reads the
    original inputs, which then stay alive even where they are mirrored (an LSTM's kept
    h = o * tanh(c) pins o and tanh(c))."""
    held = {(k, i) for k in keep for i in range(len(graph.nodes[k].shapes))}
    for k in keep:
        n = graph.nodes[k]
        for j in backward_reads(n):
            if j < len(n.inputs) and not graph.nodes[n.inputs[j][0]].is_variable:
                held.add(n.inputs[j])
    return sum(graph.nodes[k].element_counts[i] for k, i in held) \
        * memory.ELEMENT_BYTES


def checkpoint_names(graph: Graph, chosen: list[Cut]) -> list[str]:
    """Names of the nodes the chosen cuts keep, in cut order (a Plan's checkpoints)."""
    return [graph.nodes[i].name for c in chosen for i in sorted(c.keep)]


def tagged_cuts(graph: Graph, order: list[Node], pos: dict[int, int]) -> list[Cut]:
    """User-tagged cuts (mirror_stage attributes, memonger semantics)."""
    groups: dict[str, list[int]] = {}
    for n in order:
        tag = n.attrs.get("__mirror_stage__", n.attrs.get("mirror_stage"))
        if tag is None:
            continue
        key = f"#{n.id}" if tag.lower() == "true" else tag
        groups.setdefault(key, []).append(n.id)
    cuts = []
    for ids in groups.values():
        p = max(pos[i] for i in ids)
        cuts.append(Cut(p, frozenset(ids), sum(node_bytes(graph.nodes[i]) for i in ids)))
    return cuts


@dataclass
class Score:
    planned_bytes: int
    recompute_ratio: float
    mirror: frozenset[int] = frozenset()  # the mirror set scored, unread mirrors dropped


def score(graph: Graph, mirror: set[int]) -> Score:
    """Simulate MXNet's planner for a mirror set; no bind.

    Unread copies of ops that must write are dropped first (see drop_unread).
    """
    with _gc_paused():
        mirror = drop_unread(graph, mirror)
        tg = training_graph.build(graph, mirror)
        planned = memory.simulate(tg).total_bytes
    total = graph.forward_flops or 1.0
    extra = sum(graph.nodes[t.fwd].flops for t in tg.nodes if t.role == "mirror")
    return Score(planned, extra / total, frozenset(mirror))


@contextlib.contextmanager
def _gc_paused():
    """The training graph is a DAG freed by reference counts; the cyclic collector only
    rescans the ~10^5 objects of a big graph over and over (3x slower builds)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def drop_unread(graph: Graph, mirror: set[int]) -> set[int]:
    """The mirror set without copies that would crash: unread copies of ops that must write.

    A mirrored node whose copy nothing reads is still built by MXNet (its backward has a
    control dependency on it) and asked to write nothing (kNullOp). Most ops accept that,
    and such a copy still pays off: the node's backward then reads its inputs' copies
    instead of keeping the originals. Ops that check ``req == kWriteTo`` (Embedding, and
    Convolution, FullyConnected and BatchNorm outside MKLDNN, e.g. on GPU) would fail at
    run time, so those are not mirrored unless their copy is read. One pass in reverse
    topological order: a copy is read when the node's own backward reads its outputs or a
    consumer's copy is in the graph (a copy reads all its inputs' copies); a copy is in the
    graph when it is read or a backward node depends on it. MXNet never copies Dropout.
    """
    kept = set(mirror)
    present: set[int] = set()
    consumers = graph.consumers
    for v in reversed(op_order(graph)):
        if v.id not in kept:
            continue
        tpl = v.template
        nodes = tpl.nodes if tpl is not None else []
        read = (any(r[0] == "out" for tn in nodes for r in tn.inputs)
                or any(c in present for c in consumers.get(v.id, ())))
        if v.op == "Dropout" or (not read and v.op in ops.MUST_WRITE):
            kept.discard(v.id)
        elif read or any(tn.control_fwd for tn in nodes):
            present.add(v.id)
    return kept


def segment_mirror(graph: Graph, order: list[Node], cuts: list[Cut],
                   blockers: dict[int, str], only_cheap: bool = False,
                   mirror_losses: bool = True) -> set[int]:
    """Mirror everything except the values crossing the chosen cuts (and blockers).

    Recomputing a (deterministic) loss lets its backward read recomputed logits
    instead of keeping them: large for the per-step losses of an unrolled LSTM,
    a loss for a single small head. Callers choose by simulation.
    """
    keep: set[int] = set() if mirror_losses else {n.id for n in order if n.op in ops.LOSSES}
    for c in cuts:
        keep |= c.keep
    mirror = set()
    for n in order:
        if n.id in keep or n.id in blockers:
            continue
        if only_cheap and not ops.is_cheap(n.op):
            continue
        mirror.add(n.id)
    return mirror


def greedy_cuts(order: list[Node], cuts: list[Cut], budget: float) -> list[Cut]:
    """Paper Algorithm 3: keep a cut once the dropped bytes since the last one pass budget."""
    by_pos = {c.pos: c for c in cuts}
    chosen = []
    acc = 0
    for i, n in enumerate(order):
        acc += node_bytes(n)
        c = by_pos.get(i)
        if c is not None and acc > budget:
            chosen.append(c)
            acc = 0
    return chosen


