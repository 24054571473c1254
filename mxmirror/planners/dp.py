"""The multi-level DP: least recompute under a byte budget when segments may be recomputed
several times.

A dynamic program in the spirit of Revolve / rotor (Griewank & Walther 2000;
Beaumont et al. 2019, heterogeneous chains) over the chain of segments of the
segmented executor: C(s, e, M) is the least forward work that backpropagates
segments s+1..e, given the state at cut s, with at most M bytes of further
kept states. A leaf (s, s+1) re-runs its segment's forward then its backward;
otherwise choose mid: run forward s+1..mid keeping only the state at mid
(b_mid bytes), solve (mid, e) with M - b_mid, drop it, solve (s, mid) with M.
The fixed costs (the executors' shared pool, staging slots, Dropout masks,
boundary gradients) are added outside the DP; the chosen schedule is then
walked by ``segments.dry_run`` and its exact peak checked against the budget.
Memory is discretised into K levels (boundary sizes rounded up), so the
result is optimal for the chain model up to that rounding.
"""

from __future__ import annotations

import math

import numpy as np

from ..analysis import Analysis
from ..errors import PlanError
from ..graph import Graph
from ..segments import SegmentPlan, Segments, Tree, make_segment_plan
from .common import MAX_SEGMENTS, segment_chain

LEVELS = 64


class Table:
    """The DP over every memory level at once: cost[s, e, M] and the chosen mid."""

    def __init__(self, flops: list[float], state_bytes: list[int], unit: float,
                 levels: int = LEVELS) -> None:
        m = len(flops)
        self.m, self.unit, self.levels = m, unit, levels
        bu = np.array([math.ceil(b / unit) if b > 0 else 0 for b in state_bytes], dtype=np.int64)
        self.bu = bu
        prefix = np.concatenate(([0.0], np.cumsum(flops)))
        K = levels
        Ms = np.arange(K + 1)
        cost = np.full((m + 1, m + 1, K + 1), np.inf, dtype=np.float64)
        arg = np.full((m + 1, m + 1, K + 1), -1, dtype=np.int32)
        for s in range(m):
            cost[s, s + 1, :] = flops[s]
        for length in range(2, m + 1):
            for s in range(0, m - length + 1):
                e = s + length
                mids = np.arange(s + 1, e)
                adv = prefix[mids] - prefix[s]
                pair = bu[s + 1:e].copy()
                pair[1:] += bu[s + 1:e - 1]
                peak = np.maximum.accumulate(pair)
                idx = Ms[None, :] - bu[mids][:, None]
                right = np.take_along_axis(cost[mids, e, :], np.clip(idx, 0, K), axis=1)
                right[idx < 0] = np.inf
                tot = adv[:, None] + right + cost[s, s + 1:e, :]
                tot[peak[:, None] > Ms[None, :]] = np.inf
                j = tot.argmin(axis=0)
                cost[s, e, :] = tot[j, Ms]
                arg[s, e, :] = mids[j]
        self.cost, self.arg = cost, arg
        self.total_flops = float(prefix[-1])

    def best(self, level: int) -> float:
        return float(self.cost[0, self.m, min(level, self.levels)])

    def min_level(self) -> int | None:
        ok = np.nonzero(np.isfinite(self.cost[0, self.m, :]))[0]
        return int(ok[0]) if len(ok) else None

    def tree(self, level: int) -> Tree:
        tree: Tree = {}
        stack = [(0, self.m, min(level, self.levels))]
        while stack:
            s, e, M = stack.pop()
            if e - s < 2:
                continue
            mid = int(self.arg[s, e, M])
            if mid < 0:
                raise ValueError(f"no schedule for ({s}, {e}) at level {M}")
            tree[(s, e)] = mid
            stack += [(mid, e, M - int(self.bu[mid])), (s, mid, M)]
        return tree


def fixed_bytes(sp: SegmentPlan) -> int:
    """Planned bytes besides the kept states: pool, staging, masks, outputs, gradients."""
    return sp.pool_bytes + sp.staging_bytes + sp.mask_bytes + sp.output_bytes


def table_for(sp: SegmentPlan, top_bytes: int, levels: int = LEVELS) -> Table:
    sg = sp.segments
    states = [sg.state_bytes(i) for i in range(sg.m + 1)]
    unit = max(top_bytes / levels, 1.0)
    return Table([s.flops for s in sg.segments], states, unit, levels)


def curve(a: Analysis, levels: int = LEVELS, max_segments: int = MAX_SEGMENTS):
    """(planned bytes, recompute ratio, plan) over every memory level, exact by dry run."""
    graph = a.graph
    sp = segment_chain(a, max_segments)
    sg = sp.segments
    states = [sg.state_bytes(i) for i in range(sg.m + 1)]
    top = sum(states)
    # memory is discretised into `levels` steps of top/levels: several scales, so that the
    # small budgets are not rounded to a few coarse steps
    tops, t = [], top
    while t > 2 * max(states):
        tops.append(t)
        t /= 8
    tops.append(2 * max(states))
    out = [(sp.planned_bytes, (sp.dry.forward_flops - sum(s.flops for s in sg.segments))
            / (sum(s.flops for s in sg.segments) or 1.0), sp)]  # the binary recursion
    seen = {tuple(sorted(sp.tree.items()))}
    for t in tops:
        table = table_for(sp, t, levels)
        F = table.total_flops or 1.0
        for level in range(levels + 1):
            if not math.isfinite(table.best(level)):
                continue
            tree = table.tree(level)
            key = tuple(sorted(tree.items()))
            if key in seen:
                continue
            seen.add(key)
            p = make_segment_plan(graph, sg.cuts, tree, sg=sg,
                                  mem=(sp.template_bytes, sp.template_blocks))
            out.append((p.planned_bytes, (p.dry.forward_flops - F) / F, p))
    return out


def plan_for_budget(a: Analysis, budget_bytes: int) -> SegmentPlan:
    """The least-recompute segmented plan whose planned bytes fit; PlanError if none."""
    graph = a.graph
    sp = segment_chain(a, MAX_SEGMENTS)
    sg = sp.segments
    fixed = fixed_bytes(sp)
    grad_allowance = 2 * max((sg.state_bytes(i) for i in range(sg.m + 1)), default=0)
    avail = budget_bytes - fixed - grad_allowance
    smallest = _smallest(graph, sg, sp)
    if avail <= 0 or smallest.planned_bytes > budget_bytes:
        raise PlanError(f"budget {budget_bytes / 2**20:.0f} MB is below the smallest planned "
                        f"memory reachable even with several recomputations per node "
                        f"({smallest.planned_bytes / 2**20:.0f} MB); raise the budget")
    table = table_for(sp, avail)
    best = None
    for level in range(table.levels, -1, -1):
        if not math.isfinite(table.best(level)):
            break
        p = make_segment_plan(graph, sg.cuts, table.tree(level), sg=sg,
                              mem=(sp.template_bytes, sp.template_blocks))
        if p.planned_bytes <= budget_bytes:
            best = p
            break
    return best or smallest


def _smallest(graph: Graph, sg: Segments, sp: SegmentPlan) -> SegmentPlan:
    """The least-memory schedule the DP finds (lowest feasible level)."""
    top = sum(sg.state_bytes(i) for i in range(sg.m + 1))
    table = table_for(sp, top)
    level = table.min_level()
    cands = [sp]
    if level is not None:
        cands.append(make_segment_plan(graph, sg.cuts, table.tree(level), sg=sg,
                                       mem=(sp.template_bytes, sp.template_blocks)))
    return min(cands, key=lambda p: (p.planned_bytes, p.dry.forward_flops))
