"""Paper Algorithm 3: segments by a byte budget, the budget searched around sqrt(x*y).

Every candidate plan is scored by the simulator (MXNet's own planner, no bind)
and the smallest is kept.
"""

from __future__ import annotations

from mxmirror.planning.algorithm3 import best_of, candidates
from mxmirror.planning.analysis import Analysis
from mxmirror.planning.choice import Choice, mirror_choice


def choose(a: Analysis, budget_bytes: int | None = None) -> Choice:
    best = best_of(a, candidates(a))
    if best is None:
        return Choice(a.baseline, notes=("no cut lowers memory: the graph is left as it is",))
    return mirror_choice(a, best[1].mirror, best[1].cuts)
