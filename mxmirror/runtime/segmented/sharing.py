"""MXNet's own executor bound beside a SegmentedExecutor (a bucket beside a segmented
default bucket): MXNet's simple_bind cannot take one as ``shared_exec``."""

from __future__ import annotations

from typing import Any

from mxmirror.ir.graph import normalize_grad_req
from mxmirror.runtime.binds import buffer_lends, leading_view, unhooked
from mxmirror.runtime.segmented.executor import SegmentedExecutor


def bind_sharing(symbol: Any, ctx: Any, shared_exec: SegmentedExecutor, grad_req: Any = "write",
                 type_dict: dict | None = None, shared_arg_names: list[str] | None = None,
                 shared_buffer: dict | None = None, **shapes: Any) -> Any:
    """MXNet's own executor for `symbol`, sharing a SegmentedExecutor's arrays as
    ``simple_bind(shared_exec=...)`` would: MXNet's simple_bind cannot take a
    SegmentedExecutor, so the arrays are gathered here (shared parameters and their
    gradients, auxiliary states by name, inputs from shared_buffer) and bound with
    MXNet's ``Symbol.bind``. Intermediate memory is not shared (no MXNet pool to share)."""
    import mxnet as mx
    import numpy as np

    names = symbol.list_arguments()
    arg_shapes, _, aux_shapes = symbol.infer_shape(**shapes)
    arg_types, _, aux_types = symbol.infer_type(**(type_dict or {}))
    arg_types = arg_types or [np.float32] * len(names)
    aux_types = aux_types or [np.float32] * len(aux_shapes)
    req = normalize_grad_req(names, grad_req, lambda _: "null")  # as MXNet's own bind
    shared = set(shared_arg_names or [])
    args, grads = {}, {}
    for name, shape, dtype in zip(names, arg_shapes, arg_types):
        mine = shared_exec.arg_dict.get(name)
        if name in shared and mine is not None and tuple(mine.shape) == tuple(shape):
            args[name], grads[name] = mine, shared_exec.grad_dict.get(name)
        elif buffer_lends(shared_buffer, name, shape, np.dtype(dtype).name):
            args[name] = leading_view(shared_buffer[name], shape)
        else:
            args[name] = mx.nd.zeros(shape, ctx, dtype=dtype)
            if shared_buffer is not None and name not in shared:
                shared_buffer[name] = args[name]
        if req[name] != "null" and grads.get(name) is None:
            grads[name] = mx.nd.zeros(shape, ctx, dtype=dtype)
    aux = {}
    for name, shape, dtype in zip(symbol.list_auxiliary_states(), aux_shapes, aux_types):
        mine = shared_exec.aux_dict.get(name)
        aux[name] = mine if mine is not None and tuple(mine.shape) == tuple(shape) else \
            mx.nd.zeros(shape, ctx, dtype=dtype)
    return unhooked("bind")(symbol, ctx, args, args_grad=grads, grad_req=req, aux_states=aux)


def mxnet_bind(original: Any, symbol: Any, ctx: Any, **kwargs: Any) -> Any:
    """MXNet's own ``simple_bind``/``bind`` (`original`). A SegmentedExecutor as shared_exec
    (a bucket bound beside a segmented default bucket) is not MXNet's: bind() drops it (its
    arrays are given), simple_bind shares its arrays through bind_sharing."""
    shared = kwargs.get("shared_exec")
    if not isinstance(shared, SegmentedExecutor):
        return original(symbol, ctx, **kwargs)
    if "args" in kwargs:
        return original(symbol, ctx, **{**kwargs, "shared_exec": None})
    kwargs = {k: v for k, v in kwargs.items() if k not in ("stype_dict", "group2ctx")}
    return bind_sharing(symbol, ctx, **kwargs)
