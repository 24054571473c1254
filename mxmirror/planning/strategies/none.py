"""No plan: MXNet's default in-place + sharing, nothing recomputed."""

from __future__ import annotations

from mxmirror.planning.analysis import Analysis
from mxmirror.planning.choice import Choice


def choose(a: Analysis, budget_bytes: int | None = None) -> Choice:
    return Choice(a.baseline)
