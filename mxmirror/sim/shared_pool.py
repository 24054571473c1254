"""What a bind that shares another executor's memory allocates anew.

A BucketingModule binds every further bucket with ``shared_exec`` (the default bucket's
executor): MXNet's ``GraphExecutor::InitDataEntryMemory`` (src/executor/graph_executor.cc)
then takes each storage block it needs, largest first, from that executor's pool (the
smallest free array at least as large), allocates only what does not fit, and appends what
it allocates to the pool. So a further bucket costs the process only its blocks that do not
fit: a plan that saves a bucket nothing there only adds its recomputation.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable


def fit(pool: Iterable[int], needed: Iterable[int]) -> tuple[list[int], list[int]]:
    """The arrays of the shared `pool` (bytes each) a bind needing blocks of `needed` bytes
    takes, and the blocks it allocates anew, as InitDataEntryMemory matches them."""
    free = sorted(pool)
    taken, new = [], []
    for size in sorted(needed, reverse=True):
        i = bisect.bisect_left(free, size)
        if i < len(free):
            taken.append(free.pop(i))
        else:
            new.append(size)
    return taken, new
