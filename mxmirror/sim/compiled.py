"""The training graph of every mirror set at once: built once per forward graph, then
resolved and simulated for each mirror set a planner scores, without building objects.

``training_graph.build`` makes a fresh graph of objects per mirror set; searches score
hundreds of sets on graphs of 10^4 nodes. But a mirror set changes little: which copy
(original or mirror) a backward node or a mirror copy reads, and which copies exist. So
``gradient_pass.run`` makes every node that may exist once here, as integers: the forward
nodes, one potential copy per mirrorable node, the backward nodes, gradient sums and
copies; a read that depends on the mirror set is a *switch* (this original, or its copy
when mirrored).
MXNet's execution order (a post-order DFS from the outputs) visits the nodes that do not
depend on the mirror set in the same order whatever the set, since copies read only
copies and originals: the DFS is run once, recording where it meets a switch, and each
mirror set only inserts the copies it reaches at those points. The result is the same
order, the same reads and, through ``memory_plan.simulate_flat``, the same figure as
``memory_plan.simulate(training_graph.build(graph, mirror))`` (tests/test_compiled.py).
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from mxmirror.ir import ops
from mxmirror.ir.graph import PARAM, Graph, Node, post_order
from mxmirror.sim import gradient_pass, memory_plan


class Unsupported(Exception):
    """A graph this compiler does not model; callers build the training graph instead."""


class CompiledTraining:
    """Integer training graph with switches; ``flat(mirror)`` resolves one mirror set."""

    def __init__(self, graph: Graph) -> None:
        why = _unsupported(graph)
        if why:
            raise Unsupported(why)
        self.graph = graph
        made = _Integers(graph)
        self.outputs, self.num_forward_outputs = gradient_pass.run(graph, made)
        self.op: list[str | None] = made.ops
        self.sizes: list[list[int]] = made.sizes
        self.ins: list[list] = made.ins  # entries: (node, k), or a switch index
        self.cdeps: list[list[int]] = made.cdeps  # nodes, or ~switch index
        self.switches: list[tuple[int, int, int]] = made.switches  # (cond or -1, node, k)
        self.fwd: dict[int, int] = made.fwd  # graph node id -> compiled node
        self.copy: dict[int, int] = made.copies  # graph node id -> compiled mirror copy
        self.copy_of: dict[int, int] = {c: g for g, c in self.copy.items()}
        self.mirrorable: set[int] = set(self.copy)  # graph ids that get a copy when mirrored
        self._lay_out()

    def _lay_out(self) -> None:
        """Entries, facts and the mirror-independent DFS with its switch events."""
        n = len(self.op)
        self.base, esize, eid = [0] * n, [], 0
        for i in range(n):
            self.base[i] = eid
            esize.extend(self.sizes[i])
            eid += len(self.sizes[i])
        self.esize = esize
        self.facts = [None if op is None else ops.memory_facts(op, len(self.ins[i]))
                      for i, op in enumerate(self.op)]
        self.out_order = [memory_plan.allocation_order(sz) for sz in self.sizes]
        self.out_entries = [self.base[s] + k for s, k in self.outputs]
        # per switch: (cond node or -1, source node, entry of the original, of the copy)
        self.switch_table = [(c, s, self.base[self.fwd[s]] + k,
                              self.base[self.copy[s]] + k if s in self.copy else -1)
                             for c, s, k in self.switches]
        # MXNet's DFS, not entering switches: a switch (~index) is a leaf, an event where met
        kids = [[e[0] if isinstance(e, tuple) else ~e for e in ins] + cd
                for ins, cd in zip(self.ins, self.cdeps)]
        events = post_order([h for h, _ in self.outputs], lambda v: kids[v] if v >= 0 else ())
        reached = bytearray(n)
        # runs of nodes, each followed by the switches met after it
        self.runs: list[tuple[list[int], list[tuple[int, int]]]] = [([], [])]
        for ev in events:
            if ev >= 0:
                reached[ev] = 1
                if self.runs[-1][1]:
                    self.runs.append(([], []))
                self.runs[-1][0].append(ev)
            else:
                c, src, _ = self.switches[~ev]
                self.runs[-1][1].append((c, src))
        self._lay_out_reads(reached)
        # what a copy's DFS enters: its inputs that may be copied, in order
        self.copy_sources = {g: [s for s, _ in self.graph.nodes[g].inputs if s in self.copy]
                             for g in self.copy}

    def _lay_out_reads(self, reached: bytearray) -> None:
        """Every node's input slots (an entry, or n_entries + switch index) and the reference
        counts of the nodes that always run; reads by switches and copies are added per set."""
        n_entries = len(self.esize)
        self.index_map: list[int] = []
        self.in_start = [0]
        self.ref_static = [0] * n_entries
        self.counted_switches: list[int] = []  # switch reads of nodes that always run
        self.copy_switches: dict[int, list[int]] = {c: [] for c in self.copy_of}
        self.copy_entries: dict[int, list[int]] = {c: [] for c in self.copy_of}
        for i, ins in enumerate(self.ins):
            f = self.facts[i]
            ignore = f.ignore_inputs if f is not None else frozenset()
            is_copy = i in self.copy_of
            for j, e in enumerate(ins):
                counted = j not in ignore and (is_copy or reached[i])
                if isinstance(e, tuple):
                    entry = self.base[e[0]] + e[1]
                    self.index_map.append(entry)
                    if counted and is_copy:
                        self.copy_entries[i].append(entry)
                    elif counted:
                        self.ref_static[entry] += 1
                else:
                    self.index_map.append(n_entries + e)
                    if counted and is_copy:
                        self.copy_switches[i].append(e)
                    elif counted:
                        self.counted_switches.append(e)
            self.in_start.append(len(self.index_map))
        for e in self.out_entries:
            self.ref_static[e] += 1
        # the same as arrays, for flat(): what a mirror set changes is resolved vectorised
        self._index_map = np.array(self.index_map, dtype=np.int64)
        self._ref_static = np.array(self.ref_static, dtype=np.int64)
        self._counted = np.array(self.counted_switches, dtype=np.int64)
        # the reads of every copy, with the copy that reads (selected per mirror set)
        sw_of = [c for c, v in self.copy_switches.items() for _ in v]
        ent_of = [c for c, v in self.copy_entries.items() for _ in v]
        self._copy_sw = np.array(list(chain.from_iterable(self.copy_switches.values())),
                                 dtype=np.int64)
        self._copy_sw_of = np.array(sw_of, dtype=np.int64)
        self._copy_ent = np.array(list(chain.from_iterable(self.copy_entries.values())),
                                  dtype=np.int64)
        self._copy_ent_of = np.array(ent_of, dtype=np.int64)
        table = np.array(self.switch_table, dtype=np.int64).reshape(-1, 4)
        self._cond, self._src, self._orig, self._copied = table.T
        self._cond_at = np.maximum(self._cond, 0)
        self._n_graph = len(self.graph.nodes)
        # the simulator's per-node facts, from the reads of the empty mirror set (a slot that
        # reads another entry per set reads an op's output in every set: not a variable)
        ins = np.concatenate((np.arange(n_entries), self._orig))[self._index_map].tolist()
        self.steps = memory_plan.node_steps(memory_plan.FlatGraph(
            [], self.facts, self.sizes, ins, self.in_start, self.base, self.esize, [], 0,
            self.out_order))

    # ------------------------------------------------------------ per mirror set
    def flat(self, mirror: set[int] | frozenset[int]) -> tuple[memory_plan.FlatGraph, list[int]]:
        """The FlatGraph MXNet plans for `mirror` (graph node ids), and the graph ids of the
        copies it runs (in order)."""
        mir = self.mirrorable.intersection(mirror)
        copy, sources = self.copy, self.copy_sources
        order: list[int] = []
        made: list[int] = []
        pending = set(mir)  # mirrored nodes whose copy is not placed yet
        for run, met in self.runs:
            order.extend(run)
            for cond, src in met:
                if src not in pending or (cond >= 0 and cond not in mir):
                    continue
                pending.discard(src)
                stack, inputs = [src], [iter(sources[src])]
                while stack:  # the copy's own DFS: copies of its mirrored inputs first
                    for s in inputs[-1]:
                        if s in pending:
                            pending.discard(s)
                            stack.append(s)
                            inputs.append(iter(sources[s]))
                            break
                    else:
                        g = stack.pop()
                        inputs.pop()
                        order.append(copy[g])
                        made.append(g)
        mirrored = np.zeros(self._n_graph, dtype=bool)
        mirrored[list(mir)] = True
        on = mirrored[self._src] & ((self._cond < 0) | mirrored[self._cond_at])
        read = np.where(on, self._copied, self._orig)  # the entry each switch reads
        n_entries = len(self.esize)
        ins = np.concatenate((np.arange(n_entries), read))[self._index_map].tolist()
        made_mask = np.zeros(len(self.op), dtype=bool)
        made_mask[[copy[g] for g in made]] = True
        readers = np.concatenate([read[self._counted],
                                  read[self._copy_sw[made_mask[self._copy_sw_of]]],
                                  self._copy_ent[made_mask[self._copy_ent_of]]])
        ref = (self._ref_static + np.bincount(readers, minlength=n_entries)).tolist()
        fg = memory_plan.FlatGraph(order, self.facts, self.sizes, ins, self.in_start, self.base,
                              self.esize, self.out_entries, self.num_forward_outputs,
                              self.out_order, ref, self.steps)
        return fg, made


def _unsupported(graph: Graph) -> str | None:
    """Why this compiler does not model the graph, if it does not (training_graph.build does):
    nothing gets a gradient, a node without its template, or an input gradient that is a
    forward value (a sum's term would then depend on the mirror set)."""
    topo = graph.forward_order
    if not any(n.kind == PARAM for n in topo):
        return "nothing gets a gradient"
    checked: set[int] = set()  # templates are shared by the nodes of one signature
    for n in topo:
        tpl = n.template
        if n.is_variable or not n.inputs or id(tpl) in checked:
            continue
        if tpl is None:
            return f"no backward template for {n.name}"
        if any(r is not None and r[0] in ("in", "out") for r in tpl.input_grads):
            return f"{n.op}: an input gradient that is a forward value"
        checked.add(id(tpl))
    return None


class _Integers:
    """gradient_pass.Builder for every mirror set at once: nodes are integers, every
    mirrorable node gets a potential copy, and a read of an op's output is a switch (this
    original, or its copy where the set mirrors it)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.ops: list[str | None] = []
        self.sizes: list[list[int]] = []
        self.ins: list[list] = []
        self.cdeps: list[list[int]] = []
        self.switches: list[tuple[int, int, int]] = []
        self.fwd: dict[int, int] = {}
        self.copies: dict[int, int] = {}

    def node(self, op: str | None, sizes: list[int], inputs: list, role: str = "",
             name: str = "", of: int | None = None) -> int:
        self.ops.append(op)
        self.sizes.append(list(sizes))
        self.ins.append(inputs)
        self.cdeps.append([])
        return len(self.ops) - 1

    def forward(self, n: Node, inputs: list) -> int:
        self.fwd[n.id] = self.node(n.op, n.element_counts, inputs)
        return self.fwd[n.id]

    def copy(self, n: Node, inputs: list) -> None:
        self.copies[n.id] = self.node(n.op, n.element_counts, inputs)

    def read(self, cond: int, src: int, k: int) -> tuple[int, int] | int:
        """A plain entry for a variable (never copied), else a new switch's index."""
        if self.graph.nodes[src].is_variable:
            return (self.fwd[src], k)
        self.switches.append((cond, src, k))
        return len(self.switches) - 1

    def control(self, node: int, entry: tuple[int, int] | int) -> None:
        self.cdeps[node].append(entry[0] if isinstance(entry, tuple) else ~entry)

    def op(self, entry: tuple[int, int]) -> str | None:
        return self.ops[entry[0]]

    def size(self, entry: tuple[int, int]) -> int:
        return self.sizes[entry[0]][entry[1]]

    def name(self, node: int) -> str:
        return ""
