"""MXNet 1.9.1's static memory planner, simulated (src/nnvm/plan_memory.cc).

Reference counts per entry, in-place reuse where the op declares it, and a free
list matched by size within a factor (NNVM_EXEC_MATCH_RANGE, 16). Like MXNet,
every element counts 4 bytes whatever its dtype, and arguments, argument
gradients and workspace are not counted: the result is the figure MXNet prints
as ``Total X MB allocated``.

Strategies: ``none`` (every entry its own buffer), ``inplace`` (in-place only),
``sharing`` (in-place + sharing, MXNet's default).
"""

from __future__ import annotations

import bisect
import contextlib
import gc
from dataclasses import dataclass, field

from mxmirror.ir import ops
from mxmirror.sim.training_graph import TrainingGraph

STRATEGIES = ("none", "inplace", "sharing")
BAD, EXTERNAL = -1, -2
ELEMENT_BYTES = 4  # plan_memory.cc: "assume 4 bytes for now"


@dataclass
class SimResult:
    """What the simulated planner allocated."""

    total_bytes: int
    storage: list[int]  # storage id per entry (negative: not allocated here)
    block_bytes: list[int]  # final size of each storage block
    timeline: list[int] = field(default_factory=list)  # live planned bytes after each node

    @property
    def mb(self) -> float:
        return self.total_bytes / 2**20


SEQ_BITS = 40  # free-list keys: block bytes above, release sequence number below
SEQ_MASK = (1 << SEQ_BITS) - 1


@dataclass
class FlatGraph:
    """A training graph as the planner sees it: integer entries, nodes in execution order.

    Nodes are numbered freely (``order`` lists the ones that run); node i's outputs are the
    entries ``base[i] .. base[i] + len(sizes[i]) - 1``, and it reads the entries
    ``ins[in_start[i]:in_start[i + 1]]``. ``training_graph.build`` graphs and
    ``compiled.CompiledTraining`` both come here; the latter also gives ``ref``, the
    reference count of every entry (the readers that run, and graph outputs), which it
    derives faster than counting every read.
    """

    order: list[int]
    facts: list[ops.MemoryFacts | None]  # per node (None: a variable)
    sizes: list[list[int]]  # elements per output, per node
    ins: list[int]  # input entries of every node, node after node
    in_start: list[int]  # per node (and one past the last): where its inputs start
    base: list[int]  # first output entry, per node
    esize: list[int]  # elements per entry
    outputs: list[int]  # graph output entries: forward heads, then argument gradients
    num_forward_outputs: int
    out_order: list[tuple[int, ...]]  # per node: outputs in allocation order
    ref: list[int] | None = None  # reference counts, when known
    steps: list | None = None  # node_steps(self), when known


def allocation_order(sizes: list[int]) -> tuple[int, ...]:
    """Outputs are allocated largest first (equal sizes: last output first)."""
    if len(sizes) == 1:
        return (0,)
    return tuple(sorted(range(len(sizes)), key=lambda k: (sizes[k], k), reverse=True))


def flatten(tg: TrainingGraph) -> FlatGraph:
    """The FlatGraph of a built training graph (its nodes are already in MXNet's order)."""
    nodes = tg.nodes
    esize = [0] * tg.num_entries
    ins: list[int] = []
    in_start = [0]
    for n in nodes:
        esize[n.eid:n.eid + len(n.sizes)] = n.sizes
        ins += [src.eid + k for src, k in n.inputs]
        in_start.append(len(ins))
    return FlatGraph(
        list(range(len(nodes))),
        [None if n.op is None else ops.memory_facts(n.op, len(n.inputs)) for n in nodes],
        [n.sizes for n in nodes], ins, in_start, [n.eid for n in nodes], esize,
        [tg.entry(e) for e in tg.outputs], tg.num_forward_outputs,
        [allocation_order(n.sizes) for n in nodes])


def simulate(tg: TrainingGraph, strategy: str = "sharing", match_range: int = 16,
             timeline: bool = False) -> SimResult:
    """Run the planner over the training graph and return MXNet's figure."""
    return simulate_flat(flatten(tg), strategy, match_range, timeline)


Step = tuple  # (in-place pairs, ignores all inputs, allocations, inputs released, outputs)


