"""Memory a training bind needs besides its planned intermediates, and what a device has free.

``resident_bytes``: arguments, argument gradients and aux states (MXNet allocates
them outside its memory plan). ``auto_budget``: the ``auto`` policy's budget, the
free memory of the bind's context less the resident bytes and a margin.
"""

from __future__ import annotations

import os
from typing import Any

from .errors import PlanError
from .graph import AUX, Graph

MARGIN_FRACTION = 0.10  # of the free memory: allocator rounding, workspaces, other arrays
MARGIN_MIN_BYTES = 64 * 2**20


def resident_bytes(graph: Graph) -> tuple[int, int, int]:
    """(arguments, argument gradients, aux states) in bytes, at their real dtypes."""
    args = grads = aux = 0
    for n in graph.nodes:
        if not n.is_variable:
            continue
        size = n.out_bytes(0)
        if n.kind == AUX:
            aux += size
        else:
            args += size
            if n.grad_req != "null":
                grads += size
    return args, grads, aux


def free_bytes(ctx: Any = None) -> tuple[int, str]:
    """Free memory of a context (default: the CPU) and where the figure came from."""
    kind = getattr(ctx, "device_type", "cpu")
    if kind == "gpu":
        from .mxnet_adapter import load_mxnet

        device = getattr(ctx, "device_id", 0)
        free, _total = load_mxnet().context.gpu_memory_info(device)
        return int(free), f"free memory of gpu({device}), mx.context.gpu_memory_info"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available system memory, MemAvailable"
    except OSError:
        pass
    try:
        pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        raise PlanError("cannot read the free memory of this machine: give policy 'auto' a "
                        "budget (MXMIRROR_BUDGET, --budget, budget=)") from None
    return int(pages), "free system memory, sysconf"


def auto_budget(graph: Graph, ctx: Any = None) -> tuple[int, str]:
    """The bytes the planned intermediates may take on `ctx`, and how they were found.

    free - (arguments + gradients + aux states) - margin (MARGIN_FRACTION of the free
    memory, at least MARGIN_MIN_BYTES); at least one byte (then the smallest plan is used).
    """
    free, source = free_bytes(ctx)
    resident = sum(resident_bytes(graph))
    margin = max(int(free * MARGIN_FRACTION), MARGIN_MIN_BYTES)
    budget = max(free - resident - margin, 1)
    mb = 2**20
    return budget, (f"auto: {source} {free / mb:.0f} MB - arguments, gradients and aux "
                    f"states {resident / mb:.0f} MB - margin {margin / mb:.0f} MB")
