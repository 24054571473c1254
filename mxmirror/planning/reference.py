"""The distance to the limit: one-recompute plans under ideal allocation.

Ideal allocation: every value in a block of its exact size, freed at its last use, MXNet's
in-place reuse kept (the simulator with sharing off): its peak of live bytes is what no
allocator goes below for a plan's schedule. MXNet's figure is that plus the slack of its
free list (blocks matched by size within a factor, never split).

The reference is the best one-recompute plan over the chain of candidate cuts (each segment
between kept cuts recomputed once, as ``search`` plans) under ideal allocation, by a DP.
Its model of the peak: MXNet runs a segment's backward right after recomputing it, so the
peak is at the start of some segment's backward, where live are the graph's outputs, what
every kept cut so far holds (its values and the inputs their backward reads: the union,
overlaps of consecutive cuts counted once) and what the segment's backward reads of its
recomputation. On a chain of blocks (a ResNet's residual units) that is the simulated peak
to a fraction of a MB; where gradients of shared weights accumulate through the whole
backward (an unrolled LSTM) they add a near-constant the model leaves out. So the DP's plan
is re-scored by the simulator: `reference_bytes` is its simulated live peak.

The DP: for a peak T, the least held bytes P[j] of cut sets ending at cut j whose every
segment so far stays within T; T bisected (O(m^2) per T, m candidate cuts).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from mxmirror.planning.algorithm3 import segment_mirror
from mxmirror.planning.analysis import Analysis, Cut, backward_reads
from mxmirror.sim import memory_plan, training_graph


def live_peak_bytes(a: Analysis, mirror: set[int] | frozenset[int]) -> int:
    """Live bytes at the peak of `mirror`'s schedule under ideal allocation (see above)."""
    kept = a.drop_unread(frozenset(mirror))
    if a.resolved is not None:
        fg = a.resolved.flat(kept)[0]
    else:
        fg = memory_plan.flatten(training_graph.build(a.graph, set(kept)))
    return max(memory_plan.simulate_flat(fg, "inplace", timeline=True).timeline, default=0)


@dataclass(frozen=True)
class Reference:
    """The DP's plan and what it costs: the model's peak, the simulated live peak and MXNet's
    figure for the same mirror set."""

    cuts: tuple[Cut, ...]
    mirror: frozenset[int]
    model_bytes: int
    reference_bytes: int  # simulated live peak of the plan
    planned_bytes: int  # MXNet's figure (simulated) of the plan


RESOLUTION = 1e-4  # the DP's peak is the least to this fraction


