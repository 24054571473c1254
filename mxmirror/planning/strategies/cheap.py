"""The paper's "drop bn-relu": recompute only cheap ops, keep expensive outputs."""

from __future__ import annotations

from dataclasses import replace

from mxmirror.planning.algorithm3 import segment_mirror
from mxmirror.planning.analysis import Analysis
from mxmirror.planning.choice import Choice, mirror_choice


def cheap_mirror(a: Analysis) -> set[int]:
    return segment_mirror(a, [], only_cheap=True)


def choose(a: Analysis, budget_bytes: int | None = None) -> Choice:
    mirror = cheap_mirror(a)
    if not mirror:
        return replace(mirror_choice(a, mirror), notes=(
            "no cheap op (activation, BatchNorm, elementwise, ...) can be recomputed here",))
    choice = mirror_choice(a, mirror)
    if choice.score.planned_bytes >= a.baseline.planned_bytes:  # the registry keeps no plan
        return replace(choice, notes=(
            f"recomputing the {len(mirror)} cheap ops would not lower memory: MXNet's in-place "
            f"ops and memory sharing already reuse most of what dropping their outputs would "
            f"free, and the recomputed copies need memory of their own",))
    return choice
