"""One planned executor of a block's graph, bound on the block's own arrays, and whether
a plan is worth binding at all.

Every backward runs from the caller's thread, after autograd's own and before backward()
returns (backward.py), so an executor can read the Parameters' own arrays (a Trainer
step queued later is ordered after it by MXNet's engine) and write their gradients: an
executor writes a Parameter's gradient array where no executor waiting for its backward
beside it does; beside one (a second call, a tied weight) the second and third get a
buffer each, the fourth and later share one (a term is copied before another executor of
the same backward writes it again).
What a call holds besides MXNet's own figure are its input and output copies and their
gradients, a second to fourth executor of a Parameter its gradient buffers, the executor's
own node structures beyond the CachedOp's and, with MKL-DNN on, the default-layout copies
the executor's storage fallback keeps (plain Gluon's CachedOp frees its own after each op;
adapter/executor_memory.py); a plan whose saving does not cover them is not bound.
"""

from __future__ import annotations

import weakref
from typing import Any

from mxmirror.adapter.symbol import load_mxnet
from mxmirror.errors import PlanError
from mxmirror.gluon.inputs import nbytes, shapes_text, variable_name
from mxmirror.ir.graph import Graph
from mxmirror.log import log, mb_text
from mxmirror.runtime.aux_order import order_aux_updates
from mxmirror.runtime.binds import unhooked
from mxmirror.sim import memory_plan

SHARED_AFTER = 4  # the executors of a Parameter from the 4th share one gradient buffer

_live: dict[str, weakref.WeakSet] = {}  # context -> every live executor bound there
# Parameter -> {context: [the gradient arrays of executors that do not write p.grad]}
_grad_targets: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _buffers(p: Any, ctx: Any) -> list:
    return _grad_targets.setdefault(p, {}).setdefault(str(ctx), [])


def _busy_arrays(ctx: Any) -> set[int]:
    """ids of the gradient arrays that executors waiting for their backward on ctx write
    (each array is one Parameter's: its gradient or one of its buffers)."""
    busy: set[int] = set()
    for ex in list(_live.get(str(ctx), ())):
        if not ex.free():
            busy |= ex.targets
    return busy


def _free_target(p: Any, ctx: Any, busy: set[int]) -> int | None:
    """Where an executor bound now writes p's gradient: None for `p.grad(ctx)`, else the
    index of a buffer. The first array no executor waiting for its backward writes (so
    executors of calls that never wait together, other input shapes, all write the
    gradient itself); the last buffer is shared."""
    if id(p.grad(ctx)) not in busy:
        return None
    buffers = _buffers(p, ctx)
    for index in range(SHARED_AFTER - 2):
        if index >= len(buffers) or id(buffers[index]) not in busy:
            return index
    return SHARED_AFTER - 2


def new_buffer_bytes(trained: list, ctx: Any) -> int:
    """Bytes of the gradient buffers an executor bound now on ctx would allocate for the
    Parameters it trains (`trained`): beside a second, third and fourth executor waiting
    for its backward, one of every Parameter, the size of its gradient."""
    busy = _busy_arrays(ctx)
    total = 0
    for p in trained:
        index = _free_target(p, ctx, busy)
        if index is not None and index >= len(_buffers(p, ctx)):
            total += nbytes([p.data(ctx)])
    return total


def _grad_target(p: Any, ctx: Any, busy: set[int]) -> tuple[Any, bool]:
    """The array an executor bound now writes `p`'s gradient into, and whether other
    executors write it too while it waits (the shared buffer)."""
    mx = load_mxnet()
    index = _free_target(p, ctx, busy)
    if index is None:
        return p.grad(ctx), False
    buffers = _buffers(p, ctx)
    while len(buffers) <= index:
        buffers.append(mx.nd.zeros(p.shape, ctx, dtype=p.dtype))
    return buffers[index], index == SHARED_AFTER - 2


def forget(executors: list) -> None:
    """Executors no call will use again: the gradient buffers of a Parameter are let go
    once no other executor of it is left on that context."""
    for ex in executors:
        _live.get(str(ex.ctx), set()).discard(ex)
    trained_left = {ctx: {id(q) for other in list(left) for _, q in other.trained}
                    for ctx, left in _live.items()}  # on each context, by the executors left
    for ex in executors:
        for _, p in ex.trained:
            if id(p) not in trained_left.get(str(ex.ctx), ()):
                _buffers(p, ex.ctx).clear()


