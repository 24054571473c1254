"""A call signature's graph and plan: traced, planned and weighed once, what every call
of that signature shares (executor.choose_plan decides from it for each situation)."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from mxmirror.adapter.executor_memory import OwnMemory, beyond_cached_op
from mxmirror.adapter.symbol import SymbolText, load_mxnet, symbol_json
from mxmirror.api import plan as make_plan
from mxmirror.gluon.calls import is_float
from mxmirror.gluon.executor import retained_bytes
from mxmirror.gluon.inputs import CallArgs, dtype_name, nbytes
from mxmirror.ir import ops
from mxmirror.runtime.plan import MirrorExecution


class Spec(NamedTuple):
    """An array's shape and dtype, what nbytes and is_float read."""

    shape: tuple
    dtype: Any


@dataclass
class Signature:
    """The block's graph for one input signature, its plan and the bytes a call holds
    besides MXNet's figure."""

    shapes: dict[str, tuple]  # the inputs'
    graph: SymbolText  # the block's graph: its JSON, arguments and auxiliary states
    fmt: Any  # how the outputs nest (Gluon's _regroup)
    copies: int  # a call's input and output copies and their gradients
    plan: Any  # a Plan (its analysed graph let go), or None for policy none
    own: OwnMemory  # what the planned executor holds outside MXNet's figure that the
    # CachedOp does not (its nodes' structures, MKL-DNN layout copies)
    kept: int  # what plain Gluon keeps for a call between its forward and its backward
    random: bool  # the graph draws random numbers (Dropout): a forward run again draws others

    @property
    def rerunnable(self) -> bool:
        """Calls may share an executor, its forward run again as it ran: no random op, and
        MXNet's executor runs the plan."""
        return self.plan is not None and isinstance(self.plan.execution, MirrorExecution) \
            and not self.random

    @property
    def symbol(self) -> Any:
        """The block's graph as MXNet's Symbol (made again only where it is bound)."""
        return self.graph.symbol


def stdout_aside(on: bool) -> contextlib.AbstractContextManager:
    """stdout kept aside while `on`: MXNet prints a failed shape inference's arguments."""
    return contextlib.redirect_stdout(io.StringIO()) if on else contextlib.nullcontext()


def signature(block: Any, given: CallArgs, reqs: tuple, params: dict, policy: str,
              budget: Any, silent: bool = False) -> Signature:
    """The block's graph for the inputs `given` and its plan by `policy` (the smallest plan
    where no plan reaches `budget`: the bind hook's rule); `silent`: what MXNet prints of
    a failed shape inference kept from stdout."""
    mx = load_mxnet()
    from mxnet.gluon.block import _flatten

    syms = [mx.sym.var(n) for n in given.names]
    sargs, skwargs = given.rebuilt(syms)
    shapes = {n: x.shape for n, x in zip(given.names, given.arrays)}
    with stdout_aside(silent):
        heads, fmt = _flatten(block(*sargs, **skwargs), "output")
        symbol = _distinct_outputs(mx, heads)
        _, out_shapes, _ = symbol.infer_shape(**shapes)
    types = {n: dtype_name(x.dtype) for n, x in zip(given.names, given.arrays)}
    grad_req = dict(zip(given.names, reqs))
    arguments = symbol.list_arguments()
    for n in arguments + symbol.list_auxiliary_states():
        if n in params:
            types[n] = dtype_name(params[n].dtype)
            if n in arguments:
                grad_req[n] = params[n].grad_req
    _, out_types, _ = symbol.infer_type(**types)
    # the outputs by shape and dtype, not arrays: an array of a call's output allocated and
    # freed here, before the first step, raised glibc's mmap threshold, and the block's own
    # step then kept tens of MB more (measured: 8 MB output, peak RSS +40-60 MB)
    outs = [Spec(tuple(s), np.dtype(t)) for s, t in zip(out_shapes, out_types)]
    # a call's own arrays: the input copies and gradients, the output copies and the
    # gradient buffers of the float ones (calls.Call marks those)
    copies = nbytes(given.arrays) + nbytes(outs) + nbytes(
        [x for x, r in zip(given.arrays, reqs) if r != "null"]) + nbytes(
        [o for o in outs if is_float(o)])
    plan, own, kept = None, OwnMemory(0, 0, 0), 0
    if policy != "none":
        plan = make_plan(symbol, policy=policy, budget=budget, type_dict=types,
                         grad_req=grad_req, ctx=given.arrays[0].context, or_smallest=True,
                         **shapes)
        own, kept = beyond_cached_op(plan), retained_bytes(plan.graph)
        plan.release()  # kept for its binds, which read no analysed graph
    graph = SymbolText.of(symbol)
    random = any(ops.is_random(n["op"], n.get("attrs")) for n in json.loads(graph.text)["nodes"])
    return Signature(shapes, graph, fmt, copies, plan, own, kept, random)


def _distinct_outputs(mx: Any, heads: list) -> Any:
    """The block's outputs as one Symbol, each output its own array: an output given twice
    (or an input given back) is copied, as the CachedOp does, so that each gets its own
    gradient (MXNet's executor keeps one head gradient per array: the other's was lost)."""
    graph = json.loads(symbol_json(mx.sym.Group(heads)))
    seen = set()
    for i, (node, index, _) in enumerate(graph["heads"]):
        if (node, index) in seen or graph["nodes"][node]["op"] == "null":
            heads[i] = mx.sym.identity(heads[i])
        seen.add((node, index))
    return heads[0] if len(heads) == 1 else mx.sym.Group(heads)
