"""Which device a context is, what it has free, and the ``auto`` policy's budget: the free
memory of the bind's
context less the resident arrays (``ir.graph.resident_bytes``: arguments, argument
gradients and aux states, which MXNet allocates outside its memory plan) and a margin.
"""

from __future__ import annotations

import os
from typing import Any

from mxmirror.adapter.symbol import load_mxnet
from mxmirror.errors import PlanError
from mxmirror.ir.graph import Graph, resident_bytes

MARGIN_FRACTION = 0.10  # of the free memory: allocator rounding, workspaces, other arrays
MARGIN_MIN_BYTES = 64 * 2**20


def on_gpu(ctx: Any) -> bool:
    """`ctx` (an MXNet Context, or None: a CPU) is a GPU."""
    return getattr(ctx, "device_type", "cpu") == "gpu"


def free_bytes(ctx: Any = None) -> tuple[int, str]:
    """Free memory of a context (default: the CPU) and where the figure came from."""
    if on_gpu(ctx):
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


def release_freed() -> None:
    """Give the process's freed heap memory back to the system (glibc's malloc_trim; a
    no-op elsewhere), once MXNet's engine has freed what was let go. An executor's arrays
    are allocated on the caller's thread, so in glibc's main arena, which the engine
    thread's later allocations (plain Gluon's arrays) do not reuse: let go, they stay
    resident (measured: ResNet-50, 8 calls per record(), scripts/gluon_memory_notes.py)."""
    load_mxnet().nd.waitall()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _malloc_trim() -> Any:
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
