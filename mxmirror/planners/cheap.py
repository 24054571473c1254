"""The paper's "drop bn-relu": recompute only cheap ops, keep expensive outputs."""

from __future__ import annotations

from ..analysis import Analysis
from .common import Choice, mirror_choice, segment_mirror


def cheap_mirror(a: Analysis) -> set[int]:
    return segment_mirror(a, [], only_cheap=True)


def choose(a: Analysis, budget_bytes: int | None = None) -> Choice:
    return mirror_choice(a, cheap_mirror(a))
