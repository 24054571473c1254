"""Paper Algorithm 3: segments by a byte budget, the budget searched around sqrt(x*y).

Every candidate plan is scored by the simulator (MXNet's own planner, no bind)
and the smallest is kept.
"""

from __future__ import annotations

from ..analysis import Analysis
from .common import Choice, best_of, candidates, mirror_choice


def choose(a: Analysis, budget_bytes: int | None = None) -> Choice:
    best = best_of(a, candidates(a))
    if best is None:
        return Choice(a.baseline, notes=("no cut lowers memory: the graph is left as it is",))
    return mirror_choice(a, best[1].mirror, best[1].cuts)