def usable(executor: PlannedExecutor) -> bool:
    """No executor waiting for its backward writes a gradient where this one would (the
    shared buffer aside): else a call needs another executor."""
    own = executor.own_targets
    return not own or all(ex is executor or ex.free() or own.isdisjoint(ex.targets)
                          for ex in list(_live.get(str(executor.ctx), ())))


def retained_bytes(graph: Graph) -> int:
    """What plain Gluon holds per call between its forward and its backward: every forward
    value a backward reads (autograd keeps each op's saved inputs and outputs)."""
    held = set()
    for n in graph.nodes:
        tpl = n.template
        if n.is_variable or tpl is None:
            continue
        for tn in tpl.nodes:
            for ref in tn.inputs:
                if ref[0] == "in" and ref[1] < len(n.inputs):
                    src = n.inputs[ref[1]]
                    if not graph.nodes[src[0]].is_variable:
                        held.add(tuple(src[:2]))
                elif ref[0] == "out":
                    held.add((n.id, ref[1]))
    return sum(graph.nodes[k].element_counts[i] for k, i in held) * memory_plan.ELEMENT_BYTES


class PlannedExecutor:
    """MXNet's executor (or the segmented one) for a plan of the block's graph, on the
    Parameters' own data, aux and (first executor) gradient arrays."""

    def __init__(self, symbol: Any, names: list[str], inputs: list, input_reqs: tuple,
                 params: dict, ctx: Any, plan: Any, random: bool) -> None:
        mx = load_mxnet()
        self.names, self.ctx, self.plan = names, ctx, plan
        self.calls: list = []  # the pending calls it serves (several where they share it)
        self.resident = None  # the call whose forward values it holds
        unknown = [n for n in symbol.list_arguments() + symbol.list_auxiliary_states()
                   if n not in names and n not in params]
        if unknown:
            raise PlanError(f"the block's graph reads {', '.join(unknown)}, which are neither "
                            f"its inputs nor its Parameters")
        args, grads, reqs = {}, {}, {}
        for name, x, req in zip(names, inputs, input_reqs):
            args[name] = mx.nd.empty(x.shape, ctx, dtype=x.dtype)
            reqs[name] = req
        self.trained = []  # (name, Parameter) of the arguments that get a gradient
        for name in symbol.list_arguments():
            if name in args:
                continue
            p = params[name]
            args[name] = p.data(ctx)
            reqs[name] = p.grad_req
            if p.grad_req != "null":
                self.trained.append((name, p))
        self.aux = {n: params[n].data(ctx) for n in symbol.list_auxiliary_states()}
        self._grads = {}  # Parameter name -> the array this executor writes its gradient in
        busy, own = _busy_arrays(ctx), set()
        for name, p in self.trained:
            self._grads[name], shared = _grad_target(p, ctx, busy)
            grads[name] = self._grads[name]
            if not shared:
                own.add(id(self._grads[name]))
        # ids of the arrays it writes gradients in, and of those no other executor waiting
        # beside it may write (all but the shared buffer)
        self.targets = frozenset(id(t) for t in self._grads.values())
        self.own_targets = frozenset(own)
        _live.setdefault(str(ctx), weakref.WeakSet()).add(self)
        for name, req in zip(names, input_reqs):
            if req != "null":
                grads[name] = mx.nd.zeros(args[name].shape, ctx, dtype=args[name].dtype)
        # grad_req 'add' adds in the kernel where the executor writes the Parameter's own
        # gradient, as the block's CachedOp does; a buffer gets a term backward() adds
        for name, p in self.trained:
            reqs[name] = "add" if p.grad_req == "add" and self.writes(name) else "write"
        kw = dict(args=args, args_grad=grads, grad_req=reqs, aux_states=self.aux)
        if plan is None:
            self.exec = order_aux_updates(unhooked("bind")(symbol, ctx, **kw))
        else:
            self.exec = plan.bind(ctx, symbol=symbol, **kw)
        self.input_grads = [self.exec.grad_dict.get(n) if r != "null" else None
                            for n, r in zip(names, input_reqs)]
        self.inputs_order = symbol.list_inputs()  # data and Parameters, as the CachedOp's
        self.random = random  # the graph draws random numbers (signature.Signature)
        self.param_vars = {name: variable_name(p.data(ctx)) for name, p in self.trained}
        # what a call holds besides MXNet's figure: its input copies, their gradients, and
        # the copies of its outputs it gives out
        self.own_bytes = nbytes([args[n] for n in names]) + nbytes(
            [g for g in self.input_grads if g is not None]) + nbytes(self.exec.outputs)

    def writes(self, name: str) -> bool:
        """It writes Parameter `name`'s own gradient array (not a buffer)."""
        p = dict(self.trained)[name]
        return self._grads[name] is p.grad(self.ctx)

    def grad_term(self, name: str) -> Any:
        """The array holding this executor's gradient of Parameter `name` after backward."""
        return self._grads[name]

    def current(self, params: dict) -> bool:
        """Still bound to the Parameters' own arrays (cast or reset_ctx replace them)."""
        ctx = self.ctx
        if any(params[n].data(ctx) is not a for n, a in self.aux.items()):
            return False
        for name, p in self.trained:
            target = self._grads[name]
            if params[name].data(ctx) is not self.exec.arg_dict[name] or not (
                    target is p.grad(ctx) or
                    any(target is b for b in _buffers(p, ctx))):
                return False
        return True

    def forward(self, inputs: list) -> list:
        """Copy the inputs in, run the training forward, copies of the outputs."""
        mx = load_mxnet()
        with mx.autograd.pause(train_mode=True):
            for name, x in zip(self.names, inputs):
                x.copyto(self.exec.arg_dict[name])
            self.exec.forward(is_train=True)
            return [o.copy() for o in self.exec.outputs]

    def take_over(self) -> None:
        """Before another call's forward overwrites the one it holds: that call's inputs
        kept (its backward runs its forward again from them)."""
        held = self.resident
        if held is not None and held in self.calls and held.kept_inputs is None:
            held.kept_inputs = [self.exec.arg_dict[n].copy() for n in self.names]

    def hold(self, call: Any) -> None:
        """The forward values of `call` in place for its backward: its forward run again
        where another call's replaced them (from its kept inputs) or where a backward has
        run since (a graph kept with retain_graph)."""
        if self.resident is call and not call.retained:
            return
        if self.resident is not call:
            self.take_over()
            for name, x in zip(self.names, call.kept_inputs):
                x.copyto(self.exec.arg_dict[name])
        self.resident = call
        with load_mxnet().autograd.pause(train_mode=True):
            self.exec.forward(is_train=True)

    def backward(self, head_grads: list) -> None:
        self.exec.backward(out_grads=head_grads)

    def free(self) -> bool:
        """No call needs it any more: each one's backward done, or the call abandoned."""
        for call in list(self.calls):
            if call.abandoned():
                call.let_go()
        return not self.calls



