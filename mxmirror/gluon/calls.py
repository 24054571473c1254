"""The planned calls waiting for a backward, and where each input's gradient goes.

A planned call is not an operator of autograd's tape: its outputs are marked as autograd
variables (autograd writes their gradients into the call's arrays and stops there), and
backward() (backward.py) runs the call's executor backward itself. So what autograd
would have known from the tape is kept here: per call input, where its gradient goes (an
earlier pending call's output, a variable the user marked, or an input computed by other
recorded operators, re-marked at the call so that its later uses collect their gradients
in one array and its history is run once, after every planned call that reads it), and
which calls may still be reached. Every other module reads this one registry.
"""

from __future__ import annotations

import collections
import sys
import threading
import weakref
from typing import Any

from mxmirror.adapter.symbol import load_mxnet
from mxmirror.errors import PlanError
from mxmirror.gluon.inputs import first_context, recorded, trained_variable, variable_name

lock = threading.RLock()  # around every read or change of the registry

_pending: list[Call] = []  # in call order
_outputs: dict[int, tuple[Call, int]] = {}  # an output's handle -> (its call, its index)
_remarked: dict[int, Remarked] = {}  # a re-marked input's handle -> its entry
# the output variables of calls let go as abandoned (the latest): a backward() that still
# reaches one is refused rather than run without that call's gradients
_let_go: collections.OrderedDict[str, str] = collections.OrderedDict()  # var -> block
LET_GO_KEPT = 4096
_backwards = [0]  # backward() calls so far
_plain_calls: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # block -> {ctx: n}


def backwards() -> int:
    """How many backward() calls have run: a call of the block itself stays the rule for
    the block's later calls until the next one."""
    return _backwards[0]


def backward_ran() -> None:
    _backwards[0] += 1


def watch(block: Any) -> None:
    """Note every recorded call of the block itself: its forward wrapped once, on the
    instance (a forward pre-hook made every later hybridize() of it warn that its hooks
    would not take effect in a parent)."""
    if block not in _plain_calls:
        _plain_calls[block] = {}
        forward = block.forward

        def noted_forward(*args: Any, **kwargs: Any) -> Any:
            _note_plain_call(block, args)
            return forward(*args, **kwargs)

        block.forward = noted_forward


def _note_plain_call(block: Any, inputs: tuple) -> None:
    mx = load_mxnet()
    if not (mx.autograd.is_recording() and mx.autograd.is_training()):
        return
    ctx = first_context(inputs)
    if ctx is not None:  # not a graph being traced
        _plain_calls[block][str(ctx)] = backwards()


def plain_call_pending(block: Any, ctx: Any) -> bool:
    """The block itself was called in training since the last backward(): its later calls
    run unplanned too, so that plain Gluon's autograd orders their backwards (BatchNorm
    updates its statistics in backward) as it would order plain calls."""
    return _plain_calls.get(block, {}).get(str(ctx)) == backwards()


class Remarked:
    """An input computed by other recorded operators: re-marked as a variable at its first
    planned call, its old history kept in `old` (a reshape of it recorded on the tape)."""

    def __init__(self, x: Any, graph: dict) -> None:
        mx = load_mxnet()
        self.x = x
        self.graph = graph  # x's history as recorded (JSON), for the replay
        self.old_name = graph["nodes"][graph["heads"][0][0]]["name"]
        self.old = x.reshape(x.shape)  # recorded: x's history, run by a later backward
        self.buffer = mx.nd.empty(x.shape, x.context, dtype=x.dtype)
        mx.autograd.mark_variables([x], [self.buffer], "write")
        self.var = variable_name(x)
        self.vars = {n["name"] for n in graph["nodes"] if trained_variable(n)}
        self.terms: dict[Call, Any] = {}  # the planned calls' gradients of x
        self.saved: list = []  # gradients of x an earlier pass of a backward wrote
        x._fresh_grad = False


class Source:
    """Where a call input's gradient goes: nowhere ('none'), an earlier call's output
    ('output': call, index), a variable the user marked ('leaf': the array) or a
    re-marked input ('remarked': its entry)."""

    def __init__(self, kind: str, call: Call | None = None, index: int = 0,
                 array: Any = None, entry: Remarked | None = None, var: str = "") -> None:
        self.kind, self.call, self.index, self.array, self.entry, self.var = \
            kind, call, index, array, entry, var

    @property
    def req(self) -> str:
        return "null" if self.kind == "none" else "write"


