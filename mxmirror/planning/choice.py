"""What a strategy returns (``Choice``) and what planning returns (``Decision``: a choice
made safe, with the baseline and every note); the Plan a user binds is built from it."""

from __future__ import annotations

from dataclasses import dataclass

from mxmirror.planning.analysis import Analysis, Cut, Score
from mxmirror.segments.cost import SegmentPlan


@dataclass(frozen=True)
class Choice:
    """What a strategy chose and what it costs.

    ``segments`` is None when MXNet's own executor runs the choice (``score.recomputed_ids`` is
    then the set of nodes it recomputes once); otherwise the segment plan the segmented
    executor runs (``score.recomputed_ids``: the nodes whose forward runs more than once).
    """

    score: Score
    checkpoints: tuple[str, ...] = ()
    segments: SegmentPlan | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    """A policy's choice kept from ever being worse than no plan (planning.decide), the
    baseline it is measured against, and every note on it (what the logs say)."""

    choice: Choice
    baseline_bytes: int
    notes: tuple[str, ...] = ()
    # arguments, their gradients, aux states: what stays whatever the plan (kept with the
    # plan, so that what it saves of the whole is said without reading the graph again)
    resident_bytes: tuple[int, int, int] = (0, 0, 0)
    # the storage blocks of MXNet's executor unplanned and with the plan (empty where MXNet's
    # executor does not run it): what a bind sharing another's memory adds (sim/shared_pool)
    baseline_blocks: tuple[int, ...] = ()
    planned_blocks: tuple[int, ...] = ()


def mirror_choice(a: Analysis, mirror: set[int], cuts: list[Cut] = ()) -> Choice:
    """A Choice that recomputes `mirror` on MXNet's own executor."""
    return Choice(a.score(mirror), tuple(a.checkpoint_names(list(cuts))))


def segmented_choice(a: Analysis, sp: SegmentPlan, notes: tuple[str, ...] = ()) -> Choice:
    """A Choice run by the segmented executor."""
    graph = a.graph
    F = graph.forward_flops or 1.0
    sg = sp.segments
    names: list[str] = []
    for i in range(1, sg.m):
        names += [graph.nodes[e[0]].name for e in sorted(sg.crossing[i])]
    ckpts = tuple(dict.fromkeys(names))
    recomputed = frozenset(nid for seg in sg.segments for nid in seg.nodes
                           if sp.dry.runs[seg.index - 1] > 1)
    score = Score(sp.planned_bytes, (sp.dry.forward_flops - F) / F, recomputed)
    return Choice(score, ckpts, sp, notes)
