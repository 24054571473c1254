"""The paper's recursive plan (Section 4.2, k = 1): O(log n) memory, O(n log n) recompute.

The forward graph is cut at every candidate cut into a chain of segments; the
backward pass splits every range of segments at its midpoint, keeps only the
state there, and recurses (segments.binary_tree). Each segment's forward is
run about log2(n) times, so this needs the segmented executor (MXNet's
attribute mirroring recomputes a node at most once). Where the chain's segments would not
sum every gradient as MXNet does (Segments.exact), the one-recompute plan is used.
"""

from __future__ import annotations

from mxmirror.planning.analysis import Analysis
from mxmirror.planning.budget_front import one_recompute_instead
from mxmirror.planning.chains import inexact_note, segment_chain
from mxmirror.planning.choice import Choice, segmented_choice


def choose(a: Analysis, budget_bytes: int | None = None) -> Choice:
    sp = segment_chain(a)
    why = inexact_note(sp)
    if why:
        return one_recompute_instead(a, budget_bytes, why)
    return segmented_choice(a, sp, (f"{sp.segments.m} segments, binary recursion: each "
                                    f"segment's forward runs at most "
                                    f"{max(sp.dry.runs, default=0)} times",))