class Call:
    """One planned call waiting for (or kept after, with retain_graph) its backward."""

    def __init__(self, planned: Any, executor: Any, sources: list[Source],
                 outputs: list) -> None:
        mx = load_mxnet()
        self.planned, self.executor, self.sources = planned, executor, sources
        self.outputs = outputs  # what the caller got; the float ones are marked
        self.marked = [o if is_float(o) else None for o in outputs]
        self.buffers = [None if o is None else mx.nd.empty(o.shape, o.context, dtype=o.dtype)
                        for o in self.marked]
        marked = [(o, b) for o, b in zip(self.marked, self.buffers) if o is not None]
        if marked:
            mx.autograd.mark_variables([o for o, _ in marked], [b for _, b in marked], "write")
        self.vars = [None if o is None else variable_name(o) for o in self.marked]
        self.saved: list[list] = [[] for _ in outputs]  # earlier passes' gradients
        self.terms: list[dict[Call, Any]] = [{} for _ in outputs]  # planned consumers'
        self.missed = 0  # backwards since the call that did not reach it
        self.retained = False  # run, and kept by backward(retain_graph=True)
        self.kept_inputs: list | None = None  # where another call took its executor over
        executor.calls.append(self)
        executor.resident = self
        with lock:
            _pending.append(self)
            for k, o in enumerate(self.marked):
                if o is not None:
                    _outputs[o.handle.value] = (self, k)

    def reached(self) -> bool:
        """autograd's last pass reached one of its outputs (marked fresh at its start)."""
        return any(o is not None and o._fresh_grad for o in self.marked)

    def abandoned(self) -> bool:
        """No backward can reach it any more, as far as can be known: a backward() has
        passed it by, and nothing but this call holds its outputs."""
        if self.missed == 0:
            return False
        for k in range(len(self.outputs)):  # held by outputs, marked (the float ones) and
            # getrefcount's argument alone (a loop variable would be one more)
            if sys.getrefcount(self.outputs[k]) > 2 + (self.marked[k] is not None):
                return False
        return True

    def let_go(self) -> None:
        """Abandoned (see abandoned()): dropped, its output variables remembered."""
        with lock:
            for v in self.vars:
                if v is not None:
                    _let_go[v] = self.planned.block.name
                    if len(_let_go) > LET_GO_KEPT:
                        _let_go.popitem(last=False)
        self.drop()

    def drop(self) -> None:
        """Done: its outputs become plain arrays again, as autograd leaves a call's
        outputs once its backward has run, and its executor is free."""
        with lock:
            if self in _pending:
                _pending.remove(self)
            for o in self.marked:
                if o is not None:
                    _outputs.pop(o.handle.value, None)
                    _unmark(o)
            if self in self.executor.calls:
                self.executor.calls.remove(self)
            if self.executor.resident is self:  # nothing of it held: no cycle left either
                self.executor.resident = None
            self.kept_inputs = None


def is_float(x: Any) -> bool:
    """A float array: the outputs of a call marked for autograd (each with a buffer)."""
    import numpy as np

    return np.dtype(x.dtype).kind == "f"


def _unmark(x: Any) -> None:
    """x without its autograd variable (autograd clears a call's outputs after backward):
    its handle swapped for a detached one on the same memory."""
    plain = x.detach()
    x.handle, plain.handle = plain.handle, x.handle


def source_of(x: Any, i: int) -> Source:
    """Where the gradient of input i (x) of a new planned call goes. An input computed by
    recorded operators must reach, through them, only outputs of pending planned calls
    or re-marked inputs: a variable mxmirror does not hold (another block's Parameter, an
    attached input) could be written twice, by autograd's pass and by the pass that runs
    the input's history, when the input has an earlier use too."""
    with lock:
        if x.handle.value in _outputs:
            call, k = _outputs[x.handle.value]
            return Source("output", call=call, index=k)
        if x.handle.value in _remarked:
            return Source("remarked", entry=_remarked[x.handle.value])
    graph = recorded(x)
    if graph is None:
        return Source("none")
    nodes = graph["nodes"]
    if len(nodes) == 1:
        if not trained_variable(nodes[0]):
            return Source("none")
        return Source("leaf", array=x, var=nodes[0]["name"])
    wanted = {n["name"] for n in nodes if trained_variable(n)}
    if not wanted:
        return Source("none")
    with lock:
        held = {v for call in _pending for v in call.vars if v} | \
            {e.var for e in _remarked.values()}
    foreign = wanted - held
    if foreign:
        ops = sorted({n["op"] for n in nodes} - {"null"})
        raise PlanError(f"input {i} is computed by operators trained unplanned "
                        f"({', '.join(ops[:5])}) from variables that need their gradient "
                        f"(Parameters of a block trained unplanned, an attached input)")
    return Source("history", array=x, entry=None)


def remark(source: Source, graph: dict | None = None) -> Source:
    """A 'history' source committed: its input re-marked (once) and its entry kept."""
    if source.kind != "history":
        return source
    x = source.array
    with lock:
        entry = _remarked.get(x.handle.value)
        if entry is None:
            entry = Remarked(x, graph or recorded(x))
            _remarked[x.handle.value] = entry
    return Source("remarked", entry=entry)


def some_let_go() -> bool:
    with lock:
        return bool(_let_go)


def let_go_reached(names: set[str]) -> str | None:
    """The block of a call let go as abandoned whose outputs a graph with these node names
    reads, if any."""
    with lock:
        return next((block for v, block in _let_go.items() if v in names), None)


def pending() -> list[Call]:
    with lock:
        return list(_pending)


def remarked() -> list[Remarked]:
    with lock:
        return list(_remarked.values())


def forget(entry: Remarked) -> None:
    """A re-marked input whose history has run: a plain array again."""
    with lock:
        _remarked.pop(entry.x.handle.value, None)
    _unmark(entry.x)


def pending_of(planned: Any) -> list[Call]:
    """The pending calls of one PlannedBlock."""
    with lock:
        return [c for c in _pending if c.planned is planned]


def waiting_on(planned: Any, ctx: Any) -> list[Call]:
    """The calls of one PlannedBlock on `ctx` waiting for their backward (not kept by
    retain_graph), the abandoned ones dropped: a record() never followed by a backward()
    leaves its calls pending until a backward() passes them by."""
    waiting = []
    for c in pending_of(planned):
        if c.abandoned():
            c.let_go()
        elif str(c.executor.ctx) == str(ctx) and not c.retained:
            waiting.append(c)
    return waiting
