"""PlannedBlock: sublinear-memory training for hybridized Gluon blocks.

MXNet 1.9.1's CachedOp builds its gradient graph with no mirror function, so a Gluon
graph can only be planned on a symbolic executor. PlannedBlock exports the block's graph
as a Symbol, plans it, binds it with the block's own aux states (BatchNorm statistics are
updated in place) and a copy of its weights refreshed before every forward, and records
each call on autograd's tape as two custom functions: the executor's, of the call's
inputs and a probe (a one-element variable, so autograd's backward always reaches the
call), and after it one that gives out the outputs (its backward copies their gradients
and tells the first that they reached the loss). The executor's backward runs the
executor's backward into its own gradient arrays and writes the inputs' gradients
autograd asks for.

The Parameters stay off autograd's tape. If they were on it, autograd would sum the
gradient of a Parameter that another recorded op also uses (a weight penalty, a weight
tied between two blocks, two calls of one block) with ElementWiseSum, which takes a
temp-space resource and is queued, from the caller's thread, before the backward
callback pushes the executor ops that need the same resource, while it waits for their
results: MXNet 1.9.1's engine deadlocks. Instead ``backward()`` (autograd.backward and
NDArray.backward, wrapped once a PlannedBlock exists) writes them after autograd's own
backward, from the caller's thread, once the callbacks of the calls it reached have
queued their work: each trained Parameter's gradient from the executors' (summed over
the calls in the order plain Gluon sums them), honouring its grad_req, added to what
autograd wrote into it if another op used it in the same backward, and marked fresh
for ``Trainer.step``. The wait also keeps ops queued after ``backward()`` that need a
resource (Adam's update, a random draw) behind the callbacks' work.

What cannot be made safe this way is refused with a PlanError, never left to hang: an
input needing its gradient that autograd would sum (the input used by another op or by
two calls: checked in ``backward()``), an input computed by unplanned operators that
need its gradient (checked at the call), a recorded call of the block itself in training
mode beside a pending planned call (their BatchNorm statistics would update in no fixed
order), and autograd.grad or backward(retain_graph=True) while a planned call waits
(the Parameters are off the tape, and a second backward would reuse spent state).

With grad_req 'add' the first call of a record() binds the Parameter's own gradient
(grad_req 'add'), as the CachedOp adds into it, unless another PlannedBlock trains the
same Parameter (tied weights keep autograd's sum-then-add).

The backward runs on MXNet's custom-operator thread inside an asynchronous engine op that
completes only after it, so nothing there may wait for the engine: the executor (MXNet's
or the segmented one) only ever runs training forwards, from the caller's thread, which
is the one place the segmented executor waits (when its mode changes).

Several calls of one block in one ``record()`` (a GAN's discriminator on real and fake
data) each get their own executor (one per call position, reused every iteration) and are
chained on the tape by a one-element token (each later call takes the previous call's),
so their backwards run last call first, one after the other: BatchNorm updates its
running statistics in backward, and this is the order plain Gluon updates them in when
the first call's input needs no gradient (measured). The token reaches an earlier call
whose outputs do not reach the loss; its backward then skips the executor, as plain
Gluon runs no backward for it.
"""

from __future__ import annotations

import ctypes
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import Any

from .api import plan
from .aux_order import order_aux_updates
from .errors import PlanError
from .log import log
from .log import show as show_log
from .mxnet_adapter import unhooked
from .planners import resolve

_REQ = {0: "null", 1: "write", 2: "write", 3: "add"}  # MXNet's OpReqType codes


def _mx():
    import mxnet as mx

    return mx


