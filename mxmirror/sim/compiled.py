"""The training graph of every mirror set at once: built once per forward graph, then
resolved and simulated for each mirror set a planner scores, without building objects.

``training_graph.build`` makes a fresh graph of objects per mirror set; searches score
hundreds of sets on graphs of 10^4 nodes. But a mirror set changes little: which copy
(original or mirror) a backward node or a mirror copy reads, and which copies exist. So
every node that may exist is made once here, as integers: the forward nodes, one
potential copy per mirrorable node, the backward nodes, gradient sums and copies; a read
that depends on the mirror set is a *switch* (this original, or its copy when mirrored).
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
from mxmirror.ir.graph import PARAM, Graph
from mxmirror.sim import memory_plan
from mxmirror.sim.training_graph import INPLACE_SUM_CAP, ZERO_OPS


class Unsupported(Exception):
    """A graph this compiler does not model; callers build the training graph instead."""


class CompiledTraining:
    """Integer training graph with switches; ``flat(mirror)`` resolves one mirror set."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        topo = graph.forward_order
        self.op: list[str | None] = []
        self.sizes: list[list[int]] = []
        self.ins: list[list] = []  # entries: (node, k), or a switch index
        self.cdeps: list[list[int]] = []  # nodes, or ~switch index
        self.switches: list[tuple[int, int, int]] = []  # (cond node or -1, fwd node, k)
        self.fwd: dict[int, int] = {}  # graph node id -> compiled node
        self.copy: dict[int, int] = {}  # graph node id -> compiled mirror copy
        self.copy_of: dict[int, int] = {}  # compiled mirror copy -> graph node id
        fwd, copy = self.fwd, self.copy
        for n in topo:
            if n.is_variable:
                fwd[n.id] = self._node(None, n.element_counts, [])
            else:
                fwd[n.id] = self._node(n.op, n.element_counts,
                                       [(fwd[s], k) for s, k in n.inputs])
        self.fwd_of = {c: g for g, c in fwd.items()}
        outputs = [(fwd[h[0]], h[1]) for h in graph.heads]
        xs = [n for n in topo if n.kind == PARAM]  # as training_graph.build
        if not xs:
            raise Unsupported("nothing gets a gradient")
        grads: dict[int, list[list]] = {n.id: [[] for _ in n.shapes] for n in topo}
        for t, k in outputs:
            size = self.sizes[t][k]
            var = self._node(None, [size], [])
            hint = self._node("_identity_with_attr_like_rhs", [size], [(var, 0), (t, k)])
            grads[self.fwd_of[t]][k] = [(hint, 0)]
        self.mirrorable: set[int] = set()  # graph ids that get a copy when mirrored
        for n in topo:
            if not n.is_variable and n.op != "Dropout":
                c = self._node(n.op, n.element_counts,
                               [self._switch(-1, s, k) for s, k in n.inputs])
                copy[n.id] = c
                self.copy_of[c] = n.id
                self.mirrorable.add(n.id)
        for n in reversed(topo):
            if n.is_variable:
                continue
            agg = [self._aggregate(g, size) for g, size in zip(grads[n.id], n.element_counts)]
            if not n.inputs:
                continue
            tpl = n.template
            if tpl is None:
                raise Unsupported(f"no backward template for {n.name}")
            made: list[int] = []

            def ref(r, n=n, made=made, agg=agg):
                kind = r[0]
                if kind == "ograd":
                    return agg[r[1]]
                if kind == "in":
                    s, k = n.inputs[r[1]]
                    return self._switch(n.id, s, k)
                if kind == "out":
                    return self._switch(-1, n.id, r[1])
                return (made[r[1]], r[2])

            sizes = n.backward_sizes
            for t, tn in enumerate(tpl.nodes):
                b = self._node(tn.op, sizes[t], [ref(r) for r in tn.inputs])
                if tn.control_fwd:
                    self.cdeps[b].append(~self._switch(-1, n.id, 0))
                self.cdeps[b].extend(made[c] for c in tn.control_nodes)
                made.append(b)
            for (src, k), r in zip(n.inputs, tpl.input_grads):
                if r is not None:
                    if r[0] in ("in", "out"):
                        raise Unsupported(f"{n.op}: an input gradient that is a forward value")
                    grads[src][k].append(ref(r))
        seen: set[tuple[int, int]] = set()
        for x in xs:
            g = self._aggregate(grads[x.id][0], self.sizes[fwd[x.id]][0])
            if g in seen:
                g = (self._node("_copy", [self.sizes[g[0]][g[1]]], [g]), 0)
            seen.add(g)
            outputs.append(g)
        self.outputs = outputs
        self.num_forward_outputs = len(graph.heads)
        self._lay_out()

    # ------------------------------------------------------------ building
    def _node(self, op: str | None, sizes: list[int], ins: list) -> int:
        self.op.append(op)
        self.sizes.append(list(sizes))
        self.ins.append(ins)
        self.cdeps.append([])
        return len(self.op) - 1

    def _switch(self, cond: int, src: int, k: int) -> int:
        """A read of `src`'s output k: its copy when `src` (and `cond`, if given) are
        mirrored, else the original. Variables are never copied: a plain entry."""
        if src not in self.copy and self.graph.nodes[src].is_variable:
            return (self.fwd[src], k)
        self.switches.append((cond, src, k))
        return len(self.switches) - 1

    def _aggregate(self, v: list, size: int) -> tuple[int, int]:
        """MXNet's AggregateGradient, as training_graph._aggregate."""
        if not v:
            return (self._node("_zeros_without_dtype", [size], []), 0)
        kept = [e for e in v if self.op[e[0]] not in ZERO_OPS]
        if not kept:
            kept = v[:1]
        if len(kept) == 1:
            return kept[0]
        if len(kept) < INPLACE_SUM_CAP:
            return (self._node("add_n", [size], list(kept)), 0)
        ret = kept[0]
        for i in range(1, len(kept)):
            if kept[i - 1][0] != kept[i][0]:
                self.cdeps[kept[i][0]].append(ret[0])
            ret = (self._node("_grad_add", [size], [ret, kept[i]]), 0)
        return (self._node("identity", [size], [ret]), 0)

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
        # the DFS: events are compiled nodes (>= 0) or switches met (~index)
        events: list[int] = []
        visited = bytearray(n)
        fwd_nodes = set(self.fwd.values())
        for head, _ in self.outputs[:self.num_forward_outputs]:
            self._dfs(head, visited, events)
        if any(not visited[c] for c in fwd_nodes):
            raise Unsupported("a forward node the forward heads do not reach")
        for head, _ in self.outputs[self.num_forward_outputs:]:
            self._dfs(head, visited, events)
        # runs of nodes, each followed by the switches met after it
        self.runs: list[tuple[list[int], list[tuple[int, int]]]] = [([], [])]
        for ev in events:
            if ev >= 0:
                if self.runs[-1][1]:
                    self.runs.append(([], []))
                self.runs[-1][0].append(ev)
            else:
                c, src, _ = self.switches[~ev]
                self.runs[-1][1].append((c, src))
        self._lay_out_reads(visited)
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

    def _dfs(self, head: int, visited: bytearray, events: list[int]) -> None:
        """Post-order DFS (inputs, then control dependencies) that does not enter switches:
        it records them where it meets them (~index) and goes on."""
        if visited[head]:
            return
        visited[head] = 1
        stack = [(head, 0)]
        while stack:
            node, i = stack[-1]
            children = [e[0] if isinstance(e, tuple) else ~e for e in self.ins[node]]
            children += self.cdeps[node]
            while i < len(children):
                child = children[i]
                i += 1
                if child < 0:
                    events.append(child)
                    continue
                if not visited[child]:
                    visited[child] = 1
                    stack[-1] = (node, i)
                    stack.append((child, 0))
                    break
            else:
                events.append(node)
                stack.pop()

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