@contextlib.contextmanager
def gc_paused():
    """Big graphs are DAGs freed by reference counts; building ~10^5 small objects (a training
    graph, node_steps' tuples) makes the cyclic collector rescan the heap over and over."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def node_steps(fg: FlatGraph, nodes: list[int] | None = None) -> list[Step | None]:
    """What simulate_flat needs per node that no mirror set changes, decoded once: in-place
    pairs as (input slot, output entry, output elements, identity), the outputs to allocate
    as (entry, bytes) in allocation order, the input slots whose reads are counted, and the
    output entries. Reads of variables are left out: nothing here allocates them. Only
    `nodes` are decoded (default: all). A CompiledTraining keeps these for every FlatGraph
    it resolves (its slots that may read another entry per mirror set never read a
    variable)."""
    facts, all_sizes, in_start, base_of, out_order, ins = (
        fg.facts, fg.sizes, fg.in_start, fg.base, fg.out_order, fg.ins)
    planned = [True] * len(fg.esize)
    for i, f in enumerate(facts):
        if f is None:
            n = len(all_sizes[i])
            planned[base_of[i]:base_of[i] + n] = [False] * n
    steps: list[Step | None] = [None] * len(facts)
    with gc_paused():
        for i in range(len(facts)) if nodes is None else nodes:
            f = facts[i]
            if f is None:
                continue
            sizes, base, lo, hi = all_sizes[i], base_of[i], in_start[i], in_start[i + 1]
            n_out = len(sizes)
            if n_out == 1:
                allocs: tuple = ((base, sizes[0] * ELEMENT_BYTES),)
            else:
                allocs = tuple([(base + k, sizes[k] * ELEMENT_BYTES) for k in out_order[i]])
            ignore = f.ignore_inputs
            released = tuple([x for x in range(lo, hi)
                              if planned[ins[x]] and not (ignore and x - lo in ignore)])
            pairs: tuple = ()
            if f.inplace:
                pairs = tuple([(lo + i_in, base + i_out, sizes[i_out], identity)
                               for (i_in, i_out), identity in zip(f.inplace, f.identity)
                               if lo + i_in < hi and i_out < n_out and planned[ins[lo + i_in]]])
            steps[i] = (pairs, len(ignore) == hi - lo > 0, allocs, released,
                        range(base, base + n_out))
    return steps


def simulate_flat(fg: FlatGraph, strategy: str = "sharing", match_range: int = 16,
                  timeline: bool = False, stop_at: int | None = None) -> SimResult | None:
    """MXPlanMemory over a FlatGraph (storage ids are indexed by its entries); None as soon
    as the blocks allocated reach `stop_at` bytes (a search only needs to know "not less").

    MXGraphAllocator inline (this loop scores every plan a search tries): a free list of
    int keys ``bytes << SEQ_BITS | release seq``, sorted, searched within a factor of the
    requested size: the smallest block at least as large, else the largest smaller one
    (grown), else a new block.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {STRATEGIES}")
    inplace = strategy != "none"
    mr = match_range if strategy == "sharing" else 0
    free: list[int] = []
    sid_at = [0]  # release seq -> storage id
    blocks: list[int] = []
    bisect_left, insort = bisect.bisect_left, bisect.insort
    n_entries = len(fg.esize)
    ins, esize = fg.ins, fg.esize
    steps = fg.steps if fg.steps is not None else node_steps(fg, fg.order)
    ref = fg.ref
    if ref is None:
        ref = [0] * n_entries
        for i in fg.order:
            st = steps[i]
            if st is not None:
                for x in st[3]:
                    ref[ins[x]] += 1
        for e in fg.outputs:
            ref[e] += 1
    storage = [BAD] * n_entries
    for e in fg.outputs[fg.num_forward_outputs:]:
        storage[e] = EXTERNAL
    sref = [0] * (n_entries + 1)  # one block per entry at most
    live_line: list[int] = []
    block_live: dict[int, int] = {}
    live = total = seq = 0
    stop = stop_at if stop_at is not None else -1
    for i in fg.order:
        st = steps[i]
        if st is None:
            if timeline:
                live_line.append(0)  # variables: nothing planned here
            continue
        pairs, ignore_all, allocs, released, outs = st
        unread = False
        if pairs and inplace:
            taken = []
            for x, eo, out_size, identity in pairs:
                ei = ins[x]
                sid_in = storage[ei]
                same = out_size == esize[ei]
                if (sid_in >= 0 and same and storage[eo] == BAD and ref[eo] > 0
                        and ((sref[sid_in] == 1 and not ignore_all) or identity)
                        and x not in taken):
                    taken.append(x)
                    storage[eo] = sid_in
                    sref[sid_in] += ref[eo]
        for eo, size in allocs:  # allocate the rest
            if storage[eo] != BAD:
                continue
            sid = -1
            if mr:
                mid = bisect_left(free, size << SEQ_BITS)
                if mid < len(free) and free[mid] >> SEQ_BITS <= size * mr:
                    sid = sid_at[free.pop(mid) & SEQ_MASK]
                elif mid and free[mid - 1] >> SEQ_BITS >= size // mr:
                    sid = sid_at[free.pop(mid - 1) & SEQ_MASK]
            if sid < 0:
                sid = len(blocks)
                blocks.append(size)
                total += size
                if total >= stop >= 0:
                    return None
            elif size > blocks[sid]:
                total += size - blocks[sid]
                blocks[sid] = size
                if total >= stop >= 0:
                    return None
            storage[eo] = sid
            sref[sid] = ref[eo]
            if not sref[sid]:
                unread = True
            if timeline:
                block_live[sid] = blocks[sid]
                live += blocks[sid]
        for x in released:
            sid = storage[ins[x]]
            if sid >= 0:
                sref[sid] -= 1
                if not sref[sid]:
                    seq += 1
                    sid_at.append(sid)
                    insort(free, (blocks[sid] << SEQ_BITS) | seq)
                    if timeline:
                        live -= block_live.pop(sid, 0)
        for eo in outs if unread else ():  # only a new block of an unread output is free
            sid = storage[eo]
            if sid >= 0 and not sref[sid]:
                seq += 1
                sid_at.append(sid)
                insort(free, (blocks[sid] << SEQ_BITS) | seq)
                if timeline:
                    live -= block_live.pop(sid, 0)
        if timeline:
            live_line.append(live)
    return SimResult(sum(blocks), storage, blocks, live_line)