class PlannedBlock(_mx().gluon.Block):
    """A Block that trains a HybridBlock through an mxmirror plan.

    Under ``autograd.record()`` a call runs the planned executor (one per context, input
    shapes, dtypes and grad_req); outside it, the wrapped block runs as it would alone.
    ``collect_params()`` returns the wrapped block's Parameters.
    """

    def __init__(self, block: Any, policy: str = "sqrt", budget: Any = None) -> None:
        mx = _mx()
        if not isinstance(block, mx.gluon.HybridBlock):
            raise PlanError(f"PlannedBlock needs a HybridBlock (its graph is exported as a "
                            f"Symbol to plan it), not {type(block).__name__}")
        resolve(policy, budget)
        show_log()
        super().__init__(prefix=block.prefix, params=None)
        self.block = block
        self.policy = policy
        self.budget = budget
        self._bound: dict[tuple, _Bound] = {}  # by (context, shapes, ..., call position)
        self._weight_copies: dict[tuple, Any] = {}  # by (context, name, shape, dtype)
        _planned_blocks.add(self)
        if block not in _watched:
            _watched.add(block)
            block.register_forward_pre_hook(_refuse_mixed_calls)
        _wait_in_backward()

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        if kwargs:  # Block.__call__ takes none: say what is supported instead of a TypeError
            _check_inputs(inputs, kwargs)
        return super().__call__(*inputs)

    def forward(self, *inputs: Any) -> Any:
        mx = _mx()
        if not mx.autograd.is_recording() or not mx.autograd.is_training():
            # inference, or a recording in predict mode (gradients of an inference pass):
            # the block itself, so a planned executor only ever runs training forwards
            if mx.autograd.is_recording():
                _refuse_mixed_calls(self.block, inputs, inside=True)
            with _inside():
                return self.block(*inputs)
        _check_inputs(inputs, {})
        _check_fed_by_planned(inputs)
        with _chain_lock:
            chain = _chain(self.block, inputs[0].context)
            if chain.plain:  # said once: its outputs may have been dropped since
                chain.plain = False
                raise PlanError(
                    f"PlannedBlock {self.block.name} is called after a recorded call of the "
                    f"block itself that backward() has not reached: {_MIXED} Call it through "
                    f"the PlannedBlock every time in a record() (every call is planned), or "
                    f"call backward() between the two")
            position = chain.next_position()
            return self.bound(inputs, position).run(inputs, chain, position)

    def bound(self, inputs: tuple, position: int = 0) -> _Bound:
        """The executor for these inputs at this call position of a record() (bound once
        per context, shapes, dtypes, grad_req and position)."""
        mx = _mx()
        ctx = inputs[0].context
        self._finish_deferred_init(inputs)
        params = self._params_by_name()
        input_reqs = tuple(_input_req(x) for x in inputs)
        key = (str(ctx), tuple((x.shape, _dtype(x.dtype)) for x in inputs), input_reqs,
               tuple((n, p.grad_req, _dtype(p.dtype)) for n, p in sorted(params.items())),
               position)
        found = self._bound.get(key)
        if found is not None and found.current(params, ctx):
            return found
        names = ["data"] if len(inputs) == 1 else [f"data{i}" for i in range(len(inputs))]
        with _inside():
            out = self.block(*[mx.sym.var(n) for n in names])
        heads, fmt = _flatten(out)
        symbol = heads[0] if len(heads) == 1 else mx.sym.Group(heads)
        self._bound[key] = _Bound(self, symbol, fmt, names, inputs, input_reqs, params, ctx,
                                  position)
        if not self.block._cached_op_args:
            # HybridBlock.export saves the Parameters listed when the block builds its
            # CachedOp, which a block only ever called planned never does: an empty file
            with mx.autograd.pause(), _inside():
                self.block._build_cache(*inputs)
        return self._bound[key]

    def _params_by_name(self) -> dict:
        return {p.name: p for p in self.block.collect_params().values()}

    def _finish_deferred_init(self, inputs: tuple) -> None:
        """Parameters waiting for shapes get them from the inputs, as a first call would."""
        mx = _mx()
        params = list(self.block.collect_params().values())
        if all(p._deferred_init == () for p in params):
            return
        with mx.autograd.pause():
            self.block._deferred_infer_shape(*inputs)
            for p in params:
                p._finish_deferred_init()


