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
boundary gradients) are added outside the DP; the chosen schedule's operations are then
replayed by ``segments.cost.dry_run`` and its exact peak checked against the budget.
Memory is discretised into K levels (boundary sizes rounded up), so the
result is optimal for the chain model up to that rounding.

The DP runs over several chains (``cut_sets``, then ``chains``): the finest (every candidate cut,
whose binary recursion is the ``recursive`` plan) and the coarser ones of
Algorithm 3's budget grid. A coarse chain trades a larger pool (its largest
segment's training graph) for fewer boundaries and reruns; its store-all
schedule runs each segment's forward twice (one extra forward), so the union of
the chains' curves reaches recompute 1.0 where the finest chain alone starts at
about 1.8.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import replace

import numpy as np

from mxmirror.errors import BudgetTooSmall, PlanError
from mxmirror.log import size
from mxmirror.planning import _dp
from mxmirror.planning.algorithm3 import grid_cuts
from mxmirror.planning.analysis import Analysis
from mxmirror.planning.chains import MAX_SEGMENTS, finest_cuts
from mxmirror.progress import task
from mxmirror.segments.cost import SegmentPlan, dry_run, make_segment_plan
from mxmirror.segments.cuts import chain_cuts, segment_flops
from mxmirror.segments.schedule import Tree, store_all_tree

LEVELS = 64
BUDGET_CELLS = 4e6  # a budget's table on a short chain: m^2 x levels
GRID_STEPS, GRID_SPREAD = 9, 8.0  # Algorithm 3's grid for the coarse chains (as the front's)


class Table:
    """The DP over every memory level at once: cost[s, e, M] and the chosen mid."""

    def __init__(self, flops: list[float], state_bytes: list[int], unit: float,
                 levels: int = LEVELS) -> None:
        m = len(flops)
        self.m, self.unit, self.levels = m, unit, levels
        bu = np.array([math.ceil(b / unit) if b > 0 else 0 for b in state_bytes], dtype=np.int64)
        self.bu = bu
        prefix = np.concatenate(([0.0], np.cumsum(flops)))
        cost = np.empty((m + 1, m + 1, levels + 1), dtype=np.float64)
        arg = np.empty((m + 1, m + 1, levels + 1), dtype=np.int32)
        _dp.table(np.asarray(flops, dtype=np.float64), prefix, bu, cost, arg)
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
    """Planned bytes besides the kept states: pool, staging, masks, outputs, statistics."""
    return sp.planned_bytes - sp.dry.peak_bytes


def table_for(sp: SegmentPlan, top_bytes: int, levels: int = LEVELS) -> Table:
    sg = sp.segments
    states = [sg.state_bytes(i) for i in range(sg.m + 1)]
    unit = max(top_bytes / levels, 1.0)
    return Table([s.flops for s in sg.segments], states, unit, levels)


_cut_sets: weakref.WeakKeyDictionary[Analysis, dict[int, list[list[int]]]] = \
    weakref.WeakKeyDictionary()
_chains: weakref.WeakKeyDictionary[Analysis, dict[int, list[SegmentPlan]]] = \
    weakref.WeakKeyDictionary()


def cut_sets(a: Analysis, max_segments: int = MAX_SEGMENTS) -> list[list[int]]:
    """The cuts (op positions) of the chains the DP runs over: the finest first (the
    ``recursive`` plan's), then Algorithm 3's coarser grid (distinct, 2..max_segments
    segments); computed once per Analysis, with no segment built."""
    found = _cut_sets.get(a, {}).get(max_segments)
    if found is not None:
        return found
    fine = finest_cuts(a, max_segments)
    out, seen = [fine], {tuple(fine)}
    for _budget, grid in grid_cuts(a, steps=GRID_STEPS, spread=GRID_SPREAD):
        cuts = chain_cuts(a.graph, [cut.pos for cut in grid])
        if not cuts or tuple(cuts) in seen or len(cuts) + 1 > max_segments:
            continue
        seen.add(tuple(cuts))
        out.append(cuts)
    _cut_sets.setdefault(a, {})[max_segments] = out
    return out


def chains(a: Analysis, max_segments: int = MAX_SEGMENTS) -> list[SegmentPlan]:
    """The plans of cut_sets' chains, each with its binary tree (the first is the
    ``recursive`` plan where its sums are exact), those whose segments sum every gradient
    as MXNet does only (Segments.exact: a plan never changes what training computes);
    computed once per Analysis."""
    found = _chains.get(a, {}).get(max_segments)
    if found is not None:
        return found
    out = [sp for cuts in cut_sets(a, max_segments)
           if (sp := make_segment_plan(a.graph, cuts)).segments.exact]
    _chains.setdefault(a, {})[max_segments] = out
    return out


def recompute_floor(a: Analysis) -> float:
    """A recompute ratio no plan of curve(a) goes below: on every chain, each segment but
    the last runs its forward at least twice (the first pass, then again before its
    backward: segments.schedule.operations), store-all schedules included. Needs only each
    chain's segment FLOPs: no segment or plan is built."""
    if not a.cuts:
        return float("inf")
    total = a.graph.forward_flops or 1.0
    floors = []
    for cuts in cut_sets(a):
        flops = segment_flops(a.graph, cuts)
        floors.append((2 * sum(flops) - flops[-1] - total) / total)
    return min(floors)


def recompute_of(p: SegmentPlan) -> float:
    """Extra forward FLOPs / forward FLOPs of a segmented plan's schedule."""
    total = sum(s.flops for s in p.segments.segments) or 1.0
    return (p.dry.forward_flops - total) / total


