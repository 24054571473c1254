"""The Pareto front of (planned bytes, recompute) over every plan family, once per graph.

The ``budget`` and ``auto`` policies answer any byte budget from this one front:
the point of least recompute whose planned bytes fit. Because the front is fixed
for the analysed graph, a larger budget never gets more recompute, and a budget
is impossible only below the front's smallest point, which every error names.

Families (each scored by the simulator, recompute by the FLOP estimate):
``none``; ``cheap``; Algorithm 3's grid (``sqrt``: full and cheap-only segments,
and the sqrt policy's own pick); the ``search`` policy's chain-DP front and its
final plan; ``mixed``: a one-recompute plan (sqrt's and search's) kept for the
first part of the forward pass by FLOPs and cheap ops only (or nothing) after it,
which fills the gap between cheap (~0.01x) and full segments (~1x); and the
segmented plans (the multi-level DP's curve, whose first point is ``recursive``)
only where they are below no plan and below every one-recompute plan (the
registry's rule for segmented plans).

This module reads other strategies' results by design: it is the one place that
compares them.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

from mxmirror.errors import BudgetTooSmall
from mxmirror.log import size
from mxmirror.planning.algorithm3 import candidates, segment_mirror
from mxmirror.planning.analysis import Analysis
from mxmirror.planning.chains import finest_cuts
from mxmirror.planning.choice import Choice, mirror_choice, segmented_choice
from mxmirror.planning.dp import curve, recompute_floor
from mxmirror.planning.strategies import search, sqrt
from mxmirror.planning.strategies.cheap import cheap_mirror

MIXED_FRACTIONS = tuple(k / 8 for k in range(1, 8))


@dataclass(frozen=True)
class Point:
    """One plan on the front: what it costs and the family that reached it."""

    planned_bytes: int
    recompute_ratio: float
    policy: str
    choice: Choice


_fronts: weakref.WeakKeyDictionary[Analysis, list[Point]] = weakref.WeakKeyDictionary()
_one_points: weakref.WeakKeyDictionary[Analysis, list[Point]] = weakref.WeakKeyDictionary()


def budget_front(a: Analysis) -> list[Point]:
    """The Pareto front, by planned bytes ascending (recompute strictly descending);
    computed on first use per Analysis and kept with it."""
    found = _fronts.get(a)
    if found is None:
        found = _fronts[a] = pareto(all_points(a))
    return found


def least_recompute(a: Analysis, budget_bytes: int) -> Point | None:
    """The point of least recompute whose planned bytes fit, or None.

    The segmented plans (the costliest family to compute) are all below every
    one-recompute plan in bytes, and none recomputes less than dp.recompute_floor: where a
    one-recompute plan that fits recomputes less than that, it is the front's answer
    too, and the segmented family is not computed."""
    fits = [p for p in pareto(one_recompute_points(a)) if p.planned_bytes <= budget_bytes]
    if not (fits and fits[-1].recompute_ratio < recompute_floor(a)):
        fits = [p for p in budget_front(a) if p.planned_bytes <= budget_bytes]
    return fits[-1] if fits else None


def smallest_point(a: Analysis) -> Point:
    """The point of least planned bytes any family reaches."""
    return budget_front(a)[0]


def pareto(points: list[Point]) -> list[Point]:
    """Points no other point beats on both bytes and recompute (ties: fewer bytes first)."""
    out: list[Point] = []
    for p in sorted(points, key=lambda p: (p.planned_bytes, p.recompute_ratio)):
        if not out or p.recompute_ratio < out[-1].recompute_ratio:
            out.append(p)
    return out


def _point(policy: str, choice: Choice) -> Point:
    return Point(choice.score.planned_bytes, choice.score.recompute_ratio, policy, choice)


def quick_points(a: Analysis, sqrt_choice: Choice | None = None) -> list[Point]:
    """The one-recompute families that cost no search: no plan, cheap, Algorithm 3's grid
    (full and cheap-only segments) and the sqrt policy's own pick (`sqrt_choice`, when the
    caller has it already)."""
    pts = [_point("none", Choice(a.baseline)), _point("cheap", mirror_choice(a, cheap_mirror(a)))]
    for c in candidates(a, steps=17, spread=8.0):
        for m in (segment_mirror(a, c.cuts, only_cheap=True), c.mirror):
            pts.append(_point("sqrt", mirror_choice(a, m, c.cuts)))
    pts.append(_point("sqrt", sqrt_choice or sqrt.choose(a)))
    return pts


def one_recompute(a: Analysis, budget_bytes: int | None = None) -> Choice:
    """The best quick plan recomputing each node at most once (the registry's yardstick for
    segmented plans): the least recompute that fits the budget, else (or without a budget)
    the least memory."""
    pts = quick_points(a)
    fits = [p for p in pts if budget_bytes is not None and p.planned_bytes <= budget_bytes]
    if fits:
        return min(fits, key=lambda p: (p.recompute_ratio, p.planned_bytes)).choice
    return min(pts, key=lambda p: (p.planned_bytes, p.recompute_ratio)).choice


def one_recompute_instead(a: Analysis, budget_bytes: int | None, why: str) -> Choice:
    """The one-recompute plan where no segmented plan computes what training computes
    (`why`), which its notes say: a plan never changes what training computes."""
    return replace(one_recompute(a, budget_bytes),
                   notes=(f"the one-recompute plan is used: {why}",))


def all_points(a: Analysis) -> list[Point]:
    """Every family's plans (see the module docstring)."""
    pts = list(one_recompute_points(a))
    one_recompute = min(p.planned_bytes for p in pts)
    fine = finest_cuts(a)
    for k, (planned, _, sp) in enumerate(curve(a)):
        if planned < one_recompute:
            pts.append(_point("recursive" if k == 0 and sp.cuts == fine else "multilevel",
                              segmented_choice(a, sp)))
    return pts


