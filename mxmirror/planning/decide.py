"""A strategy's choice made safe: never worse than no plan, and segmented only where that
is below the best one-recompute plan for the same budget too."""

from __future__ import annotations

from mxmirror.ir.graph import resident_bytes
from mxmirror.log import mb_text
from mxmirror.planning import budget_front
from mxmirror.planning.analysis import Analysis
from mxmirror.planning.choice import Choice, Decision
from mxmirror.planning.registry import FROM_FRONT, STRATEGIES


def decide(analysis: Analysis, name: str, budget_bytes: int | None,
           never_worse: bool = True) -> Decision:
    """Strategy `name`'s choice kept from being worse than no plan (and, with
    `never_worse`, segmented only below the best one-recompute plan), with the baseline
    bytes and the notes. ``never_worse=False`` keeps a segmented choice even where one
    recomputation is smaller (studies of the segmented executor)."""
    choice = STRATEGIES[name](analysis, budget_bytes)
    base = analysis.baseline
    notes = list(choice.notes)
    if never_worse and choice.segments is not None and name not in FROM_FRONT:
        choice, why = _segmented_or_one_recompute(analysis, choice, budget_bytes)
        if why:  # what is used, then why; the notes on the plan not used go
            notes = [why]
    recomputes = bool(choice.score.recomputed_ids)
    if choice.segments is not None and not recomputes:
        notes.append("nothing is recomputed: the graph is left as it is")
        choice = Choice(base)
    elif recomputes and choice.score.planned_bytes >= base.planned_bytes:
        notes.append(f"no recomputation lowers memory here (the {name} plan: "
                     f"{mb_text(choice.score.planned_bytes / 2**20, 0)}, no plan: "
                     f"{mb_text(base.planned_bytes / 2**20, 0)}): the graph is left as it is")
        choice = Choice(base)
    unplanned = analysis.blocks(frozenset())
    planned = (() if choice.segments is not None else analysis.blocks(choice.score.recomputed_ids)
               if choice.score.recomputed_ids else unplanned)
    return Decision(choice, base.planned_bytes, tuple(notes), resident_bytes(analysis.graph),
                    unplanned, planned)


def _segmented_or_one_recompute(a: Analysis, segmented: Choice,
                                budget_bytes: int | None) -> tuple[Choice, str]:
    """Never worse: a segmented choice only below both no plan and the best one-recompute
    plan for the same budget; otherwise that plan (no recomputation: plain bind), and why."""
    alt = budget_front.one_recompute(a, budget_bytes)
    seg_bytes = segmented.score.planned_bytes
    if seg_bytes < min(alt.score.planned_bytes, a.baseline.planned_bytes):
        return segmented, ""
    which = "the one-recompute plan" if alt.score.recomputed_ids else "no plan"
    return alt, (f"{which} is used: the segmented plan ({seg_bytes / 2**20:.2f} MB predicted, "
                 f"{segmented.score.recompute_ratio:.2f}x recompute) is not below {which} "
                 f"({alt.score.planned_bytes / 2**20:.2f} MB)")
