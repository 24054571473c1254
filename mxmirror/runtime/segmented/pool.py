"""The memory the template executors of a segmented plan share: the pool's owner (a small
forward-only executor whose outputs are the pool's blocks and which holds every template's
BatchNorm statistics) and one array per slot name that every template binds a view of."""

from __future__ import annotations

from math import prod
from typing import Any

from mxmirror.errors import PlanError
from mxmirror.segments.cost import SegmentPlan, pool_blocks, statistics_groups
from mxmirror.segments.model import Segments


def pool_owner(plan: SegmentPlan, ctx: Any, raw: Any) -> Any:
    """The executor that owns the shared pool: forward-only, its outputs are the pool's
    blocks (segments.pool_blocks), and it holds every template's aux slots (with
    shared_exec MXNet takes every auxiliary state from the owner, by name)."""
    import mxnet as mx

    outs, shapes, types = [], {}, {}
    for i, b in enumerate(pool_blocks(plan.template_blocks)):
        if b:
            outs.append(mx.sym.zeros(shape=(b // 4,), dtype="float32", name=f"_pool{i}"))
    for j, (shape, dtype, names) in enumerate(statistics_groups(plan.segments)):
        if len(shape) != 1:
            raise PlanError(f"auxiliary state of shape {shape}: the segmented executor "
                            f"only shares 1-D (BatchNorm) auxiliary states")
        types.update({n: dtype for n in names if not n.startswith("_pad")})
        for i in range(0, len(names), 2):
            data = f"_d{j}_{i}"
            shapes[data] = (1, shape[0])
            types[data] = dtype
            outs.append(mx.sym.BatchNorm(
                mx.sym.Variable(data), mx.sym.Variable(f"{data}_g"),
                mx.sym.Variable(f"{data}_b"), mx.sym.Variable(names[i]),
                mx.sym.Variable(names[i + 1]), name=f"{data}_bn"))
    if not outs:
        return None
    sym = mx.sym.Group(outs)
    return raw(sym, ctx, grad_req="null", type_dict=types, **shapes)


def slot_arrays(sg: Segments, ctx: Any) -> dict:
    """One array per slot name, as large as its largest use: every template binds a
    view of it (shared_buffer), so none re-allocates (and MXNet logs nothing).

    Parameter values ("arg" slots: weights, labels, data) are left out: each template
    gets its own, of its exact shape, as MKL-DNN reorders a weight in place during an
    inference forward, which fails on a view (``Check failed: !is_view``). Their
    gradients are shared, and zeroed before each ``forward_backward``: an operator may
    leave an input's gradient unwritten (SoftmaxOutput's label), which would otherwise
    read what another template wrote there."""
    import mxnet as mx

    need: dict[str, tuple[int, str]] = {}
    for seg in sg.segments:
        shapes, types = sg.slot_shapes[seg.key], sg.slot_types[seg.key]
        req = sg.slot_req[seg.key]
        for name, key in seg.slots:
            if key[0] == "aux":
                continue
            names = [] if key[0] == "arg" else [name]
            if req.get(name) != "null" and (seg.key, name) not in sg.grad_slots:
                names.append("grad of " + name)
            for n in names:
                size, dtype = prod(shapes[name]), types[name]
                old = need.get(n)
                if old is not None and old[1] != dtype:
                    need[n] = (0, "")  # mixed dtypes: let MXNet allocate
                elif old is None or (old[1] and size > old[0]):
                    need[n] = (size, dtype)
    return {n: mx.nd.zeros((size,), ctx, dtype=dtype)
            for n, (size, dtype) in need.items() if size}
