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

from mxmirror.adapter.symbol import load_mxnet
from mxmirror.errors import PlanError
from mxmirror.gluon.backward import wrap_backward
from mxmirror.gluon.bound import PlannedExecutor
from mxmirror.gluon.calls import (
    MIXED,
    calling_block_itself,
    chain_lock,
    chain_of,
    refuse_mixed_calls,
    register,
)
from mxmirror.gluon.inputs import (
    check_fed_by_planned,
    check_inputs,
    dtype_name,
    flatten,
    input_req,
)
from mxmirror.log import show as show_log
from mxmirror.planning.registry import resolve


class PlannedBlock(load_mxnet().gluon.Block):
    """A Block that trains a HybridBlock through an mxmirror plan.

    Under ``autograd.record()`` a call runs the planned executor (one per context, input
    shapes, dtypes and grad_req); outside it, the wrapped block runs as it would alone.
    ``collect_params()`` returns the wrapped block's Parameters.
    """

    def __init__(self, block: Any, policy: str = "sqrt", budget: Any = None) -> None:
        mx = load_mxnet()
        if not isinstance(block, mx.gluon.HybridBlock):
            raise PlanError(f"PlannedBlock needs a HybridBlock (its graph is exported as a "
                            f"Symbol to plan it), not {type(block).__name__}")
        resolve(policy, budget)
        show_log()
        super().__init__(prefix=block.prefix, params=None)
        self.block = block
        self.policy = policy
        self.budget = budget
        self._bound: dict[tuple, PlannedExecutor] = {}  # by (context, shapes, ..., position)
        self._weight_copies: dict[tuple, Any] = {}  # by (context, name, shape, dtype)
        register(self)
        wrap_backward()

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        if kwargs:  # Block.__call__ takes none: say what is supported instead of a TypeError
            check_inputs(inputs, kwargs)
        return super().__call__(*inputs)

    def forward(self, *inputs: Any) -> Any:
        mx = load_mxnet()
        if not mx.autograd.is_recording() or not mx.autograd.is_training():
            # inference, or a recording in predict mode (gradients of an inference pass):
            # the block itself, so a planned executor only ever runs training forwards
            if mx.autograd.is_recording():
                refuse_mixed_calls(self.block, inputs, inside=True)
            with calling_block_itself():
                return self.block(*inputs)
        check_inputs(inputs, {})
        check_fed_by_planned(inputs)
        with chain_lock:
            chain = chain_of(self.block, inputs[0].context)
            if chain.plain:  # said once: its outputs may have been dropped since
                chain.plain = False
                raise PlanError(
                    f"PlannedBlock {self.block.name} is called after a recorded call of the "
                    f"block itself that backward() has not reached: {MIXED} Call it through "
                    f"the PlannedBlock every time in a record() (every call is planned), or "
                    f"call backward() between the two")
            position = chain.next_position()
            return self.bound(inputs, position).run(inputs, chain, position)

    def bound(self, inputs: tuple, position: int = 0) -> PlannedExecutor:
        """The executor for these inputs at this call position of a record() (bound once
        per context, shapes, dtypes, grad_req and position)."""
        mx = load_mxnet()
        ctx = inputs[0].context
        self._finish_deferred_init(inputs)
        params = self._params_by_name()
        input_reqs = tuple(input_req(x) for x in inputs)
        key = (str(ctx), tuple((x.shape, dtype_name(x.dtype)) for x in inputs), input_reqs,
               tuple((n, p.grad_req, dtype_name(p.dtype)) for n, p in sorted(params.items())),
               position)
        found = self._bound.get(key)
        if found is not None and found.current(params, ctx):
            return found
        names = ["data"] if len(inputs) == 1 else [f"data{i}" for i in range(len(inputs))]
        with calling_block_itself():
            out = self.block(*[mx.sym.var(n) for n in names])
        heads, fmt = flatten(out)
        symbol = heads[0] if len(heads) == 1 else mx.sym.Group(heads)
        self._bound[key] = PlannedExecutor(self, symbol, fmt, names, inputs, input_reqs,
                                           params, ctx, position)
        if not self.block._cached_op_args:
            # HybridBlock.export saves the Parameters listed when the block builds its
            # CachedOp, which a block only ever called planned never does: an empty file
            with mx.autograd.pause(), calling_block_itself():
                self.block._build_cache(*inputs)
        return self._bound[key]

    def _params_by_name(self) -> dict:
        return {p.name: p for p in self.block.collect_params().values()}

    def _finish_deferred_init(self, inputs: tuple) -> None:
        """Parameters waiting for shapes get them from the inputs, as a first call would."""
        mx = load_mxnet()
        params = list(self.block.collect_params().values())
        if all(p._deferred_init == () for p in params):
            return
        with mx.autograd.pause():
            self.block._deferred_infer_shape(*inputs)
            for p in params:
                p._finish_deferred_init()


