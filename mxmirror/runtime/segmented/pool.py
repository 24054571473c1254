"""The template executors of a segmented plan, bound on one pool: the pool's owner (a
small forward-only executor whose outputs are the pool's blocks and which holds every
template's BatchNorm statistics), one array per slot name that every template binds a view
of, and the user's own arrays where a template's slot reads one variable throughout."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from math import prod
from typing import Any

from mxmirror.errors import PlanError
from mxmirror.runtime.binds import unhooked
from mxmirror.runtime.segmented.user_arrays import UserArrays
from mxmirror.segments.cost import SegmentPlan, pool_blocks, statistics_groups
from mxmirror.segments.model import Segment, Segments


@dataclass
class Templates:
    """A segmented plan's template executors and the arrays they are bound on."""

    owner: Any  # the pool's owner executor; None when nothing is pooled
    executors: dict[str, Any]  # template key -> MXNet executor, the largest first
    slot_buffer: dict  # slot name -> the array every template binds (a view of)
    user_bound: set = field(default_factory=set)  # (template, slot) on the user's array
    grad_bound: set = field(default_factory=set)  # ... adding into the user's gradient


def bind_templates(plan: SegmentPlan, ctx: Any, user: UserArrays) -> Templates:
    """One MXNet executor per template, the largest first, all on the pool's memory
    (``shared_exec``: the owner, else the first template). Activation slots of the same
    name share one array across templates (only one runs at a time and every slot is
    filled right before its executor runs); each bind gets a copy of that dict, as MXNet
    adds the arrays it allocates (parameter slots) to it."""
    import mxnet as mx

    sg = plan.segments
    raw = unhooked("simple_bind")
    owner = pool_owner(plan, ctx, raw)
    out = Templates(owner, {}, slot_arrays(sg, ctx))
    by_key = {seg.key: seg for seg in sg.segments}
    with whole_bulks():
        for key in plan.bind_order():
            seg = by_key[key]
            buf = _bind_buffer(seg, sg, user, out)
            req = dict(sg.slot_req[key], **{n: "add" for k, n in out.grad_bound if k == key})
            ex = raw(mx.sym.load_json(seg.json), ctx, grad_req=req,
                     type_dict=sg.slot_types[key], shared_exec=owner, shared_buffer=buf,
                     **sg.slot_shapes[key])
            owner = owner or ex
            out.executors[key] = ex
    return out


# MXNet bulks at most 15 nodes of a training executor into one engine op (read at bind).
# A template runs hundreds of times a step and each engine op costs the engine's
# scheduling: as one op per forward and per backward, the benchmark LSTM's recursive step
# pushes 706 template ops instead of 1411 (MXNet's profiler). The same kernels run in the
# same order either way; MXNET_EXEC_BULK_EXEC_TRAIN=0 still turns bulking off.
_BULK_LIMITS = ("MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD",
                "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD")


@contextmanager
def whole_bulks() -> Iterator[None]:
    """Executors bound inside run each forward and each backward as one engine op."""
    saved = {k: os.environ.get(k) for k in _BULK_LIMITS}
    os.environ.update({k: str(2**30) for k in _BULK_LIMITS})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _bind_buffer(seg: Segment, sg: Segments, user: UserArrays, templates: Templates) -> dict:
    """The shared_buffer one template binds with: the shared slots, and the user's own
    arrays for the parameter slots that read the same variable in every segment of the
    template (Segments.user_slots: no other segment's values take turns there), and
    the user's gradient where the template adds into it (Segments.grad_slots)."""
    import numpy as np

    buf = dict(templates.slot_buffer)
    shapes, types = sg.slot_shapes[seg.key], sg.slot_types[seg.key]
    for name, key in seg.slots:
        if (seg.key, name) not in sg.user_slots:
            continue
        arr = user.arg_dict[key[1]]
        if tuple(arr.shape) == tuple(shapes[name]) and \
                np.dtype(arr.dtype) == np.dtype(types[name]):
            buf[name] = arr
            templates.user_bound.add((seg.key, name))
            if (seg.key, name) in sg.grad_slots:
                # the template adds its gradient into the user's (grad_req 'add'; the
                # backward zeroes the user's first where it asked for 'write')
                buf["grad of " + name] = user.grad_dict[key[1]]
                templates.grad_bound.add((seg.key, name))
    return buf


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
