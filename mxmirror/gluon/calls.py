"""The recorded planned calls and the backward() that serves them.

Per block and context, the calls recorded since the last backward() that reached them
(``_Chain``); autograd's backward() wrapped so that it returns only once their callbacks
have queued their work, then writes every trained Parameter's gradient (the Parameters
stay off the tape, see block.py); and the checks that refuse, with a PlanError, what
cannot be made safe (inputs whose gradients autograd would sum, unplanned recorded calls
of a planned block beside a pending planned call, autograd.grad, retain_graph).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from mxmirror.errors import PlanError


def _mx():
    import mxnet as mx

    return mx


def _shared_with_others(owner: Any) -> set[int]:
    """ids of the Parameters other live PlannedBlocks train (tied weights)."""
    return {id(q) for other in list(_planned_blocks) if other is not owner
            for q in other.block.collect_params().values()}


def _write(dst: Any, req: str, src: Any) -> None:
    """dst (a gradient autograd handed over) from src, honouring its req."""
    if req == "null" or src is None:
        return
    if req == "add":
        dst[:] += src
    else:
        dst[:] = src


class _Call:
    """One recorded call of a planned executor."""

    def __init__(self, bound: Any, token: Any) -> None:
        self.bound = bound
        self.token = token  # its extra output, the next call's extra input
        self.ran = threading.Event()  # its backward callback has queued its work, or its
        # tape is gone without one
        self.written = False  # backward() has written its Parameters' gradients
        self.outputs_reached = False  # a backward() reached its outputs (not only its token)

    def reached(self) -> bool:
        """A backward() reached it since its Parameters' gradients were last written."""
        return self.bound.probe._fresh_grad

    def free(self) -> bool:
        """No backward of this call is still to come. When backward() has reached it,
        wait until autograd's thread has queued that backward."""
        if self.ran.is_set():
            return True
        if not self.bound.probe._fresh_grad:
            return self.written  # recorded, no backward yet: another call in the record()
        self.wait()
        return True

    def wait(self) -> None:
        """Until the callback of a call backward() has reached has queued its work."""
        if not self.ran.wait(timeout=5):
            _mx().nd.waitall()  # raises what failed upstream, if anything did
            if not self.ran.is_set():
                raise PlanError("the backward of a PlannedBlock call never ran (MXNet "
                                "skipped it); the next call cannot reuse its executor")


class _Chain:
    """The recorded calls of one block on one context since the last one backward() has
    reached, in call order."""

    def __init__(self) -> None:
        self.calls: list[_Call] = []
        self.plain = False  # a recorded call of the block itself, not yet backward()ed

    def pending(self) -> bool:
        """A recorded call that no backward() has reached (nor its tape dropped)."""
        return not all(call.free() for call in self.calls)

    def next_position(self) -> int:
        """The next call's position: after the pending ones, or 0 once all are done."""
        if not self.pending():
            self.calls.clear()
        return len(self.calls)


_chain_lock = threading.RLock()


_chains: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # block -> {ctx: _Chain}


_watched: weakref.WeakSet = weakref.WeakSet()  # blocks with _refuse_mixed_calls as pre-hook


_planned_blocks: weakref.WeakSet = weakref.WeakSet()  # every live PlannedBlock


_MIXED = ("their backwards would update its BatchNorm statistics in an order that changes "
          "from run to run (measured).")


_calling = threading.local()


_backward_originals: list = []  # autograd.backward, NDArray.backward as MXNet has them


def _wait_in_backward() -> None:
    """Make autograd's backward() return only once the backward callbacks of the planned
    calls it reached have queued their work. Until then, an op the caller queues next
    that needs the callbacks' results and holds a temp-space resource (Adam's update in
    Trainer.step, the next forward) would deadlock MXNet 1.9.1's engine as autograd's own
    gradient sum does (module docstring)."""
    mx = _mx()
    if _backward_originals:
        return
    originals = (mx.autograd.backward, mx.nd.NDArray.backward, mx.autograd.grad)
    _backward_originals.extend(originals)

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
    with _chain_lock:
        pending = any(not call.written and not call.ran.is_set() for call in _all_calls())
    if pending:
        raise PlanError(f"{what} is not supported through a planned Gluon call (PlannedBlock, "
                        f"or mxmirror run / enabled()); call backward() once per record(), "
                        f"or run the block unplanned (policy none) for this computation")


def _all_calls() -> list:
    """Every recorded planned call, of every block and context (under _chain_lock)."""
    return [call for chains in list(_chains.values()) for chain in chains.values()
            for call in chain.calls]


def _trained_variable(node: dict) -> bool:
    """A variable of autograd's recorded graph (JSON) that gets a gradient: autograd names
    those var<N>, other arrays null<N>."""
    return node["op"] == "null" and not node["name"].startswith("null")