def one_recompute_points(a: Analysis) -> list[Point]:
    """The families recomputing each node at most once (computed once per Analysis)."""
    found = _one_points.get(a)
    if found is not None:
        return found
    cheap = cheap_mirror(a)
    sqrt_choice = sqrt.choose(a)
    pts = quick_points(a, sqrt_choice)
    for _, _, cuts in search.checkpoint_front(a):
        for losses in (True, False):
            pts.append(_point("search", mirror_choice(
                a, segment_mirror(a, cuts, mirror_losses=losses), cuts)))
    search_choice = search.choose(a)
    pts.append(_point("search", search_choice))
    for choice in (sqrt_choice, search_choice):
        pts += _mixed(a, choice, cheap)
    _one_points[a] = pts
    return pts


def _mixed(a: Analysis, choice: Choice, cheap: set[int]) -> list[Point]:
    """The plan's recomputation over the first part of the forward pass (by FLOPs), cheap
    ops only or nothing after it."""
    full = choice.score.recomputed_ids
    if not full:
        return []
    flops = [n.flops for n in a.order]
    total = sum(flops) or 1.0
    at = {n.name: i for i, n in enumerate(a.order)}
    out = []
    acc, k = 0.0, 0
    for i, f in enumerate(flops):
        acc += f
        while k < len(MIXED_FRACTIONS) and acc >= MIXED_FRACTIONS[k] * total:
            k += 1
            head = {n for n in full if a.pos[n] <= i}
            tail = {n for n in cheap if a.pos[n] > i}
            kept = tuple(c for c in choice.checkpoints if at.get(c, -1) <= i)
            for m in (head | tail, head):
                out.append(_point("mixed", Choice(a.score(m), kept)))
    return out


def choose_within(a: Analysis, budget_bytes: int, or_smallest: bool = False) -> Choice:
    """The least-recompute Choice that fits; where none does, the smallest plan
    (``or_smallest``) or BudgetTooSmall naming the smallest figure and its policy."""
    if a.baseline.planned_bytes <= budget_bytes:
        return Choice(a.baseline)
    point = least_recompute(a, budget_bytes)
    if point is not None:
        note = f"least recompute within {budget_bytes / 2**20:.0f} MB: a {point.policy} plan"
    else:
        point = smallest_point(a)
        below = (f"budget {size(budget_bytes)} is below the smallest planned memory any "
                 f"policy reaches: {size(point.planned_bytes)} (the {point.policy} plan, "
                 f"{point.recompute_ratio:.2f}x recompute)")
        if not or_smallest:
            raise BudgetTooSmall(f"{below}; raise the budget")
        note = f"the smallest plan is used: {below}"
    c = point.choice
    return Choice(c.score, c.checkpoints, c.segments, (note,))
