"""autograd's backward() as planned calls need it: wrapped once a PlannedBlock exists.

The Parameters of planned calls are off autograd's tape (block.py says why), so
backward() writes their gradients itself, after autograd's own backward and once the
callbacks of the planned calls it reached have queued their work; and it refuses, with
a PlanError before anything runs, what a pending planned call cannot take part in
(inputs whose gradients autograd would sum, autograd.grad, retain_graph).
"""

from __future__ import annotations

import json
from typing import Any

from mxmirror.adapter.symbol import load_mxnet
from mxmirror.errors import PlanError
from mxmirror.gluon.calls import all_calls, chain_lock, chains
from mxmirror.gluon.inputs import trained_variable

_originals: list = []  # autograd.backward, NDArray.backward, autograd.grad as MXNet has them


def wrap_backward() -> None:
    """Make autograd's backward() return only once the backward callbacks of the planned
    calls it reached have queued their work. Until then, an op the caller queues next
    that needs the callbacks' results and holds a temp-space resource (Adam's update in
    Trainer.step, the next forward) would deadlock MXNet 1.9.1's engine as autograd's own
    gradient sum does (block.py's docstring)."""
    mx = load_mxnet()
    if _originals:
        return
    originals = (mx.autograd.backward, mx.nd.NDArray.backward, mx.autograd.grad)
    _originals.extend(originals)

    def backward(heads: Any, head_grads: Any = None, retain_graph: bool = False,
                 *args: Any, **kwargs: Any) -> None:
        _refuse_unsupported("backward(retain_graph=True)", retain_graph)
        _check_input_uses(heads)
        originals[0](heads, head_grads, retain_graph, *args, **kwargs)
        _write_param_grads()

    def array_backward(self: Any, out_grad: Any = None, retain_graph: bool = False,
                       *args: Any, **kwargs: Any) -> None:
        _refuse_unsupported("backward(retain_graph=True)", retain_graph)
        _check_input_uses(self)
        originals[1](self, out_grad, retain_graph, *args, **kwargs)
        _write_param_grads()

    def grad(*args: Any, **kwargs: Any) -> Any:
        _refuse_unsupported("autograd.grad", True)
        return originals[2](*args, **kwargs)

    mx.autograd.backward = backward
    mx.nd.NDArray.backward = array_backward
    mx.autograd.grad = grad


def _refuse_unsupported(what: str, asked: Any) -> None:
    """A PlanError, before anything runs, for what a pending planned call cannot take part
    in: autograd.grad (the Parameters are off the tape, and nothing would wait for the
    calls' callbacks: measured, the engine stalls) and a backward that keeps the graph for
    another (a second backward would run the executors again on state already used)."""
    if not asked:
        return
    with chain_lock:
        pending = any(not call.written and not call.ran.is_set() for call in all_calls())
    if pending:
        raise PlanError(f"{what} is not supported through a planned Gluon call (PlannedBlock, "
                        f"or mxmirror run / enabled()); call backward() once per record(), "
                        f"or run the block unplanned (policy none) for this computation")


def _check_input_uses(heads: Any) -> None:
    """Before backward(): a planned call's input whose gradient autograd must sum with
    another (the input used by another recorded op, twice by one call, or by two calls)
    is refused. autograd's sum takes a temp-space resource and waits for the planned
    call's backward, whose executor ops then wait for the same resource: MXNet 1.9.1's
    engine deadlocks (block.py's docstring; measured with MXNET_CPU_TEMP_COPY=1)."""
    mx = load_mxnet()
    with chain_lock:
        if not any(call.bound.wants_input_grads and not call.written for call in all_calls()):
            return  # the usual case: no planned call was given an input with a gradient
    heads = heads if isinstance(heads, (list, tuple)) else [heads]
    try:
        graph = json.loads(mx.sym.Group([mx.autograd.get_symbol(h) for h in heads]).tojson())
    except mx.base.MXNetError:
        return  # a head not on the tape: autograd's own backward() says so
    nodes = graph["nodes"]
    wanted = []  # the node's outputs need a gradient
    for n in nodes:
        wanted.append(trained_variable(n) if n["op"] == "null"
                      else any(wanted[i] for i, _, _ in n["inputs"]))
    uses: dict[tuple, int] = {}
    for n in nodes:
        for i, out, _ in n["inputs"]:
            uses[i, out] = uses.get((i, out), 0) + 1
    for i, out, _ in graph["heads"]:
        uses[i, out] = uses.get((i, out), 0) + 1
    for n in nodes:
        if n["op"] != "_CustomFunction":
            continue
        for i, out, _ in n["inputs"]:
            if wanted[i] and uses[i, out] > 1:
                with chain_lock:  # the refused graph's calls: never backward()ed now
                    for call in all_calls():
                        call.ran.set()
                raise PlanError(
                    "an input of a planned call needs its gradient and is also used by "
                    "another recorded operator or call: autograd would sum its gradients "
                    "with an operator that deadlocks MXNet 1.9.1 beside the planned "
                    "backward. Call the block itself (unplanned) where its input has "
                    "another use, or detach() the other use if it needs no gradient")


def _write_param_grads() -> None:
    """After autograd's backward(), from the caller's thread: once the callbacks of the
    planned calls it reached have queued their executors' backwards, write every trained
    Parameter's gradient from theirs, honouring its grad_req, and mark it fresh for
    Trainer.step. Several calls' gradients are summed in the order plain Gluon's autograd
    sums them (last call first), and added to autograd's own when another recorded op
    used the Parameter too (autograd marked it fresh: run() had unmarked it)."""
    mx = load_mxnet()
    terms: dict[int, tuple[Any, Any, list]] = {}  # by the Parameter's array on a context
    with chain_lock:
        for _, _, chain in chains():
            if any(call.reached() for call in chain.calls):
                for call in chain.calls:  # later calls it did not reach: their tokens'
                    if not call.reached():  # history is cleared, so no backward()
                        call.ran.set()  # reaches them any more
            for call in reversed(chain.calls):
                if not call.reached():
                    continue
                call.wait()
                bound = call.bound
                for (name, p), grad in zip(bound.trained, bound.param_grads
                                           if call.outputs_reached else []):
                    data = p.data(bound.ctx)
                    entry = terms.setdefault(id(data), (p, bound.ctx, []))
                    if name not in bound.direct:  # else the executor added it
                        entry[2].append(grad)
                bound.probe._fresh_grad = False
                call.ran.clear()  # a backward(retain_graph=True) may run it again
                call.written = True
        with mx.autograd.pause():  # backward() may be called inside record()
            for p, ctx, grads in terms.values():
                data, dst = p.data(ctx), p.grad(ctx)
                if grads:
                    total = grads[0] if len(grads) == 1 else mx.nd.add_n(*grads)
                    if data._fresh_grad or p.grad_req == "add":
                        dst[:] += total
                    else:
                        dst[:] = total
                data._fresh_grad = True
        for block, ctx, chain in chains():
            if chain.plain:  # forgotten once backward() has written all its gradients
                trained = [p for p in block.collect_params().values() if p.grad_req != "null"]
                chain.plain = not all(any(str(d.context) == ctx and d._fresh_grad
                                          for d in p.list_data()) for p in trained)