def _with_tree(sp: SegmentPlan, tree: Tree) -> SegmentPlan:
    """The chain's plan under another tree: only the dry run changes (pool, slots, masks
    and outputs depend on the segments alone)."""
    return replace(sp, tree=tree, dry=dry_run(sp.segments, tree))


def chain_curve(a: Analysis, sp: SegmentPlan, levels: int = LEVELS, scales: bool = True):
    """(planned bytes, recompute ratio, plan) of one chain over every memory level, exact
    by dry run; the chain's binary recursion first, then its store-all schedule."""
    sg = sp.segments
    states = [sg.state_bytes(i) for i in range(sg.m + 1)]
    # memory is discretised into `levels` steps of top/levels: several scales, so that the
    # small budgets are not rounded to a few coarse steps (`scales`)
    tops, t = [], sum(states)
    while scales and t > 2 * max(states):
        tops.append(t)
        t /= 8
    tops.append(2 * max(states) if scales else t)
    every = _with_tree(sp, store_all_tree(sg.m))  # levels round it away on long chains
    out = [(sp.planned_bytes, recompute_of(sp), sp), (every.planned_bytes, recompute_of(every),
                                                       every)]
    seen = {tuple(sorted(sp.tree.items())), tuple(sorted(every.tree.items()))}
    for t in tops:
        table = table_for(sp, t, levels)
        for level in range(levels + 1):
            if not math.isfinite(table.best(level)):
                continue
            tree = table.tree(level)
            key = tuple(sorted(tree.items()))
            if key in seen:
                continue
            seen.add(key)
            p = _with_tree(sp, tree)
            out.append((p.planned_bytes, recompute_of(p), p))
    return out


def curve(a: Analysis, levels: int = LEVELS, max_segments: int = MAX_SEGMENTS):
    """(planned bytes, recompute ratio, plan) of every chain over every memory level; the
    first is the finest chain's binary recursion (the ``recursive`` plan). The coarse chains
    at one scale only: at the small budgets that finer scales resolve, the finest chain's
    smaller pool wins (and each scale costs a table of m^2 x levels)."""
    if not chains(a, max_segments):
        return []
    fine, *coarse = chains(a, max_segments)
    with task("multi-level DP", total=1 + len(coarse), unit="chains") as done:
        points = chain_curve(a, fine, levels)
        done.advance()
        for sp in coarse:
            points += chain_curve(a, sp, levels, False)
            done.advance()
    return points


_least: weakref.WeakKeyDictionary[Analysis, SegmentPlan] = weakref.WeakKeyDictionary()


def least_memory(a: Analysis) -> SegmentPlan:
    """The least-memory schedule the DP finds over every chain; computed once per Analysis."""
    found = _least.get(a)
    if found is None:
        if not chains(a):
            raise PlanError(no_exact_chain(a))
        found = _least[a] = min((_least_on_chain(a, sp) for sp in chains(a)),
                                key=lambda p: p.planned_bytes)
    return found


def plan_for_budget(a: Analysis, budget_bytes: int) -> SegmentPlan:
    """The least-recompute segmented plan over every chain whose planned bytes fit;
    BudgetTooSmall naming the smallest reachable figure if none does."""
    fits = [p for sp in chains(a) if (p := _chain_for_budget(a, sp, budget_bytes))]
    if fits:
        return min(fits, key=lambda p: (recompute_of(p), p.planned_bytes))
    low = least_memory(a)
    raise BudgetTooSmall(f"budget {size(budget_bytes)} is below the smallest planned memory "
                         f"reachable even with several recomputations per node "
                         f"({size(low.planned_bytes)}); raise the budget")


def no_exact_chain(a: Analysis) -> str:
    """What to say where no chain sums its gradients as MXNet does: the finest chain's
    reason."""
    from mxmirror.planning.chains import inexact_note, segment_chain

    return (f"no segmented plan computes what training computes here: "
            f"{inexact_note(segment_chain(a))}")


def _chain_for_budget(a: Analysis, sp: SegmentPlan, budget_bytes: int) -> SegmentPlan | None:
    """One chain's least-recompute plan that fits, or None. Store-all (every segment's
    forward twice) is the least any tree on the chain recomputes; below it, the highest
    memory level of a table sized to the budget whose exact plan fits (bisected: a higher
    level allows more kept states, so more bytes)."""
    sg = sp.segments
    every = _with_tree(sp, store_all_tree(sg.m))
    if every.planned_bytes <= budget_bytes:
        return every
    avail = budget_bytes - fixed_bytes(sp)
    best = None
    if avail > 0:
        # as many levels as a table of about BUDGET_CELLS cells allows (it costs m^2 x
        # levels): short chains get fine levels, so rounding loses little
        levels = int(min(16 * LEVELS, max(LEVELS, BUDGET_CELLS / sg.m**2)))
        table = table_for(sp, avail, levels)
        lo, hi = table.min_level(), table.levels
        while lo is not None and lo <= hi:
            mid = (lo + hi) // 2
            p = _with_tree(sp, table.tree(mid))
            if p.planned_bytes <= budget_bytes:
                best, lo = p, mid + 1
            else:
                hi = mid - 1
    low = _least_on_chain(a, sp) if best is None else best
    return low if low.planned_bytes <= budget_bytes else None


def _least_on_chain(a: Analysis, sp: SegmentPlan) -> SegmentPlan:
    """The least-memory schedule the DP finds on one chain (lowest feasible level)."""
    sg = sp.segments
    table = table_for(sp, sum(sg.state_bytes(i) for i in range(sg.m + 1)))
    level = table.min_level()
    cands = [sp]
    if level is not None:
        cands.append(_with_tree(sp, table.tree(level)))
    return min(cands, key=lambda p: (p.planned_bytes, p.dry.forward_flops))