class _Bound:
    """One planned executor for the block's Parameters, and its autograd bridge."""

    def __init__(self, owner: PlannedBlock, symbol: Any, fmt: Any, names: list[str],
                 inputs: tuple, input_reqs: tuple, params: dict, ctx: Any,
                 position: int = 0) -> None:
        mx = _mx()
        self.fmt = fmt
        self.names = names
        self.ctx = ctx
        args, grads, reqs, types, shapes = {}, {}, {}, {}, {}
        for name, x, req in zip(names, inputs, input_reqs):
            args[name] = mx.nd.empty(x.shape, ctx, dtype=x.dtype)
            reqs[name], types[name], shapes[name] = req, _dtype(x.dtype), x.shape
        unknown = [n for n in symbol.list_arguments() + symbol.list_auxiliary_states()
                   if n not in args and n not in params]
        if unknown:
            raise PlanError(f"the block's graph reads {', '.join(unknown)}, which are neither "
                            f"its inputs nor its Parameters")
        self.trained = []  # (name, Parameter) of the arguments that get a gradient
        self.weights = []  # (executor array, Parameter): refreshed before every forward
        for name in symbol.list_arguments():
            if name in names:
                continue
            p = params[name]
            # a copy of the block's (one for all its executors on ctx): their backwards run
            # from autograd's callbacks, after the caller may have queued Trainer.step's
            # in-place update; every call refreshes it, with the same values in a record()
            copy_key = (str(ctx), name, p.shape, _dtype(p.dtype))
            args[name] = owner._weight_copies.get(copy_key)
            if args[name] is None:
                args[name] = owner._weight_copies[copy_key] = mx.nd.empty(p.shape, ctx,
                                                                          dtype=p.dtype)
            reqs[name], types[name] = p.grad_req, _dtype(p.dtype)
            self.weights.append((args[name], p))
            if p.grad_req != "null":
                self.trained.append((name, p))
        aux = {n: params[n].data(ctx) for n in symbol.list_auxiliary_states()}
        for n in symbol.list_auxiliary_states():
            types[n] = _dtype(params[n].dtype)
        # the executor writes every gradient into its own array; the callback writes the
        # inputs' with autograd's req, backward() the Parameters' with their grad_req
        bind_reqs = {n: ("null" if r == "null" else "write") for n, r in reqs.items()}
        grads = {n: mx.nd.zeros(args[n].shape, ctx, dtype=args[n].dtype)
                 for n, r in bind_reqs.items() if r != "null"}
        # grad_req 'add': the first call of a record() adds straight into the Parameter's
        # gradient, as the block's CachedOp does (a kernel may add its terms one by one:
        # the non-MKL-DNN Convolution adds each batch chunk, which a sum added after
        # rounds differently, measured); later calls' sums are added after, as autograd's
        # (a Parameter another planned block shares, a tied weight, keeps the sum:
        # autograd sums its uses before adding them to the old gradient)
        shared = _shared_with_others(owner)
        self.owner = owner
        self.direct = {n: p.grad(ctx) for n, p in self.trained
                       if p.grad_req == "add" and position == 0 and id(p) not in shared}
        for n, g in self.direct.items():
            grads[n], bind_reqs[n] = g, "add"
        self.aux = aux
        self.plan, self.exec = _bind_planned(owner, symbol, ctx, args, grads, bind_reqs, aux,
                                             types, shapes)
        self.input_grads = [self.exec.grad_dict.get(n) for n in names]
        self.wants_input_grads = any(g is not None for g in self.input_grads)
        # the output gradients, copied from the callback's views of autograd's arrays
        self.head_grads = [mx.nd.empty(o.shape, ctx, dtype=o.dtype) for o in self.exec.outputs]
        self.param_grads = [self.exec.grad_dict[n] for n, _ in self.trained]
        # an extra input of every recorded call: autograd marks its gradient fresh when a
        # backward() that reaches the call starts (Imperative::Backward, synchronously)
        self.probe = mx.nd.zeros((1,), ctx)
        self.probe.attach_grad()

    def current(self, params: dict, ctx: Any) -> bool:
        """Still bound to the Parameters' own aux arrays (cast or reset_ctx replace them)."""
        return all(params[n].data(ctx) is a for n, a in self.aux.items()) and \
            all(params[n].grad(ctx) is g for n, g in self.direct.items()) and \
            not (self.direct and {id(params[n]) for n in self.direct}
                 & _shared_with_others(self.owner))

    def run(self, inputs: tuple, chain: _Chain, position: int) -> Any:
        mx = _mx()
        with mx.autograd.pause(train_mode=True):
            for arr, p in self.weights:
                p.data(self.ctx).copyto(arr)
            for name, x in zip(self.names, inputs):
                x.copyto(self.exec.arg_dict[name])
            self.exec.forward(is_train=True)
            outputs = [o.copy() for o in self.exec.outputs]
            token, link = mx.nd.zeros((1,), self.ctx), mx.nd.zeros((1,), self.ctx)
        self.probe._fresh_grad = False
        for _, p in self.trained:  # fresh again after backward(): autograd wrote it too
            p.data(self.ctx)._fresh_grad = False
        # the Parameters stay off the tape (module docstring); a later call of the
        # record() takes the previous call's token, so the calls' backwards run last first
        previous = [chain.calls[-1].token] if position > 0 else []
        call = _Call(self, token)
        chain.calls.append(call)
        _record(list(inputs) + [self.probe] + previous, [link, token],
                lambda *grads: self._backward(call, *grads), call.ran.set)
        # the outputs come from a second node, run first in backward() when they reach
        # the loss: a call reached only through a later call's token skips its backward
        _record([link], outputs, lambda *grads: self._outputs_reached(call, *grads),
                lambda: None)
        for out in outputs:  # marks autograd's node of the outputs: fed by a planned call
            out._fresh_grad = True
        return _regroup(outputs, self.fmt)

    def _outputs_reached(self, call: _Call, out_grads: list, in_grads: list,
                         _reqs: list) -> None:
        """The outputs' gradients, copied: out_grads view autograd's arrays under engine
        variables of their own, and autograd frees those arrays once this op completes,
        which is when every write to in_grads pushed here has run. So write the link's
        gradient (never read) from each copy: the op then waits for the copies."""
        for view, own in zip(out_grads, self.head_grads):
            view.copyto(own)
            in_grads[0][:] = own.reshape((-1,))[:1]
        call.outputs_reached = True

    def _backward(self, call: _Call, _out_grads: list, in_grads: list, reqs: list) -> None:
        """The executor's backward into its own gradient arrays, and the inputs' gradients
        autograd asked for; backward() then writes the Parameters' (_write_param_grads).
        A call whose outputs did not reach the loss (only a later call's token did) runs
        no backward, as plain Gluon runs none: its inputs' gradients are zeros."""
        try:
            with _one_backward:
                if call.outputs_reached:
                    self.exec.backward(out_grads=self.head_grads)
                for dst, req, src in zip(in_grads, reqs, self.input_grads):
                    if call.outputs_reached:
                        _write(dst, req, src)
                    elif req == "write" and src is not None:
                        dst[:] = 0
        finally:
            call.ran.set()


