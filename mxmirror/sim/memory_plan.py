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

import contextlib
import gc
from array import array
from dataclasses import dataclass

import numpy as np

from mxmirror.ir import ops
from mxmirror.sim import _planner
from mxmirror.sim.training_graph import TrainingGraph

STRATEGIES = ("none", "inplace", "sharing")
BAD, EXTERNAL = -1, -2
ELEMENT_BYTES = 4  # plan_memory.cc: "assume 4 bytes for now"


@dataclass
class SimResult:
    """What the simulated planner allocated."""

    total_bytes: int
    block_bytes: list[int]  # final size of each storage block
    timeline: list[int]  # live planned bytes after each node (when asked for)
    storage_ids: bytes  # int64 storage id per entry (negative: not allocated here)

    @property
    def storage(self) -> list[int]:
        """Storage id per entry (negative: not allocated here)."""
        return array("q", self.storage_ids).tolist()

    @property
    def mb(self) -> float:
        return self.total_bytes / 2**20


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
    steps: Steps | None = None  # node_steps(self), when known


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


@contextlib.contextmanager
def gc_paused():
    """Big graphs are DAGs freed by reference counts; building ~10^5 small objects (a training
    graph, its flat arrays) makes the cyclic collector rescan the heap over and over."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True)
class Steps:
    """What the planner needs per node that no mirror set changes, decoded once, as the int64
    arrays the compiled planner (``_planner.c``) reads: per node its kind (-1: a variable or
    not decoded; else 1 when it ignores every input), in-place pairs (input slot, output
    entry, output elements, identity), the outputs to allocate (entry, bytes) in allocation
    order, the input slots whose reads are counted, its first output entry and output
    count; and the elements of every entry."""

    packed: tuple


def node_steps(fg: FlatGraph, nodes: list[int] | None = None) -> Steps:
    """The Steps of `fg`'s `nodes` (default: all). Reads of variables are left out: nothing
    here allocates them. A CompiledTraining keeps these for every FlatGraph it resolves (its
    slots that may read another entry per mirror set never read a variable)."""
    facts, all_sizes, in_start, base_of, out_order, ins = (
        fg.facts, fg.sizes, fg.in_start, fg.base, fg.out_order, fg.ins)
    planned = [True] * len(fg.esize)
    for i, f in enumerate(facts):
        if f is None:
            n = len(all_sizes[i])
            planned[base_of[i]:base_of[i] + n] = [False] * n
    n_nodes = len(facts)
    kind = [-1] * n_nodes
    pair_off, alloc_off, rel_off = [0] * (n_nodes + 1), [0] * (n_nodes + 1), [0] * (n_nodes + 1)
    pairs: list[int] = []
    allocs: list[int] = []
    rels: list[int] = []
    out_n = [len(s) for s in all_sizes]
    todo = range(n_nodes) if nodes is None else set(nodes)
    for i in range(n_nodes):
        f = facts[i]
        if f is not None and i in todo:
            sizes, base, lo, hi = all_sizes[i], base_of[i], in_start[i], in_start[i + 1]
            n_out = len(sizes)
            for k in out_order[i]:
                allocs += (base + k, sizes[k] * ELEMENT_BYTES)
            ignore = f.ignore_inputs
            rels += [x for x in range(lo, hi)
                     if planned[ins[x]] and not (ignore and x - lo in ignore)]
            for (i_in, i_out), identity in zip(f.inplace, f.identity):
                if lo + i_in < hi and i_out < n_out and planned[ins[lo + i_in]]:
                    pairs += (lo + i_in, base + i_out, sizes[i_out], int(identity))
            kind[i] = int(len(ignore) == hi - lo > 0)
        pair_off[i + 1], alloc_off[i + 1], rel_off[i + 1] = len(pairs) // 4, len(allocs) // 2, \
            len(rels)
    arrays = (kind, pair_off, pairs, alloc_off, allocs, rel_off, rels, base_of, out_n, fg.esize)
    return Steps(tuple(np.array(a, dtype=np.int64) for a in arrays))


def simulate_flat(fg: FlatGraph, strategy: str = "sharing", match_range: int = 16,
                  timeline: bool = False, stop_at: int | None = None) -> SimResult | None:
    """MXPlanMemory over a FlatGraph (storage ids are indexed by its entries); None as soon
    as the blocks allocated reach `stop_at` bytes (a search only needs to know "not less").
    The planner itself is compiled (``_planner.c``: its rules stated once, checked against a
    literal reading of plan_memory.cc in tests/test_fast_paths.py)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {STRATEGIES}")
    steps = fg.steps if fg.steps is not None else node_steps(fg, fg.order)
    got = _planner.simulate(steps.packed, fg.order, fg.ins, fg.ref, fg.outputs,
                            fg.num_forward_outputs, strategy != "none",
                            match_range if strategy == "sharing" else 0,
                            -1 if stop_at is None else stop_at, timeline)
    if got is None:
        return None
    total, storage, blocks, line = got
    return SimResult(total, blocks, line, storage)
