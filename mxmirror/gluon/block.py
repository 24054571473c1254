"""PlannedBlock: sublinear-memory training for hybridized Gluon blocks.

MXNet 1.9.1's CachedOp builds its gradient graph with no mirror function, so a Gluon
graph can only be planned on a symbolic executor. PlannedBlock exports the block's graph
as a Symbol, plans it, and binds it on the block's own Parameters (data, gradients and
BatchNorm statistics, updated in place). A call inside ``autograd.record()`` copies its
inputs in, runs the executor's training forward and gives out copies of the outputs,
marked as autograd variables: autograd's backward stops there and writes their
gradients, and backward() (backward.py) runs the executor's backward itself, in plain
Gluon's order. Outside a recording, or recording for prediction, the block runs itself.
A call the plan does not pay for (executor.py's rule) runs the block itself too; once the
block itself has been called in a record() (by mxmirror or by the user), so is every
later call of it until the next backward(), so that autograd orders their backwards as
plain Gluon's (BatchNorm updates its statistics in backward): a planned call may come
before unplanned ones, never after.
"""

from __future__ import annotations

from typing import Any

import mxmirror.gluon.calls as calls
from mxmirror.adapter.free_memory import release_freed
from mxmirror.adapter.symbol import load_mxnet
from mxmirror.errors import PlanError
from mxmirror.gluon.backward import wrap_backward
from mxmirror.gluon.executor import (
    PlannedExecutor,
    choose_plan,
    forget,
    new_buffer_bytes,
    usable,
)
from mxmirror.gluon.inputs import (
    CallArgs,
    dtype_name,
    first_context,
    nbytes,
    shapes_text,
    unsupported,
)
from mxmirror.gluon.signature import Signature, signature
from mxmirror.gluon.sums import CHAIN_FROM
from mxmirror.log import log
from mxmirror.log import show as show_log
from mxmirror.planning.registry import resolve


