"""The paper's Algorithm 3: keep a cut once the bytes dropped since the last one pass a
budget B, around B = sqrt(x*y), and the mirror set a list of cuts gives."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mxmirror.planning.analysis import Analysis, Cut, Score


@dataclass(frozen=True)
class Candidate:
    """One point of Algorithm 3's budget grid: the cuts it keeps and the mirror set."""

    budget: float
    cuts: list[Cut]
    mirror: set[int] = field(hash=False)


def segment_mirror(a: Analysis, cuts: list[Cut], only_cheap: bool = False,
                   mirror_losses: bool = True) -> set[int]:
    """Mirror everything except the values crossing the chosen cuts (and blockers).

    Recomputing a (deterministic) loss lets its backward read recomputed logits
    instead of keeping them: large for the per-step losses of an unrolled LSTM,
    a loss for a single small head. Callers choose by simulation.
    """
    keep: set[int] = set() if mirror_losses else set(a.losses)
    for c in cuts:
        keep |= c.keep
    return set(a.cheap_recomputable if only_cheap else a.recomputable).difference(keep)


def greedy_cuts(a: Analysis, budget: float) -> list[Cut]:
    """Paper Algorithm 3: keep a cut once the dropped bytes since the last one pass budget."""
    by_pos = {c.pos: c for c in a.cuts}
    chosen = []
    acc = 0
    for i, b in enumerate(a.node_bytes):
        acc += b
        c = by_pos.get(i)
        if c is not None and acc > budget:
            chosen.append(c)
            acc = 0
    return chosen


def paper_budget(a: Analysis) -> float:
    """The paper's B = sqrt(x*y) of Algorithm 3. x: the bytes kept with every cut taken
    (B = 0), y: the largest segment between them."""
    every = greedy_cuts(a, 0)
    x = sum(c.bytes for c in every)
    seg, y = 0, 0
    cut_pos = {c.pos for c in every}
    for i, b in enumerate(a.node_bytes):
        seg += b
        if i in cut_pos:
            y, seg = max(y, seg), 0
    y = max(y, seg)
    return math.sqrt(max(x, 1) * max(y, 1))


def grid_cuts(a: Analysis, steps: int = 9, spread: float = 4.0) -> list[tuple[float, list[Cut]]]:
    """Algorithm 3's (budget, cuts) for `steps` budgets around paper_budget, `spread` times
    below and above it. Cuts only: no simulation."""
    if not a.cuts:
        return []
    b0 = paper_budget(a)
    budgets = [b0 * spread ** (2 * k / (steps - 1) - 1) for k in range(steps)]
    return [(b, greedy_cuts(a, b)) for b in budgets]


def candidates(a: Analysis, steps: int = 9, spread: float = 4.0) -> list[Candidate]:
    """Algorithm 3's plans for grid_cuts' budgets. Whether losses are recomputed is decided
    once, by simulation at the paper's budget itself."""
    grid = grid_cuts(a, steps, spread)
    if not grid:
        return []
    mid = greedy_cuts(a, paper_budget(a))
    with_losses = a.score(segment_mirror(a, mid, mirror_losses=True)).planned_bytes
    without = a.score(segment_mirror(a, mid, mirror_losses=False)).planned_bytes
    mirror_losses = with_losses <= without
    return [Candidate(b, chosen, segment_mirror(a, chosen, mirror_losses=mirror_losses))
            for b, chosen in grid]


def best_of(a: Analysis, cands: list[Candidate]) -> tuple[Score, Candidate] | None:
    """The candidate of least simulated memory (the first of equals)."""
    best = None
    for c in cands:
        s = a.score(c.mirror)
        if best is None or s.planned_bytes < best[0].planned_bytes:
            best = (s, c)
    return best
