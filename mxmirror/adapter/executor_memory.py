"""The MKL-DNN layout copies a bound executor keeps outside MXNet's figure, in this process.

With MKL-DNN on, MXNet's executor runs an op without an MKL-DNN kernel by storage fallback
and keeps a default-layout copy of each input arriving in MKL-DNN's blocked layout for the
executor's life (sim/storage_fallback.py counts them on the training graph). A mirror copy of
such an op keeps copies of its own, so a plan can hold more than its figure says; plain
Gluon's CachedOp frees its copies after each op. Without MKL-DNN, or with no Convolution
(the only source of blocked values), there are none.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

from mxmirror.adapter.symbol import load_mxnet
from mxmirror.ir import ops
from mxmirror.sim import training_graph
from mxmirror.sim.storage_fallback import fallback_bytes


@cache
def mkldnn_on() -> bool:
    """MXNet runs MKL-DNN kernels in this process (built with it, not turned off at start)."""
    return load_mxnet().runtime.Features().is_enabled("MKLDNN") and \
        os.environ.get("MXNET_MKLDNN_ENABLED") != "0"


def _has_blocked_values(plan: Any) -> bool:
    return mkldnn_on() and any(op in ops.MKLDNN_BLOCKED for _, op in plan.nodes)


def executor_own_bytes(plan: Any) -> int:
    """The layout copies the plan's bound executors keep: the one, or a segmented plan's
    template executors."""
    if not _has_blocked_values(plan):
        return 0
    return sum(fallback_bytes(tg) for tg in plan.executor_graphs())


def unplanned_own_bytes(plan: Any) -> int:
    """The layout copies an unplanned bound executor of the plan's graph keeps."""
    if not _has_blocked_values(plan):
        return 0
    return fallback_bytes(training_graph.build(plan.graph, set()))