def _shared_with_others(owner: PlannedBlock) -> set[int]:
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

    def __init__(self, bound: _Bound, token: Any) -> None:
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


def _bind_planned(owner: PlannedBlock, symbol: Any, ctx: Any, args: dict, grads: dict,
                  reqs: dict, aux: dict, types: dict, shapes: dict) -> tuple[Any, Any]:
    """The plan (None for policy none) and its executor bound on the given arrays."""
    kw = dict(args=args, args_grad=grads, grad_req=reqs, aux_states=aux)
    where = f"mxmirror: gluon {owner.block.name} {_shapes(shapes)}"
    if owner.policy == "none":
        log.info(f"{where} policy=none (unplanned executor)")
        return None, order_aux_updates(unhooked("bind")(symbol, ctx, **kw))
    p = plan(symbol, policy=owner.policy, budget=owner.budget, type_dict=types,
             grad_req=reqs, **shapes)
    notes = p.notes if p.recomputed_ids else []  # else the summary says them
    log.info("; ".join([f"{where} " + p.summary().replace("mxmirror: ", ""), *notes]))
    return p, p.bind(ctx, symbol=symbol, **kw)


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


# ------------------------------------------------------------ the autograd bridge
_BACKWARD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int,
                             ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int),
                             ctypes.c_int, ctypes.c_void_p)
_DELETE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_one_backward = threading.Lock()
_alive: dict[int, Any] = {}  # callbacks autograd still holds, by record id
_counter = [0]


