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

from typing import Any

from mxmirror.api import plan
from mxmirror.errors import PlanError
from mxmirror.gluon.calls import (
    _MIXED,
    _Call,
    _Chain,
    _chain,
    _chain_lock,
    _check_fed_by_planned,
    _check_inputs,
    _dtype,
    _flatten,
    _input_req,
    _inside,
    _mx,
    _planned_blocks,
    _refuse_mixed_calls,
    _regroup,
    _shapes,
    _shared_with_others,
    _wait_in_backward,
    _watched,
    _write,
)
from mxmirror.gluon.record import _one_backward, _record
from mxmirror.log import log
from mxmirror.log import show as show_log
from mxmirror.planning.registry import resolve
from mxmirror.runtime.aux_order import order_aux_updates
from mxmirror.runtime.binds import unhooked


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


