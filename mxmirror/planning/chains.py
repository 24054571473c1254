"""The chain of segments over the candidate cuts: what the segmented strategies cut."""

from __future__ import annotations

import math

from mxmirror.planning.analysis import Analysis
from mxmirror.segments.cost import SegmentPlan, make_segment_plan
from mxmirror.segments.cuts import chain_cuts

# ----------------------------------------------------------------- segmented strategies
MAX_SEGMENTS = 400  # the multi-level DP is O(m^2) numpy steps: keep m moderate


def finest_cuts(a: Analysis, max_segments: int | None = None) -> list[int]:
    """Op positions of every candidate cut (at most max_segments: every k-th)."""
    cuts = a.cuts
    if max_segments is not None and len(cuts) >= max_segments:
        stride = math.ceil(len(cuts) / (max_segments - 1))  # a whole stride keeps the
        cuts = cuts[stride - 1::stride]  # period of repeated blocks (LSTM steps) intact
    return chain_cuts(a.graph, [c.pos for c in cuts])


def segment_chain(a: Analysis, max_segments: int | None = None) -> SegmentPlan:
    """The chain over every candidate cut (at most max_segments: every k-th), binary tree."""
    return make_segment_plan(a.graph, finest_cuts(a, max_segments))