def _record(inputs: list, outputs: list, backward: Any, release: Any) -> None:
    """Put outputs = f(inputs) on autograd's tape; backward(out_grads, in_grads, reqs)
    fills in_grads honouring each req ('null', 'write', 'add').

    mx.autograd.Function is not used: its backward stops at the first input whose req is
    null and silently skips req 'add' (MXNet 1.9.1), and a block's input often has no
    gradient while the probe after it needs one.
    """
    from mxnet.base import _LIB, MXCallbackList, NDArrayHandle, c_array, c_handle_array, check_call
    from mxnet.ndarray import NDArray

    _counter[0] += 1
    key = _counter[0]

    def on_backward(num_out, num_in, ptrs, reqs, _is_train, _state):
        try:
            out_grads = [NDArray(ctypes.cast(ptrs[i], NDArrayHandle), writable=False)
                         for i in range(num_out)]
            in_grads = [NDArray(ctypes.cast(ptrs[num_out + i], NDArrayHandle), writable=True)
                        for i in range(num_in)]
            backward(out_grads, in_grads, [_REQ[reqs[i]] for i in range(num_in)])
        except Exception:  # noqa: BLE001 - a C callback must not raise
            log.error("mxmirror: PlannedBlock backward failed:\n" + traceback.format_exc())
            return False
        return True

    def on_delete(_state):
        release()
        _alive.pop(key, None)
        return True

    callbacks = [_BACKWARD(on_backward), _DELETE(on_delete)]
    casted = [ctypes.cast(c, ctypes.CFUNCTYPE(ctypes.c_int)) for c in callbacks]
    context = MXCallbackList(
        ctypes.c_int(len(casted)),
        ctypes.cast(c_array(ctypes.CFUNCTYPE(ctypes.c_int), casted),
                    ctypes.POINTER(ctypes.CFUNCTYPE(ctypes.c_int))),
        ctypes.cast(c_array(ctypes.c_void_p, [None] * len(casted)),
                    ctypes.POINTER(ctypes.c_void_p)))
    _alive[key] = (callbacks, context)
    check_call(_LIB.MXCustomFunctionRecord(
        ctypes.c_int(len(inputs)), c_handle_array(inputs),
        ctypes.c_int(len(outputs)), c_handle_array(outputs), ctypes.byref(context)))


# ------------------------------------------------------------ the unchanged-script hook
_hook: dict[str, Any] = {}
_planned: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_reported: weakref.WeakSet = weakref.WeakSet()
_depth = threading.local()


def install(state: Callable[[], tuple[str | None, Any]]) -> None:
    """Route the outermost hybridized block called under autograd.record() through a
    PlannedBlock while ``state()`` (the bind hook's policy, budget) names a policy."""
    if _hook:
        return
    mx = _mx()
    hybrid = mx.gluon.HybridBlock
    original = _hook["call"] = hybrid.__call__

    def call(self, *args, **kwargs):
        policy, budget = state()
        if policy in (None, "none") or getattr(_depth, "inside", False) \
                or not mx.autograd.is_recording() or not mx.autograd.is_training() \
                or any(isinstance(a, mx.sym.Symbol) for a in args):  # a graph being traced
            return original(self, *args, **kwargs)
        if not self._active:  # its hybridized children may still be planned
            if self not in _reported and not getattr(_depth, "quiet", False):
                _reported.add(self)
                log.info(f"mxmirror: gluon {self.name} is not hybridized: trained "
                         f"unplanned (call .hybridize() to plan it)")
            quiet, _depth.quiet = getattr(_depth, "quiet", False), True
            try:
                return original(self, *args, **kwargs)
            finally:
                _depth.quiet = quiet
        try:
            _check_inputs(args, kwargs)
            _check_fed_by_planned(args)
        except PlanError as e:
            if self not in _reported and not getattr(_depth, "quiet", False):
                _reported.add(self)
                log.info(f"mxmirror: gluon {self.name} trained unplanned: {e}")
            return original(self, *args, **kwargs)
        planned = _planned.get(self)
        if planned is None or (planned.policy, planned.budget) != (policy, budget):
            planned = _planned[self] = PlannedBlock(self, policy, budget)
        _depth.inside = True
        try:
            return planned(*args)
        finally:
            _depth.inside = False

    hybrid.__call__ = call


def uninstall() -> None:
    """Give HybridBlock back its own __call__."""
    if _hook:
        _mx().gluon.HybridBlock.__call__ = _hook.pop("call")
