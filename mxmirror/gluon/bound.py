"""One planned executor of a block's graph, bound once per context, input signature,
grad_req and call position, and its two nodes on autograd's tape.

The executor reads a copy of the weights, refreshed before every forward, and writes
every gradient into its own arrays: its backward runs from autograd's callback thread,
possibly after the caller has queued Trainer.step's in-place update, and backward()
(backward.py) writes the Parameters' gradients from those arrays. The one exception is
grad_req 'add' at the first call of a record(), which adds straight into the
Parameter's gradient as the CachedOp does.
"""

from __future__ import annotations

import threading
from typing import Any

from mxmirror.adapter.symbol import load_mxnet
from mxmirror.api import plan
from mxmirror.errors import PlanError
from mxmirror.gluon.calls import Call, CallChain, shared_with_others
from mxmirror.gluon.inputs import dtype_name, regroup, shapes_text
from mxmirror.gluon.record import record_function
from mxmirror.log import log
from mxmirror.runtime.aux_order import order_aux_updates
from mxmirror.runtime.binds import unhooked

backward_lock = threading.Lock()  # the backward callbacks of all PlannedBlocks, one at a time


class PlannedExecutor:
    """One planned executor for the block's Parameters, and its autograd bridge."""

    def __init__(self, owner: Any, symbol: Any, fmt: Any, names: list[str],
                 inputs: tuple, input_reqs: tuple, params: dict, ctx: Any,
                 position: int = 0) -> None:
        mx = load_mxnet()
        self.fmt = fmt
        self.names = names
        self.ctx = ctx
        args, grads, reqs, types, shapes = {}, {}, {}, {}, {}
        for name, x, req in zip(names, inputs, input_reqs):
            args[name] = mx.nd.empty(x.shape, ctx, dtype=x.dtype)
            reqs[name], types[name], shapes[name] = req, dtype_name(x.dtype), x.shape
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
            copy_key = (str(ctx), name, p.shape, dtype_name(p.dtype))
            args[name] = owner._weight_copies.get(copy_key)
            if args[name] is None:
                args[name] = owner._weight_copies[copy_key] = mx.nd.empty(p.shape, ctx,
                                                                          dtype=p.dtype)
            reqs[name], types[name] = p.grad_req, dtype_name(p.dtype)
            self.weights.append((args[name], p))
            if p.grad_req != "null":
                self.trained.append((name, p))
        aux = {n: params[n].data(ctx) for n in symbol.list_auxiliary_states()}
        for n in symbol.list_auxiliary_states():
            types[n] = dtype_name(params[n].dtype)
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
        shared = shared_with_others(owner)
        self.owner = owner
        self.direct = {n: p.grad(ctx) for n, p in self.trained
                       if p.grad_req == "add" and position == 0 and id(p) not in shared}
        for n, g in self.direct.items():
            grads[n], bind_reqs[n] = g, "add"
        self.aux = aux
        self.plan, self.exec = bind_planned(owner, symbol, ctx, args, grads, bind_reqs, aux,
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
                 & shared_with_others(self.owner))

    def run(self, inputs: tuple, chain: CallChain, position: int) -> Any:
        mx = load_mxnet()
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
        # the Parameters stay off the tape (block.py's docstring); a later call of the
        # record() takes the previous call's token, so the calls' backwards run last first
        previous = [chain.calls[-1].token] if position > 0 else []
        call = Call(self, token)
        chain.calls.append(call)
        record_function(list(inputs) + [self.probe] + previous, [link, token],
                lambda *grads: self._backward(call, *grads), call.ran.set)
        # the outputs come from a second node, run first in backward() when they reach
        # the loss: a call reached only through a later call's token skips its backward
        record_function([link], outputs, lambda *grads: self._outputs_reached(call, *grads),
                lambda: None)
        for out in outputs:  # marks autograd's node of the outputs: fed by a planned call
            out._fresh_grad = True
        return regroup(outputs, self.fmt)

    def _outputs_reached(self, call: Call, out_grads: list, in_grads: list,
                         _reqs: list) -> None:
        """The outputs' gradients, copied: out_grads view autograd's arrays under engine
        variables of their own, and autograd frees those arrays once this op completes,
        which is when every write to in_grads pushed here has run. So write the link's
        gradient (never read) from each copy: the op then waits for the copies."""
        for view, own in zip(out_grads, self.head_grads):
            view.copyto(own)
            in_grads[0][:] = own.reshape((-1,))[:1]
        call.outputs_reached = True

    def _backward(self, call: Call, _out_grads: list, in_grads: list, reqs: list) -> None:
        """The executor's backward into its own gradient arrays, and the inputs' gradients
        autograd asked for; backward() then writes the Parameters' (backward.py).
        A call whose outputs did not reach the loss (only a later call's token did) runs
        no backward, as plain Gluon runs none: its inputs' gradients are zeros."""
        try:
            with backward_lock:
                if call.outputs_reached:
                    self.exec.backward(out_grads=self.head_grads)
                for dst, req, src in zip(in_grads, reqs, self.input_grads):
                    if call.outputs_reached:
                        write_input_grad(dst, req, src)
                    elif req == "write" and src is not None:
                        dst[:] = 0
        finally:
            call.ran.set()


def bind_planned(owner: Any, symbol: Any, ctx: Any, args: dict, grads: dict,
                  reqs: dict, aux: dict, types: dict, shapes: dict) -> tuple[Any, Any]:
    """The plan (None for policy none) and its executor bound on the given arrays."""
    kw = dict(args=args, args_grad=grads, grad_req=reqs, aux_states=aux)
    where = f"mxmirror: gluon {owner.block.name} {shapes_text(shapes)}"
    if owner.policy == "none":
        log.info(f"{where} policy=none (unplanned executor)")
        return None, order_aux_updates(unhooked("bind")(symbol, ctx, **kw))
    p = plan(symbol, policy=owner.policy, budget=owner.budget, type_dict=types,
             grad_req=reqs, **shapes)
    notes = p.notes if p.recomputed_ids else []  # else the summary says them
    log.info("; ".join([f"{where} " + p.summary().replace("mxmirror: ", ""), *notes]))
    return p, p.bind(ctx, symbol=symbol, **kw)




def write_input_grad(dst: Any, req: str, src: Any) -> None:
    """dst (a gradient autograd handed over) from src, honouring its req."""
    if req == "null" or src is None:
        return
    if req == "add":
        dst[:] += src
    else:
        dst[:] = src