class ChainModel:
    """The peak of every segment (cut i, cut j] of the chain, as matrices over the start, the
    candidate cuts and the end (index 0: the start, m + 1: the end)."""

    def __init__(self, a: Analysis) -> None:
        self.a = a
        self.cuts = list(a.cuts)

    @cached_property
    def _read_by_backward(self) -> list[list[tuple[tuple[int, int], int]]]:
        """Per forward position: its node's outputs some backward reads, with their bytes."""
        a, g = self.a, self.a.graph
        read: dict[int, set[int]] = {}
        for n in a.order:
            for tn in (n.template.nodes if n.template is not None else ()):
                read.setdefault(n.id, set()).update(r[1] for r in tn.inputs if r[0] == "out")
            for j in backward_reads(n):
                if j < len(n.inputs) and not g.nodes[n.inputs[j][0]].is_variable:
                    read.setdefault(n.inputs[j][0], set()).add(n.inputs[j][1])
        return [[((n.id, k), a.entry_bytes((n.id, k))) for k in sorted(read.get(n.id, ()))]
                for n in a.order]

    @cached_property
    def matrices(self) -> tuple[np.ndarray, np.ndarray, int]:
        """(held[i, j]: bytes cut j adds to what cut i holds; inside[i, j]: what the
        backward of segment (i, j] reads of its recomputation; the graph's outputs)."""
        a, cuts = self.a, self.cuts
        m = len(cuts)
        pos = [-1] + [c.pos for c in cuts] + [len(a.order) - 1]
        held = [set()] + [a.held_entries(c.keep) for c in cuts] + [set()]
        rb = self._read_by_backward
        prefix = np.concatenate(([0], np.cumsum([sum(b for _, b in r) for r in rb])))
        where = {e: p for p, r in enumerate(rb) for e, _ in r}
        n = m + 2
        adds = np.zeros((n, n), dtype=np.int64)
        inside = np.zeros((n, n), dtype=np.int64)
        made_at = {n.id: p for p, n in enumerate(a.order)}
        starts = np.array(pos)
        for j in range(1, n):
            adds[:j, j] = sum(map(a.entry_bytes, held[j]))
            # recomputed values of (i, j] the backward reads, less those cut j holds
            inside[:j, j] = prefix[pos[j] + 1] - prefix[starts[:j] + 1]
            for e in held[j]:
                q = where.get(e)
                if q is not None:
                    inside[:j, j] -= np.where(starts[:j] < q, a.entry_bytes(e), 0)
            # what cut i holds too (an entry made at or before cut i's position)
            first = min((made_at[e[0]] for e in held[j]), default=pos[j])
            for i in range(max(1, int(np.searchsorted(starts, first))), j):
                adds[i, j] -= sum(map(a.entry_bytes, held[j] & held[i]))
        outputs = sum(a.entry_bytes(h) for h in set(a.graph.heads)
                      if not a.graph.nodes[h[0]].is_variable)
        return adds, inside, outputs

    def peak(self, chosen: list[Cut]) -> int:
        """The model's peak of a plan keeping `chosen` (sorted by position)."""
        adds, inside, outputs = self.matrices
        index = {c.pos: k + 1 for k, c in enumerate(self.cuts)}
        path = [0] + [index[c.pos] for c in chosen] + [len(self.cuts) + 1]
        held = worst = 0
        for i, j in zip(path, path[1:]):
            held += adds[i, j]
            worst = max(worst, outputs + held + inside[i, j])
        return int(worst)

    def best(self) -> list[Cut]:
        """Cuts whose model peak is within RESOLUTION of the least (the peak bisected; exact
        for the model up to the union of held entries, counted between consecutive cuts)."""
        adds, inside, outputs = self.matrices
        n = len(self.cuts) + 2
        lo, hi = 0, min(self.peak(list(self.cuts)), self.peak([])) + 1  # both feasible
        best_path = None
        while hi - lo > RESOLUTION * hi:
            mid = (lo + hi) // 2
            path = self._within(mid, adds, inside, outputs, n)
            if path is None:
                lo = mid + 1
            else:
                hi, best_path = mid, path
        if best_path is None:
            best_path = self._within(hi, adds, inside, outputs, n) or []
        return [self.cuts[k - 1] for k in best_path]

    @staticmethod
    def _within(limit: int, adds, inside, outputs: int, n: int) -> list[int] | None:
        """Cut indices of a plan whose every segment's model peak is within `limit`, with
        the least held bytes at each cut; None if there is none."""
        big = np.iinfo(np.int64).max // 4
        held = np.full(n, big, dtype=np.int64)
        back = np.full(n, -1, dtype=np.int64)
        held[0] = 0
        for j in range(1, n):
            cand = held[:j] + adds[:j, j]
            ok = (held[:j] < big) & (outputs + cand + inside[:j, j] <= limit)
            if ok.any():
                i = int(np.argmin(np.where(ok, cand, big)))
                held[j], back[j] = cand[i], i
        if held[n - 1] >= big:
            return None
        path, j = [], int(back[n - 1])
        while j > 0:
            path.append(j)
            j = int(back[j])
        return path[::-1]


NO_CUT = ("the forward graph has no candidate cut (no place to split it for recomputation), "
          "so there is no one-recompute plan to compare with")  # why reference() is None


def reference(a: Analysis) -> Reference | None:
    """The DP's plan, re-scored (None: no candidate cut, NO_CUT)."""
    if not a.cuts:
        return None
    model = ChainModel(a)
    chosen = model.best()
    mirror = frozenset(a.drop_unread(frozenset(segment_mirror(a, chosen))))
    return Reference(tuple(chosen), mirror, model.peak(chosen), live_peak_bytes(a, mirror),
                     a.score(mirror).planned_bytes)
