"""The paper's recursive plan (Section 4.2, k = 1): O(log n) memory, O(n log n) recompute.

The forward graph is cut at every candidate cut into a chain of segments; the
backward pass splits every range of segments at its midpoint, keeps only the
state there, and recurses (segments.binary_tree). Each segment's forward is
run about log2(n) times, so this needs the segmented executor (MXNet's
attribute mirroring recomputes a node at most once).
"""

from __future__ import annotations

from mxmirror.planning.analysis import Analysis
from mxmirror.planning.chains import segment_chain
from mxmirror.planning.choice import Choice, segmented_choice


def choose(a: Analysis, budget_bytes: int | None = None) -> Choice:
    sp = segment_chain(a)
    return segmented_choice(a, sp, (f"{sp.segments.m} segments, binary recursion: each "
                                    f"segment's forward runs at most "
                                    f"{max(sp.dry.runs, default=0)} times",))