def _check_input_uses(heads: Any) -> None:
    """Before backward(): a planned call's input whose gradient autograd must sum with
    another (the input used by another recorded op, twice by one call, or by two calls)
    is refused. autograd's sum takes a temp-space resource and waits for the planned
    call's backward, whose executor ops then wait for the same resource: MXNet 1.9.1's
    engine deadlocks (module docstring; measured with MXNET_CPU_TEMP_COPY=1)."""
    import json

    mx = _mx()
    with _chain_lock:
        if not any(call.bound.wants_input_grads and not call.written for call in _all_calls()):
            return  # the usual case: no planned call was given an input with a gradient
    heads = heads if isinstance(heads, (list, tuple)) else [heads]
    try:
        graph = json.loads(mx.sym.Group([mx.autograd.get_symbol(h) for h in heads]).tojson())
    except mx.base.MXNetError:
        return  # a head not on the tape: autograd's own backward() says so
    nodes = graph["nodes"]
    wanted = []  # the node's outputs need a gradient
    for n in nodes:
        wanted.append(_trained_variable(n) if n["op"] == "null"
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
                with _chain_lock:  # the refused graph's calls: never backward()ed now
                    for call in _all_calls():
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
    mx = _mx()
    terms: dict[int, tuple[Any, Any, list]] = {}  # by the Parameter's array on a context
    with _chain_lock:
        for chains in list(_chains.values()):
            for chain in chains.values():
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
        for block, chains in list(_chains.items()):
            for ctx, chain in chains.items():
                if chain.plain:  # forgotten once backward() has written all its gradients
                    trained = [p for p in block.collect_params().values()
                               if p.grad_req != "null"]
                    chain.plain = not all(any(str(d.context) == ctx and d._fresh_grad
                                              for d in p.list_data()) for p in trained)


def _chain(block: Any, ctx: Any) -> _Chain:
    return _chains.setdefault(block, {}).setdefault(str(ctx), _Chain())


class _inside:  # noqa: N801 - used as a context manager
    """PlannedBlock calling its own block (inference, or tracing its graph)."""

    def __enter__(self) -> None:
        self.was = getattr(_calling, "inside", False)
        _calling.inside = True

    def __exit__(self, *exc: Any) -> None:
        _calling.inside = self.was


def _refuse_mixed_calls(block: Any, inputs: tuple, inside: bool = False) -> None:
    """A forward pre-hook of every planned block: a recorded call of the block itself
    beside a pending planned call of it. Their gradients would add up right, but not
    their BatchNorm statistics: the block's backward runs on the caller's thread, the
    planned call's on autograd's callback thread, in no fixed order."""
    mx = _mx()
    if (getattr(_calling, "inside", False) and not inside) or not mx.autograd.is_recording():
        return
    if not mx.autograd.is_training():
        return  # record(train_mode=False), a validation pass: BatchNorm updates nothing
    arrays = [x for x in inputs if isinstance(x, mx.nd.NDArray)]
    if not arrays or len(arrays) < len(inputs):
        return  # a graph being traced, or inputs a planned call would refuse anyway
    with _chain_lock:
        chain = _chain(block, arrays[0].context)
        if chain.pending():
            raise PlanError(
                f"{block.name} is called unplanned inside autograd.record() while a planned "
                f"call of it (PlannedBlock, or mxmirror run / enabled()) waits for "
                f"backward(): {_MIXED} Call it through the PlannedBlock every time in a "
                f"record() (every call is planned), or call backward() between the two")
        chain.plain = True


def _check_inputs(inputs: tuple, kwargs: dict) -> None:
    """What a recorded call can take: positional NDArrays on one context."""
    mx = _mx()
    supported = "PlannedBlock takes positional NDArray inputs on one context"
    if kwargs:
        raise PlanError(f"{supported}; got keyword argument(s) {', '.join(sorted(kwargs))}")
    if not inputs:
        raise PlanError(f"{supported}; got none")
    for i, x in enumerate(inputs):
        if not isinstance(x, mx.nd.NDArray):
            raise PlanError(f"{supported}; input {i} is {type(x).__name__}")
        if isinstance(x, mx.nd.sparse.BaseSparseNDArray):
            raise PlanError(f"{supported}; input {i} is sparse ({x.stype})")
    contexts = sorted({str(x.context) for x in inputs})
    if len(contexts) > 1:
        raise PlanError(f"{supported}; got {', '.join(contexts)}")


def _check_fed_by_planned(inputs: tuple) -> None:
    """Inputs that need a gradient come from planned calls only. An operator recorded
    before a planned call that needs its input gradient in backward() and takes a
    temp-space resource there (Dense's, measured) is queued before the planned backward's
    work and deadlocks MXNet 1.9.1's engine (module docstring)."""
    import json

    for i, x in enumerate(inputs):
        history = None if x._fresh_grad else _history(x)
        if history is None:
            continue  # no history; or a planned call's output (run() marks them), whose
            # inputs were checked at that call; or a variable a backward() has reached
        nodes = json.loads(history.tojson())["nodes"]
        ops = sorted({n["op"] for n in nodes} - {"null", "_CustomFunction"})
        wanted = any(_trained_variable(n) for n in nodes)
        if ops and wanted:
            raise PlanError(f"input {i} is computed by unplanned operators that need its "
                            f"gradient ({', '.join(ops[:5])}); MXNet 1.9.1 can deadlock "
                            f"when they run beside a planned call (hybridize the block that "
                            f"computes it, so it is planned too)")


def _shapes(shapes: dict) -> str:
    return " ".join(f"{n}={'x'.join(map(str, s))}" for n, s in shapes.items())


def _dtype(dtype: Any) -> str:
    import numpy as np

    return np.dtype(dtype).name


def _input_req(x: Any) -> str:
    """'write' when x is on autograd's tape (attached or computed while recording)."""
    return "null" if _history(x) is None else "write"


def _history(x: Any) -> Any:
    """autograd's recorded graph of x (a Symbol), or None when x is not on the tape."""
    mx = _mx()
    try:
        return mx.autograd.get_symbol(x)
    except mx.base.MXNetError:
        return None


def _flatten(out: Any) -> tuple[list, Any]:
    from mxnet.gluon.block import _flatten as flatten

    return flatten(out, "output")


def _regroup(flat: list, fmt: Any) -> Any:
    from mxnet.gluon.block import _regroup as regroup

    return regroup(flat, fmt)