def choose_plan(owner: Any, sig: Any, buffers: int, second: int | None, terms: int,
                others_pending: bool, said: dict,
                sharing: bool = False) -> tuple[Any, bool, bool, bool]:
    """Whether to bind the plan of a call signature (`sig`, signature.Signature; its plan
    None for policy none), whether a second call beside it would be bound too, and
    whether this call shares the executor of a call of its signature waiting beside it
    (`sharing`: one does, and the graph can run its forward again: no random op, MXNet's
    executor). A call sharing an executor holds its output copies and their gradients and
    the inputs of the call it takes the executor from (its backward runs that call's
    forward again from them: one more forward per call), less than a further executor
    with its gradient buffers: it is chosen wherever it holds less than plain Gluon keeps
    for the call (the step loop's pattern: one executor for every step). A plan
    is used only when it saves more than what a call holds besides MXNet's figure: its
    copies (`sig.copies`: inputs, outputs and their gradients), the Parameters' gradient
    buffers its bind would add (`buffers`: a second to fourth executor of the Parameters)
    and what its executor holds outside MXNet's figure that the CachedOp does not (`sig.own`:
    its nodes' structures, MKL-DNN layout copies, less the CachedOp's own beyond it); beside
    another call waiting for its backward, only when the planned executor, the copies, the
    buffers and a further executor's own (`sig.own.further`) hold less than plain Gluon
    keeps for one call (`sig.kept`) and the gradient
    terms its backward makes for it (`terms`: one of every Parameter the call trains,
    summed with the other calls' afterwards; measured: a Dense layer's 64 MB weight adds
    64-70 MB of peak RSS per further call, scripts/gluon_memory_notes.py). For a first
    call, `second` is what a second call would add besides its executor: where that would
    not be planned, a first call is planned only where earlier record()s called the block
    once (the caller's rule: a planned call followed by the block itself in one record()
    sums the Parameters' gradients otherwise than plain Gluon, 3 to 5 terms: measured). One
    log line per input shape says which, and why (another where a later call decides
    otherwise); `said` keeps the verdicts logged, by shapes."""
    shapes = shapes_text(sig.shapes)
    where = f"mxmirror: gluon {owner.block.name} {shapes}"
    p, copies, kept, own = sig.plan, sig.copies, sig.kept, sig.own
    if p is None:
        if shapes not in said:
            said[shapes] = True
            log.info(f"{where} policy=none (unplanned executor)")
        return None, True, True, False
    summary = p.summary().replace("mxmirror: ", "")
    extra = (f"PlannedBlock's input and output copies and their gradients "
             f"({mb_text(copies / 2**20)})")
    if buffers:
        extra += f" and the Parameters' gradient buffers ({mb_text(buffers / 2**20)})"
    # a first executor stands in for the CachedOp; one beside it adds to it (own.further)
    extra += f" and, of its executor outside MXNet's figure, {own.text(not others_pending)}"
    plain = f"plain Gluon keeps for a call ({mb_text(kept / 2**20)})"
    if terms:
        plain += f" with the gradient terms of its Parameters ({mb_text(terms / 2**20)})"
    share = False
    if others_pending:
        if sharing and copies < kept + terms:
            use = loop = share = True
            why = (f"another call of its signature waits for backward(): sharing its "
                   f"executor, the call's copies and the inputs it keeps "
                   f"({mb_text(copies / 2**20)}) hold less than {plain}, each call's "
                   f"backward running its forward again")
        else:
            use = loop = p.planned_bytes + copies + buffers + own.further < kept + terms
            why = (f"another call of the block waits for backward(): the planned executor "
                   f"({mb_text(p.planned_bytes / 2**20)}) with {extra} "
                   f"{'hold less' if use else 'would hold more'} than {plain}")
            if not use and sig.rerunnable:
                use = loop = True
                why += (", bound all the same for the later calls of its signature to share "
                        "(a planned call followed by unplanned ones would not sum the "
                        "Parameters' gradients as plain Gluon does)")
    else:
        saving = p.baseline_bytes - p.planned_bytes
        use = saving > copies + buffers + own.total
        shares = sig.rerunnable and copies < kept + terms
        loop = shares or p.planned_bytes + second + own.further < kept + terms
        why = (f"the plan saves {mb_text(saving / 2**20)}, "
               f"{'more' if use else 'not more'} than {extra}")
        if use and shares:
            why += (f"; a further call in the same record() shares its executor, holding "
                    f"its copies and the inputs it keeps ({mb_text(copies / 2**20)}) against "
                    f"{plain}: each call's backward runs its forward again")
        if use and not loop:
            why += (f"; a second call in the same record() would not pay beside it (its "
                    f"planned executor with its copies and a gradient buffer per Parameter: "
                    f"{mb_text((p.planned_bytes + second + own.further) / 2**20)}; {plain}), "
                    f"and a planned call followed by unplanned ones would not sum the "
                    f"Parameters' gradients as plain Gluon does: a record() that calls the "
                    f"block more than once trains it unplanned, and it is planned from the "
                    f"second record() on where each earlier one called it once")
    if said.get(shapes) != use:
        said[shapes] = use
        verdict = ("trained unplanned" if not use else "planned, sharing an executor"
                   if share else "planned" if loop else
                   "planned where each record() calls the block once")
        notes = p.notes if p.recomputed_ids else []  # else the summary says them
        log.info("; ".join([f"{where} {summary}: {verdict}, {why}", *notes]))
    return p, use, loop, share
