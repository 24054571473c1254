"""The forward graph analysed once: the facts every policy, the segment model and viz read.

An ``Analysis`` is made once per prepared graph (symbol, shapes, dtypes, grad_req).
Each fact is computed on first use and kept: positions on the chain of op nodes,
last uses, the values crossing every position, candidate cuts (sorted once),
nodes that must never be recomputed, and the simulated score of any mirror set
(memoized, so the baseline and every plan a search revisits are simulated once).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from mxmirror.ir import ops
from mxmirror.ir.graph import Entry, Graph, Node
from mxmirror.sim import gradient_pass, memory_plan, training_graph
from mxmirror.sim.compiled import CompiledTraining, Unsupported
from mxmirror.sim.resolved import Resolved


@dataclass(frozen=True)
class Cut:
    """A place where the forward graph can be split: the values crossing it are kept."""

    pos: int  # position in the op-node order
    keep: frozenset[int]  # node ids whose outputs cross the cut
    bytes: int  # MXNet-counted bytes of those outputs
    pinned: int = 0  # bytes keeping them holds until backward (see Analysis.pinned_bytes)


@dataclass(frozen=True)
class Score:
    """What MXNet's planner would allocate for a mirror set, and the forward work it adds."""

    planned_bytes: int
    recompute_ratio: float  # extra forward FLOPs / forward FLOPs
    recomputed_ids: frozenset[int] = frozenset()  # the mirror set scored, unread copies dropped


