"""The chain of segments over the candidate cuts: what the segmented strategies cut.

Each segment costs the segmented executor a template run whenever its forward runs: the
copies of its boundary values in and out, its boundary losses, an executor call. A segment
of a few operators does almost no work for that (an LSTM step cut between its cell state
and its output leaves h = o * tanh(c) on its own: half the chain). So a segment of fewer
than ``MIN_OPS`` operators joins a neighbour, where the chain's plan (its binary recursion)
then neither recomputes more nor needs more bytes, and sums every gradient as MXNet does
(Segments.exact): else the chain keeps every cut. A chain whose sums are not all MXNet's
is never run (``inexact_note``; dp.chains).
"""

from __future__ import annotations

import math
import weakref

from mxmirror.planning.analysis import Analysis
from mxmirror.segments.cost import SegmentPlan, make_segment_plan
from mxmirror.segments.cuts import chain_cuts, segment_flops
from mxmirror.segments.schedule import binary_tree, forward_runs

# ----------------------------------------------------------------- segmented strategies
MAX_SEGMENTS = 400  # the multi-level DP is O(m^2) numpy steps: keep m moderate
MIN_OPS = 3  # a segment of fewer operators joins a neighbour where the plan does not grow

_finest: weakref.WeakKeyDictionary[Analysis, dict] = weakref.WeakKeyDictionary()


def finest_cuts(a: Analysis, max_segments: int | None = None) -> list[int]:
    """Op positions of every candidate cut (at most max_segments: every k-th), with the
    segments of fewer than MIN_OPS operators joined where that plan is no worse
    (joined_cuts); computed once per Analysis."""
    return _chain(a, max_segments)[0]


def segment_chain(a: Analysis, max_segments: int | None = None) -> SegmentPlan:
    """The chain over finest_cuts, binary tree."""
    cuts, plan = _chain(a, max_segments)
    return plan if plan is not None else make_segment_plan(a.graph, cuts)


def _chain(a: Analysis, max_segments: int | None) -> tuple[list[int], SegmentPlan | None]:
    """finest_cuts, and the chain's plan where deciding on the join built it."""
    found = _finest.get(a, {}).get(max_segments)
    if found is not None:
        return found
    cuts = a.cuts
    if max_segments is not None and len(cuts) >= max_segments:
        stride = math.ceil(len(cuts) / (max_segments - 1))  # a whole stride keeps the
        cuts = cuts[stride - 1::stride]  # period of repeated blocks (LSTM steps) intact
    every = chain_cuts(a.graph, [c.pos for c in cuts])
    found = (every, None)
    joined = joined_cuts(a, every)
    # recompute first (segment FLOPs only), then the bytes of both plans and their sums
    if joined != every and _binary_recompute(a, joined) <= _binary_recompute(a, every):
        plan, plain = make_segment_plan(a.graph, joined), make_segment_plan(a.graph, every)
        if plan.planned_bytes <= plain.planned_bytes and _exact_sums(plan):
            found = (joined, plan)
    _finest.setdefault(a, {})[max_segments] = found
    return found


def joined_cuts(a: Analysis, cuts: list[int]) -> list[int]:
    """`cuts` (chain_cuts) with every segment of fewer than MIN_OPS operators joined to a
    neighbour: of the cuts around it, the one more bytes cross is dropped (the one before
    on a tie, the only one at either end of the chain)."""
    crossing = {c.pos: c.bytes for c in a.cuts}
    last = len(a.graph.op_order) - 1
    out = list(cuts)
    i = 0  # segment i (0-based) runs after out[i - 1] up to out[i]
    while out and i <= len(out):
        lo = out[i - 1] if i else -1
        hi = out[i] if i < len(out) else last
        if hi - lo >= MIN_OPS:
            i += 1
            continue
        before = i > 0 and (i == len(out)
                            or crossing.get(out[i - 1], 0) >= crossing.get(out[i], 0))
        if before:  # joined to the segment before, which is looked at again
            del out[i - 1]
            i -= 1
        else:
            del out[i]
    return out


def _exact_sums(plan: SegmentPlan) -> bool:
    """Whether the plan sums every gradient it splits with MXNet's own expression
    (Segments.exact: grad_sums, value_sums): a joined segment holding several uses of a
    weight or value may not, and the join must not make a plan that trains differently
    from MXNet."""
    return plan.segments.exact


def _binary_recompute(a: Analysis, cuts: list[int]) -> float:
    """The recompute ratio of the chain's binary recursion, from its segments' FLOPs."""
    flops = segment_flops(a.graph, cuts)
    total = sum(flops) or 1.0
    runs = forward_runs(binary_tree(len(flops)), len(flops))
    return (sum(r * f for r, f in zip(runs, flops)) - total) / total


def inexact_note(plan: SegmentPlan) -> str:
    """Why the segmented executor would not compute the plan's gradients as MXNet does (a
    sum it splits that no combination makes MXNet's: Segments.exact), naming the first
    gradient; '' where it would."""
    sg = plan.segments
    graph = sg.graph
    weights = [w for w, (_, exact) in sg.weight_sums.items() if not exact]
    if weights:
        return (f"the segments would not sum the gradient of {weights[0]} as MXNet does "
                f"(a weight read in several segments, grad_sums)")
    for e, why in sg.value_sums.inexact.items():
        return (f"the segments would not sum the gradient of {graph.nodes[e[0]].name} as "
                f"MXNet does: {why}")
    return ""
