"""The arrays a user reads and writes through a SegmentedExecutor: arguments, their
gradients, auxiliary states and outputs, taken from the caller, a shared executor or a
shared buffer as MXNet's bind takes them, else allocated. The template executors only
copy into and out of them (or bind them, where a slot reads one variable throughout)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mxmirror.ir.graph import Graph
from mxmirror.runtime.binds import buffer_lends, leading_view


@dataclass
class UserArrays:
    """What the Executor interface exposes, by name."""

    arg_dict: dict
    grad_dict: dict  # None where grad_req is null
    aux_dict: dict
    outputs: list  # one per graph head, in the symbol's order
    grad_req: dict[str, str]  # per argument: write, add or null


def user_arrays(symbol: Any, graph: Graph, ctx: Any, args: dict | None = None,
                args_grad: dict | None = None, aux_states: dict | None = None,
                shared_exec: Any = None, shared_arg_names: list[str] | None = None,
                shared_buffer: dict | None = None) -> UserArrays:
    """The user's arrays for `symbol` (`graph` is its IR: shapes, dtypes, grad_req), taken
    as ``simple_bind``/``bind`` would: given arrays first, then the shared executor's
    (shared_arg_names), then an input lent by shared_buffer; a new input is added to it."""
    import mxnet as mx

    var = {n.name: n for n in graph.nodes if n.is_variable}
    shared_arg_names = set(shared_arg_names or [])
    sx = shared_exec
    arg_dict, grad_dict, aux_dict, reqs = {}, {}, {}, {}
    for name in symbol.list_arguments():
        nd = var[name]
        shape, dtype = nd.shapes[0], nd.dtypes[0]
        if args is not None and args.get(name) is not None:
            arr = args[name]
        elif sx is not None and name in shared_arg_names and name in sx.arg_dict:
            arr = sx.arg_dict[name]
        elif buffer_lends(shared_buffer, name, shape, dtype):
            arr = leading_view(shared_buffer[name], shape)
        else:
            arr = mx.nd.zeros(shape, ctx, dtype=dtype)
            if shared_buffer is not None and name not in shared_arg_names:
                shared_buffer[name] = arr
        arg_dict[name] = arr
        req = nd.grad_req if nd.grad_req in ("write", "add", "null") else "write"
        reqs[name] = req
        if req == "null":
            grad_dict[name] = None
        elif args_grad is not None and args_grad.get(name) is not None:
            grad_dict[name] = args_grad[name]
        elif sx is not None and name in shared_arg_names and \
                sx.grad_dict.get(name) is not None:
            grad_dict[name] = sx.grad_dict[name]
        else:
            grad_dict[name] = mx.nd.zeros(shape, ctx, dtype=dtype)
    for name in symbol.list_auxiliary_states():
        nd = var[name]
        if aux_states is not None and aux_states.get(name) is not None:
            aux_dict[name] = aux_states[name]
        elif sx is not None and name in getattr(sx, "aux_dict", {}):
            aux_dict[name] = sx.aux_dict[name]
        else:
            aux_dict[name] = mx.nd.zeros(nd.shapes[0], ctx, dtype=nd.dtypes[0])
    outputs = [mx.nd.zeros(graph.nodes[h[0]].shapes[h[1]], ctx,
                           dtype=graph.nodes[h[0]].dtypes[h[1]]) for h in graph.heads]
    return UserArrays(arg_dict, grad_dict, aux_dict, outputs, reqs)


def assign(dst: Any, value: Any) -> None:
    """``dst[:] = value`` for an NDArray or anything MXNet can broadcast from."""
    import mxnet as mx

    if isinstance(value, mx.nd.NDArray):
        value.copyto(dst)
    else:
        dst[:] = value