class Analysis:
    """Facts about one forward graph, each computed once on first use."""

    def __init__(self, graph: Graph, gpu: bool = False) -> None:
        self.graph = graph
        self.gpu = gpu  # planned for a GPU: ops that must write there (ops.must_write)
        self._scores: dict[frozenset[int], Score] = {}
        self._at_least: dict[frozenset[int], int] = {}  # planned bytes known to be >= this
        self.on_score: Callable[[], object] | None = None  # called per simulation (progress)

    @property
    def order(self) -> list[Node]:
        """Op nodes in MXNet's forward order: the chain every policy cuts."""
        return self.graph.op_order

    @cached_property
    def pos(self) -> dict[int, int]:
        """Node id -> position in ``order``."""
        return {n.id: i for i, n in enumerate(self.order)}

    @cached_property
    def node_bytes(self) -> list[int]:
        """MXNet-counted bytes (4 per element, every output) of the node at each position."""
        return [node_bytes(n) for n in self.order]

    @cached_property
    def prefix_bytes(self) -> list[int]:
        """prefix_bytes[i]: bytes of the nodes before position i."""
        out = [0]
        for b in self.node_bytes:
            out.append(out[-1] + b)
        return out

    @cached_property
    def last_use(self) -> dict[int, int]:
        """Op node id -> last position where any of its outputs is read (itself if none)."""
        last = {n.id: i for i, n in enumerate(self.order)}
        for (src, _), end in self.graph.last_reads.items():
            last[src] = max(last[src], end)
        return last

    @cached_property
    def crossing(self) -> list[tuple[frozenset[int], int]]:
        """Per position: the nodes whose outputs cross it (produced at or before, read after;
        graph heads excluded) and their MXNet-counted bytes."""
        heads = {h[0] for h in self.graph.heads}
        last = self.last_use
        out: list[tuple[frozenset[int], int]] = []
        live: dict[int, int] = {}  # id -> last position read
        held: dict[int, int] = {}  # id -> bytes, of the live ones
        live_bytes = 0  # their sum, kept as they come and go
        for i, (n, b) in enumerate(zip(self.order, self.node_bytes)):
            if last[n.id] > i and n.id not in heads:
                live[n.id], held[n.id] = last[n.id], b
                live_bytes += b
            for k in [k for k, end in live.items() if end <= i]:
                del live[k]
                live_bytes -= held.pop(k)
            if n.id in heads or n.id in live:
                out.append((frozenset(live), live_bytes))
            else:
                out.append((frozenset(live) | {n.id}, live_bytes + b))
        return out

    @cached_property
    def cuts(self) -> list[Cut]:
        """Candidate cuts, by position: where the fewest bytes cross the forward graph.

        Where a single value crosses, the graph splits there (an articulation point: a
        residual unit's output). Graphs with no such point (an unrolled LSTM carries c and
        h) split where the crossing bytes are a local minimum, so every candidate is a
        local minimum of the crossing bytes. ``mirror_stage`` tags add their groups as
        cuts (memonger's convention: one stage value, one cut).
        """
        crossing = self.crossing
        w = 4
        found = []
        for i, (keep, b) in enumerate(crossing[:-1]):
            lo, hi = max(0, i - w), min(len(crossing), i + w + 1)
            if keep and b <= min(c[1] for c in crossing[lo:hi]):
                if found and found[-1][1] == keep:
                    continue
                found.append((i, keep, b))
        found += self._tagged_cuts()
        cuts = [Cut(i, keep, b, self.pinned_bytes(keep)) for i, keep, b in found]
        cuts.sort(key=lambda c: c.pos)
        return cuts

    def _tagged_cuts(self) -> list[tuple[int, frozenset[int], int]]:
        """User-tagged cuts (mirror_stage attributes, memonger semantics)."""
        groups: dict[str, list[int]] = {}
        for n in self.order:
            tag = n.attrs.get("__mirror_stage__", n.attrs.get("mirror_stage"))
            if tag is None:
                continue
            key = f"#{n.id}" if tag.lower() == "true" else tag
            groups.setdefault(key, []).append(n.id)
        return [(max(self.pos[i] for i in ids), frozenset(ids),
                 sum(node_bytes(self.graph.nodes[i]) for i in ids)) for ids in groups.values()]

    def pinned_bytes(self, keep: frozenset[int]) -> int:
        """What keeping `keep` holds until backward: the kept outputs, plus the input entries
        their backward reads. A kept node's backward runs on the original node, so it reads
        the original inputs, which then stay alive even where they are mirrored (an LSTM's
        kept h = o * tanh(c) pins o and tanh(c))."""
        return sum(map(self.entry_bytes, self.held_entries(keep)))

    def entry_bytes(self, entry: Entry) -> int:
        """An entry's bytes as MXNet's planner counts them (4 per element)."""
        return self.graph.nodes[entry[0]].element_counts[entry[1]] * memory_plan.ELEMENT_BYTES

    def held_entries(self, keep: frozenset[int]) -> set[Entry]:
        """The entries keeping `keep` holds until backward (see pinned_bytes)."""
        graph = self.graph
        held = {(k, i) for k in keep for i in range(len(graph.nodes[k].shapes))}
        for k in keep:
            n = graph.nodes[k]
            for j in backward_reads(n):
                if j < len(n.inputs) and not graph.nodes[n.inputs[j][0]].is_variable:
                    held.add(n.inputs[j])
        return held

    @cached_property
    def blockers(self) -> dict[int, str]:
        """Nodes that must never be recomputed, with the reason."""
        out = {}
        for n in self.order:
            if ops.is_random(n.op, n.attrs):
                out[n.id] = "random op: recomputing would draw fresh randomness"
            elif not n.inputs:
                out[n.id] = ("source op (no inputs): nothing to recompute, and MXNet may "
                             "infer its shape only from its consumers")
            elif n.op in ops.STATEFUL:
                out[n.id] = "stateful or control-flow op: treated as opaque"
        return out

    @cached_property
    def recomputable(self) -> frozenset[int]:
        """Op nodes that are not blockers: what a mirror set may hold."""
        return frozenset(n.id for n in self.order if n.id not in self.blockers)

    @cached_property
    def cheap_recomputable(self) -> frozenset[int]:
        """The recomputable nodes whose op is cheap to recompute."""
        return frozenset(n.id for n in self.order
                         if n.id in self.recomputable and ops.is_cheap(n.op))

    @cached_property
    def skipped(self) -> dict[str, str]:
        """Names of the nodes never recomputed, with the reason (what a Plan reports)."""
        return {self.graph.nodes[i].name: why for i, why in self.blockers.items()}

    @cached_property
    def losses(self) -> frozenset[int]:
        return frozenset(n.id for n in self.order if n.op in ops.LOSSES)

    @cached_property
    def compiled(self) -> CompiledTraining | None:
        """Every mirror set's training graph, built once (None: a graph it does not model;
        scores then build each training graph)."""
        try:
            return CompiledTraining(self.graph)
        except Unsupported:
            return None

    @cached_property
    def resolved(self) -> Resolved | None:
        """The compiled training graph resolved per mirror set by the compiled planner (what
        scores read; None where there is no compiled graph)."""
        return None if self.compiled is None else Resolved(self.compiled)

    @property
    def baseline(self) -> Score:
        """No recomputation: MXNet's default in-place + sharing."""
        return self.score(frozenset())

    def score(self, mirror: set[int] | frozenset[int]) -> Score:
        """Simulate MXNet's planner for a mirror set (memoized); no bind.

        Unread copies of ops that must write are dropped first (see drop_unread).
        """
        found = self.score_below(mirror, None)
        assert found is not None
        return found

    def score_below(self, mirror: set[int] | frozenset[int], bound: int | None) -> Score | None:
        """``score(mirror)`` if its planned bytes are below `bound`, else None: the simulation
        stops once its blocks reach `bound` (most moves a search tries are rejected)."""
        key = frozenset(mirror)
        found = self._scores.get(key)
        if found is not None:
            return found if bound is None or found.planned_bytes < bound else None
        if bound is not None and bound <= self._at_least.get(key, -1):
            return None
        if self.on_score is not None:
            self.on_score()
        kept = self.drop_unread(key)
        sim, extra = self._simulate(kept, bound)
        if sim is None:
            self._at_least[key] = bound
            return None
        planned = sim.total_bytes
        found = self._scores[key] = Score(planned, extra / (self.forward_flops or 1.0),
                                          frozenset(kept))
        return found if bound is None or planned < bound else None

    def blocks(self, mirror: frozenset[int]) -> tuple[int, ...]:
        """The storage blocks MXNet's executor allocates for a mirror set (its pool: what a
        bind sharing another executor's memory matches against it, sim/shared_pool)."""
        sim, _ = self._simulate(self.drop_unread(frozenset(mirror)), None)
        return tuple(sim.block_bytes)

    def _simulate(self, kept: set[int], stop_at: int | None
                  ) -> tuple[memory_plan.SimResult | None, float]:
        """MXNet's planner over the training graph of a mirror set (copies that would crash
        dropped), on the compiled graph where there is one, and the FLOPs its copies add;
        None where the compiled simulation reaches `stop_at` bytes."""
        if self.resolved is not None:
            fg, copies = self.resolved.flat(kept)
            return (memory_plan.simulate_flat(fg, stop_at=stop_at),
                    sum(self.graph.nodes[g].flops for g in copies))
        with memory_plan.gc_paused():
            tg = training_graph.build(self.graph, kept)
            sim = memory_plan.simulate(tg)
        return sim, sum(self.graph.nodes[t.fwd].flops for t in tg.nodes if t.role == "mirror")

    def drop_unread(self, mirror: frozenset[int]) -> set[int]:
        """The mirror set without the copies that would compute wrong values or fail: the
        copies of ops that must write (``ops.must_write``) whose first output nothing reads.

        A mirrored node whose copy nothing reads is still built by MXNet (its backward has a
        control dependency on it), and each output of the copy that nothing reads is asked
        to write nothing (kNullOp). Most ops accept that, and such a copy still pays off: the
        node's backward then reads its inputs' copies instead of keeping the originals. Ops
        that must write compute nothing (LayerNorm, GroupNorm: their backward reads the
        copy's other outputs) or fail a check (hard_sigmoid; Convolution off MKL-DNN) where
        the copy's first output is unread, so those are not mirrored unless it is read. One
        pass in reverse topological order: a copy's first output is read when the node's own
        backward reads it or the copy of a consumer of that output is in the graph (a copy
        reads all its inputs' copies); a copy is in the graph when its own backward reads
        any of its outputs, a backward node depends on it, or a consumer's copy is in the
        graph. A node MXNet makes no copy of (``gradient_pass.has_mirror_copy``: Dropout) is
        dropped.
        """
        kept = set(mirror)
        present: set[int] = set()
        for v, reads_out, reads_first, controls, must_write, consumers, first_readers \
                in self._copy_facts:
            if v not in kept:
                continue
            if must_write is None or (must_write and not reads_first
                                      and present.isdisjoint(first_readers)):
                kept.discard(v)
            elif reads_out or controls or not present.isdisjoint(consumers):
                present.add(v)
        return kept

    @cached_property
    def _copy_facts(self) -> list[tuple[int, bool, bool, bool, bool | None, tuple[int, ...],
                                        tuple[int, ...]]]:
        """Per op node, in reverse order (drop_unread's static facts): its id, whether its
        backward reads any of its outputs, whether it reads its first output, whether it has
        a control dependency on it, whether it must write (None: MXNet makes no copy of it),
        its consumers, and the consumers of its first output."""
        out = []
        consumers = self.graph.consumers
        first_readers: dict[int, list[int]] = {}
        for n in self.graph.nodes:
            for src, index in n.inputs:
                if index == 0 and n.id not in first_readers.setdefault(src, []):
                    first_readers[src].append(n.id)
        for v in reversed(self.order):
            tpl = v.template
            reads = {r for tn in (tpl.nodes if tpl is not None else []) for r in tn.inputs}
            controls = tpl is not None and any(tn.control_fwd for tn in tpl.nodes)
            out.append((v.id, any(r[0] == "out" for r in reads), ("out", 0) in reads, controls,
                        ops.must_write(v.op, v.attrs, self.gpu)
                        if gradient_pass.has_mirror_copy(v)
                        else None,
                        tuple(consumers.get(v.id, ())), tuple(first_readers.get(v.id, ()))))
        return out

    @cached_property
    def forward_flops(self) -> float:
        return self.graph.forward_flops

    def checkpoint_names(self, chosen: list[Cut]) -> list[str]:
        """Names of the nodes the chosen cuts keep, in cut order (a Plan's checkpoints)."""
        return [self.graph.nodes[i].name for c in chosen for i in sorted(c.keep)]


def node_bytes(n: Node) -> int:
    """Bytes as MXNet's planner counts them (4 per element, every output)."""
    return sum(n.element_counts) * memory_plan.ELEMENT_BYTES


def backward_reads(node: Node) -> set[int]:
    """Input positions the node's backward reads (from its learned template)."""
    tpl = node.template
    if tpl is None:
        return set(range(len(node.inputs)))
    return {r[1] for tn in tpl.nodes for r in tn.inputs if r[0] == "in"}
