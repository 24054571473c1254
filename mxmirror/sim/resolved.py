"""Every mirror set's training graph resolved by the compiled planner: what searches score.

``compiled.CompiledTraining`` holds every node that may exist as integers, with the
mirror-independent DFS run once; ``flat(mirror)`` there states in Python how one mirror set
resolves (the copies placed where the DFS meets their switches, each switch reading the copy
or the original, the reference counts). ``_planner.c``'s ``resolve`` does the same on the
CompiledTraining's tables packed once as int64 arrays, and hands the simulator arrays it
reads as they are: a few hundred microseconds a set on ResNet-1001 against milliseconds.
tests/test_fast_paths.py checks that both give the same order, reads, reference counts and
copies on random mirror sets of real and random networks.
"""

from __future__ import annotations

import numpy as np

from mxmirror.sim import _planner, memory_plan
from mxmirror.sim.compiled import CompiledTraining


class Resolved:
    """A CompiledTraining's tables packed for ``_planner.resolve``; ``flat(mirror)`` as
    CompiledTraining.flat, arrays for lists."""

    def __init__(self, c: CompiledTraining) -> None:
        self.c = c
        run_off, run_nodes, met_off, met_cond, met_src = [0], [], [0], [], []
        for run, met in c.runs:
            run_nodes += run
            run_off.append(len(run_nodes))
            met_cond += [cond for cond, _ in met]
            met_src += [src for _, src in met]
            met_off.append(len(met_cond))
        n_graph = len(c.graph.nodes)
        src_off, src_list = [0], []
        for g in range(n_graph):
            src_list += c.copy_sources.get(g, [])
            src_off.append(len(src_list))
        tables = (run_off, run_nodes, met_off, met_cond, met_src, src_off, src_list,
                  [c.copy.get(g, -1) for g in range(n_graph)],
                  [int(g in c.mirrorable) for g in range(n_graph)],
                  *(np.array(c.switch_table, dtype=np.int64).reshape(-1, 4).T),
                  c.index_map, c.ref_static, c.counted_switches,
                  *_copy_reads(c.copy_switches), *_copy_reads(c.copy_entries))
        self.packed = tuple(np.ascontiguousarray(t, dtype=np.int64) for t in tables)
        self.out_entries = np.array(c.out_entries, dtype=np.int64)

    def flat(self, mirror: set[int] | frozenset[int]) -> tuple[memory_plan.FlatGraph, list[int]]:
        """The FlatGraph MXNet plans for `mirror` (graph node ids), and the graph ids of the
        copies it runs (in order)."""
        c = self.c
        order, made, ins, ref = _planner.resolve(self.packed, list(mirror), len(c.esize),
                                                 len(c.op))
        fg = memory_plan.FlatGraph(
            np.frombuffer(order, dtype=np.int64), c.facts, c.sizes,
            np.frombuffer(ins, dtype=np.int64), c.in_start, c.base, c.esize,
            self.out_entries, c.num_forward_outputs, c.out_order,
            np.frombuffer(ref, dtype=np.int64), c.steps)
        return fg, made


def _copy_reads(reads: dict[int, list[int]]) -> tuple[list[int], list[int]]:
    """(what every copy reads, the copy that reads it), copy after copy."""
    what, by = [], []
    for copy, items in reads.items():
        what += items
        by += [copy] * len(items)
    return what, by