class PlannedBlock(load_mxnet().gluon.Block):
    """A Block that trains a HybridBlock through an mxmirror plan.

    Under ``autograd.record()`` a call runs a planned executor (one per context, input
    signature and call waiting for its backward); outside it, the wrapped block runs as
    it would alone. ``collect_params()`` returns the wrapped block's Parameters.
    """

    # what MXNet prints of a failed shape inference is kept from stdout (the hook's: where
    # mxmirror's inference fails, the block's own call fails the same way and prints it)
    quiet = False

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
        self._executors: dict[tuple, list[PlannedExecutor]] = {}  # by call signature
        self._plans: dict[tuple, Signature] = {}  # by signature: its graph and plan
        self._decided: dict[tuple, Any] = {}  # (signature, another call pending, plain's
        # gradient terms counted, one of its signature pending to share): its plan, or
        # False where it would not pay
        self._unused: dict[tuple, Any] = {}  # the plans that would not pay
        self._said: dict[str, bool] = {}  # input shapes -> the verdict logged for them
        self._collected: dict | None = None  # the block's Parameters by name
        self._said_plain = False  # the line for the block itself beside it
        self._said_static = False  # the line for a block hybridized with static_alloc
        self._said_predicting = False  # the line for a recording for prediction
        self._records: dict[str, list] = {}  # context -> [backward() count, calls of the
        # block in this record(), the most in an earlier record()]
        self._loops: dict[tuple, bool] = {}  # situation: a second call beside a planned
        # one would be planned too
        self._shares: dict[tuple, bool] = {}  # situation: the call shares the executor of
        # a waiting call of its signature
        self._own_fallback = -1  # backward() count when a call of its own ran unplanned
        self._beside: set[tuple] = set()  # signatures planned beside a planned call though
        # they do not pay there (the line said once)
        calls.watch(block)
        wrap_backward()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for hook in self._forward_pre_hooks.values():  # Block.__call__ takes no keywords
            hook(self, args)
        out = self.forward(*args, **kwargs)
        for hook in self._forward_hooks.values():
            hook(self, args, out)
        return out

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        mx = load_mxnet()
        if mx.autograd.is_recording() and mx.autograd.is_training():
            try:
                out = self.planned_call(args, kwargs)
            except BlockError as e:
                raise e.error from None
            if out is not None:
                return out
        elif mx.autograd.is_recording():
            self.predicting()
        # inference, a recording for prediction, or a call the plan does not pay for
        return self.block(*args, **kwargs)

    def predicting(self) -> None:
        """A call recorded for prediction runs the block itself (MXNet's executor cannot
        run a backward of a forward in predict mode, and a mirrored BatchNorm or Dropout
        would recompute in training mode): its free executors are let go first, so that
        the CachedOp's arrays, kept for a backward, replace theirs rather than add to them.
        They are bound again at the next training call."""
        if not any(ex.free() for ex in self.executors):
            return
        if not self._said_predicting:
            self._said_predicting = True
            log.info(f"mxmirror: gluon {self.block.name} recorded for prediction "
                     f"(record(train_mode=False)): the block runs itself, its planned "
                     f"executors let go meanwhile and bound again at its next training call")
        self.let_go()

    def fell_back(self) -> None:
        """A call mxmirror itself runs unplanned (a plan that does not pay, an input it
        cannot take): the block's later calls follow without another line."""
        self._own_fallback = calls.backwards()

    @property
    def decisions(self) -> list[tuple[Any, bool]]:
        """(plan, used) for every signature and situation planned so far: a plan that
        would not pay is kept too (used False), policy none has no plan."""
        out = []
        for situation, decided in self._decided.items():
            out.append((decided if decided is not False else self._unused[situation],
                        decided is not False))
        return out

    @property
    def executors(self) -> list[PlannedExecutor]:
        """Every executor bound so far (for a look at their plans)."""
        return [ex for pool in self._executors.values() for ex in pool]

    def planned_call(self, args: tuple, kwargs: dict) -> Any:
        """The outputs of a planned call, or None where the block should run itself (its
        plan would not pay). A PlanError says what a planned call cannot take."""
        ctx = first_context((args, list(kwargs.values())))
        if ctx is not None:
            self._count_call(str(ctx))
        if ctx is not None and calls.plain_call_pending(self.block, ctx):
            # so are the rest until backward(): checked first, as the cheapest (a loop of
            # 200 calls of a plan that does not pay takes this path 199 times)
            if not self._said_plain and self._own_fallback != calls.backwards():
                self._said_plain = True
                log.info(f"mxmirror: gluon {self.block.name} trained unplanned until "
                         f"backward(): the block itself was called in this record()")
            return None
        given = CallArgs(args, kwargs)
        why = unsupported(given)
        if why:
            raise PlanError(why)
        ctx = given.arrays[0].context
        sources = [calls.source_of(x, i) for i, x in enumerate(given.arrays)]
        self._finish_deferred_init(args, kwargs)
        params = self._by_name()
        reqs = tuple(s.req for s in sources)
        key = (str(ctx), given.structure(),
               tuple((x.shape, dtype_name(x.dtype)) for x in given.arrays), reqs,
               tuple((n, p.grad_req, dtype_name(p.dtype)) for n, p in sorted(params.items())))
        waiting = calls.waiting_on(self, ctx)
        mine = [c.executor for c in waiting if c.executor in self._executors.get(key, [])]
        plan, sig, share = self._plan(key, given, reqs, params, bool(waiting), bool(mine))
        if plan is False:
            self.fell_back()
            return None
        if share:
            executor = mine[-1]
            if len(self._executors[key]) > 1:  # free ones of its signature are not needed
                self._forget(str(ctx), key)  # (checked once, not at every call of a loop)
            executor.take_over()
        else:
            executor = self._executor(key, plan, sig, given, reqs, params, ctx)
        outputs = executor.forward(given.arrays)
        # committed only now, so that a call that fails above leaves nothing behind
        sources = [calls.remark(s) for s in sources]
        for s in sources:
            if s.kind == "leaf":
                s.array._fresh_grad = False  # set again by the backward() that reaches it
        for _, p in executor.trained:  # fresh again when backward() writes it
            p.data(ctx)._fresh_grad = False
        calls.Call(self, executor, sources, outputs)
        from mxnet.gluon.block import _regroup

        return _regroup(outputs, sig.fmt)

    def _plan(self, key: tuple, given: CallArgs, reqs: tuple, params: dict,
              others: bool, same: bool) -> tuple:
        """(plan or None for policy none, or False: not worth it; the call's Signature;
        whether the call shares the executor of a waiting call of its signature, `same`:
        there is one)."""
        if key not in self._plans:
            self._plans[key] = signature(self.block, given, reqs, params, self.policy,
                                         self.budget, self.quiet)
        sig = self._plans[key]
        shapes = sig.shapes
        if dict(self.block._flags).get("static_alloc") and sig.graph.auxiliary:
            # measured: plain Gluon's statistics show one update after two steps on one
            # context and none on two, where an executor's show two (tests/
            # test_gluon_patterns.py): no plan reproduces that
            if not self._said_static:
                self._said_static = True
                log.info(f"mxmirror: gluon {self.block.name} trained unplanned: hybridized "
                         f"with static_alloc=True, MXNet's CachedOp updates its auxiliary "
                         f"states (BatchNorm statistics) otherwise than an executor does")
            self._forget(key[0])  # bound before it was hybridized so: they would only hold
            return False, sig, False
        # plain Gluon's backward holds a gradient term of every Parameter per call where it
        # sums them with ElementWiseSum; from CHAIN_FROM calls, chained, it may not
        credited = max(self._records[key[0]][1:]) < CHAIN_FROM
        sharing = same and sig.rerunnable
        situation = (key, others, credited, sharing)
        if situation not in self._decided:
            trained = [params[n] for n in sig.graph.arguments
                       if n in params and params[n].grad_req != "null"]
            ctx = given.arrays[0].context
            # a second call beside this one: its input gradients, a gradient buffer per
            # trained Parameter (the second executor's)
            terms = nbytes([p.data(ctx) for p in trained])
            second = None if others else sig.copies + nbytes(
                [x for x, r in zip(given.arrays, reqs) if r == "null" and calls.is_float(x)]
            ) + terms
            plan, use, loop, share = choose_plan(self, sig, new_buffer_bytes(trained, ctx),
                                                 second, terms if credited else 0, others,
                                                 self._said, sharing)
            self._decided[situation] = plan if use else False
            self._loops[situation] = loop
            self._shares[situation] = share
            if not use:
                self._unused[situation] = plan
        plan = self._decided[situation]
        if plan is False and others:
            # beside a planned call of this record(): a planned call followed by unplanned
            # ones sums the Parameters' gradients otherwise than plain Gluon (for 3 to 5
            # calls: measured), so this one is planned too, though it does not pay
            if key not in self._beside:
                self._beside.add(key)
                log.info(f"mxmirror: gluon {self.block.name} {shapes_text(shapes)} planned "
                         f"beside the planned call waiting for backward() in this record(), "
                         f"though it does not pay there: a planned call followed by unplanned "
                         f"ones would not sum the Parameters' gradients as plain Gluon does; "
                         f"the next record() trains the block unplanned")
            return self._unused[situation], sig, False
        if plan is not False and not self._loops[situation] and \
                self._records[key[0]][2] != 1:
            # planned once records() have called it once each, which no later one can
            # change: the executors bound on this context are let go
            self._forget(key[0])
            return False, sig, False
        return plan, sig, self._shares[situation]

    def let_go(self) -> None:
        """Its free executors let go, their memory given back to the system: the block is
        trained otherwise now (the hook's policy changed, or the hook is off)."""
        for ctx in {key[0] for key in self._executors}:
            self._forget(ctx)

    def _forget(self, ctx: str, only: tuple | None = None) -> None:
        """Let go of the free executors on `ctx` (of signature `only`, if given; and the
        gradient buffers only they used), their memory given back to the system."""
        let_go = []
        for key, pool in self._executors.items():
            if key[0] == ctx and only in (None, key):
                let_go += [ex for ex in pool if ex.free()]
                pool[:] = [ex for ex in pool if not ex.free()]
        forget(let_go)
        if let_go:
            del let_go  # no reference left: the executors' arrays are freed, then given back
            release_freed()

    def _count_call(self, ctx: str) -> None:
        """Count the block's calls per record(): a first call whose plan pays alone but
        not beside a second one is planned only where no earlier record() called the block
        more than once (and some record() did call it)."""
        record = self._records.setdefault(ctx, [-1, 0, 0])
        if record[0] != calls.backwards():  # a new record()
            record[:] = [calls.backwards(), 0, max(record[1:])]
        record[1] += 1

    def _executor(self, key: tuple, plan: Any, sig: Signature, given: CallArgs,
                  reqs: tuple, params: dict, ctx: Any) -> PlannedExecutor:
        """A free executor of this signature, bound if none is."""
        mx = load_mxnet()
        pool = self._executors.setdefault(key, [])
        for ex in list(pool):
            if ex.free():
                if not ex.current(params):
                    pool.remove(ex)  # its Parameters' arrays were replaced (cast, reset_ctx)
                elif usable(ex):  # else a waiting call writes a gradient where it would
                    return ex
        ex = PlannedExecutor(sig.symbol, given.names, given.arrays, reqs, params, ctx, plan,
                             sig.random)
        pool.append(ex)
        args, kwargs = given.rebuilt(given.arrays)
        if not self.block._cached_op_args and not kwargs and not _own_call(self.block):
            # HybridBlock.export saves the Parameters listed when the block builds its
            # CachedOp, which a block only ever called planned never does: an empty file.
            # (A block with its own __call__, an rnn layer, builds it from other arguments.)
            with mx.autograd.pause():
                self.block._build_cache(*args)
        return ex

    def _by_name(self) -> dict:
        """The block's Parameters by name (collected once: Gluon's collect_params walks
        every child and checks its containers, which a loop of 200 calls feels)."""
        if self._collected is None:
            self._collected = {p.name: p for p in self.block.collect_params().values()}
        return self._collected

    def _finish_deferred_init(self, args: tuple, kwargs: dict) -> None:
        """Parameters waiting for shapes get them from the inputs as the block's first call
        would (HybridBlock._build_cache): in the order of its graph's inputs, only those it
        reads (in another order each draws other initial values: plain Gluon's differed).
        What fails here is the block's own error (BlockError): its own call fails the same
        way, and a Parameter half initialized cannot be tried again."""
        mx = load_mxnet()
        params = self._by_name()
        if all(p._deferred_init == () for p in params.values()):
            return
        try:
            with mx.autograd.pause():
                if kwargs:  # a block whose own __call__ takes keywords (rnn layers): run it
                    self.block(*args, **kwargs)
                    return
                _, graph = self.block._get_graph(*args)  # kept for its own cache, as a call's
                self.block._deferred_infer_shape(*args)
                for name in graph.list_inputs():
                    if name in params:
                        params[name]._finish_deferred_init()
        except Exception as e:
            raise BlockError(e) from e


class BlockError(Exception):
    """An error of the block's own first call (its deferred initialization), raised as the
    block raises it: plain Gluon's call fails the same way at the same point."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _own_call(block: Any) -> bool:
    """The block's class (below HybridBlock) defines __call__: HybridBlock.__call__ gets
    other arguments than the block's caller gives (rnn layers add their states)."""
    hybrid = load_mxnet().gluon.HybridBlock
    return any("__call__" in vars(c) for c in type(block).__mro__
               if issubclass(c, hybrid) and c is not hybrid)
