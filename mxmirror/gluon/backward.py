"""autograd's backward() and grad() as planned calls need them: wrapped once a
PlannedBlock exists.

A backward() that reaches planned calls runs in three parts, all from the caller's thread:
autograd's own backward, which stops at the planned calls' outputs (marked variables) and
writes their gradients; then, in the order plain Gluon's autograd would have run them
(order.py), each reached call's executor backward, and, where an input computed by
recorded operators has had every planned call that reads it run, autograd's backward of
that input's history with the summed gradient; last the Parameters' and marked inputs'
gradients, every sum with the terms and the operator MXNet would have used. Nothing runs
inside one of MXNet's engine callbacks and nothing waits for one, so no operator waits for
a resource held by an operator that waits for it (the deadlocks of MXNet 1.9.1 the earlier
design had to refuse). autograd.grad runs the same way and returns its gradients without
writing any (the Parameters' gradient arrays, which the executors write, are restored). A
graph kept with retain_graph=True keeps its calls: a later backward runs their forward
again first.
"""

from __future__ import annotations

import json
from typing import Any

import mxmirror.gluon.calls as calls
from mxmirror.adapter.symbol import load_mxnet, symbol_json
from mxmirror.errors import PlanError
from mxmirror.gluon.order import Node, from_json, replay
from mxmirror.gluon.sums import RunningSum, accumulate, combine

_originals: dict[str, Any] = {}  # MXNet's autograd.backward, NDArray.backward, autograd.grad


def wrap_backward() -> None:
    """Route autograd.backward, NDArray.backward and autograd.grad through planned calls."""
    mx = load_mxnet()
    if _originals:
        return
    _originals.update(backward=mx.autograd.backward, array=mx.nd.NDArray.backward,
                      grad=mx.autograd.grad)

    def backward(heads: Any, head_grads: Any = None, retain_graph: bool = False,
                 train_mode: bool = True) -> None:
        run(heads, head_grads, retain_graph, train_mode)

    def array_backward(self: Any, out_grad: Any = None, retain_graph: bool = False,
                       train_mode: bool = True) -> None:
        run([self], None if out_grad is None else [out_grad], retain_graph, train_mode)

    def grad(heads: Any, variables: Any, head_grads: Any = None, retain_graph: Any = None,
             create_graph: bool = False, train_mode: bool = True) -> Any:
        return run(heads, head_grads, create_graph if retain_graph is None else retain_graph,
                   train_mode, variables=variables, create_graph=create_graph)

    mx.autograd.backward = backward
    mx.nd.NDArray.backward = array_backward
    mx.autograd.grad = grad


def _listed(x: Any) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _graph(heads: list) -> dict | None:
    mx = load_mxnet()
    try:
        return json.loads(symbol_json(mx.sym.Group([mx.autograd.get_symbol(h) for h in heads])))
    except mx.base.MXNetError:
        return None


def run(heads: Any, head_grads: Any, retain_graph: bool, train_mode: bool,
        variables: Any = None, create_graph: bool = False) -> Any:
    """backward() (variables None) or autograd.grad() with planned calls pending."""
    heads = _listed(heads)
    if head_grads is not None:
        head_grads = _listed(head_grads)
    with calls.lock:
        try:
            pending = calls.pending()
            graph = _graph(heads) if pending or calls.some_let_go() else None
            names = {n["name"] for n in graph["nodes"]} if graph else set()
            gone = calls.let_go_reached(names)
            if gone is not None:
                raise PlanError(
                    f"backward() reaches the outputs of a planned call of {gone} that an "
                    f"earlier backward() passed by and that was let go since (its outputs "
                    f"were no longer held, so it looked abandoned): its gradients would be "
                    f"missing. Call backward() for each record() before the next record()'s "
                    f"backward(), or train this block unplanned (policy none)")
            reached = any(v in names for c in pending for v in c.vars if v) or \
                any(e.var in names or e.old_name in names for e in calls.remarked())
            if not reached:  # nothing planned on the way: autograd alone
                if variables is None:
                    return _originals["backward"](heads, head_grads, retain_graph, train_mode)
                return _originals["grad"](heads, variables, head_grads, retain_graph,
                                          create_graph, train_mode)
            if create_graph:
                raise PlanError("autograd.grad(create_graph=True) through a planned Gluon call "
                                "is not supported: a planned executor's backward is not "
                                "recorded for a second derivative; run the block unplanned "
                                "(policy none, or outside mxmirror run) for this computation")
            job = _Backward(heads, graph, pending, retain_graph, train_mode,
                            None if variables is None else _listed(variables))
            return job.run(head_grads)
        finally:
            calls.backward_ran()


class _Backward:
    """One backward() (or autograd.grad) through planned calls."""

    def __init__(self, heads: list, graph: dict, pending: list, retain_graph: bool,
                 train_mode: bool, variables: list | None) -> None:
        self.heads, self.graph, self.pending = heads, graph, pending
        self.retain, self.train_mode, self.variables = retain_graph, train_mode, variables
        self.names = {n["name"] for n in graph["nodes"]}
        self.entries = calls.remarked()
        self.call_nodes: dict[Any, Node] = {}
        self.leaves: dict[int, tuple] = {}  # id -> (marked input, its var, {call: grad})
        self.sums: dict[tuple, RunningSum] = {}  # (Parameter, ctx): its gradient's terms
        self.param_facts: dict[tuple, tuple] = {}  # (Parameter, ctx) -> (Parameter, context)
        self.shared: set = set()  # ((Parameter, ctx), id of an array): several reached
        # executors write that gradient term (the shared buffer), so an early term is copied
        self.given: dict[str, list] = {}  # autograd.grad: each pass's gradient by variable
        self.restore: dict[tuple, Any] = {}  # autograd.grad: gradient arrays to put back
        self.results: list[list] = [[] for _ in variables or []]
        self.flushed: set = set()

    def run(self, head_grads: Any) -> Any:
        shared = any(e.old_name in self.names for e in self.entries)
        for call in self.pending:
            if call.retained:  # what an earlier backward wrote is no term of this one
                for o in call.marked:
                    if o is not None:
                        o._fresh_grad = False
                for _, p in call.executor.trained:
                    p.data(call.executor.ctx)._fresh_grad = False
                for s in call.sources:
                    if s.kind == "leaf":
                        s.array._fresh_grad = False
        self._isolate_adds()
        self._pass(self.heads, head_grads, self.retain or shared, self.names)
        with load_mxnet().autograd.pause():  # backward() may be called inside record()
            self._after_autograd()
        if self.variables is not None:
            mx = load_mxnet()
            return [(combine(r) if len(r) > 1 else r[0].copy()) if r else
                    mx.nd.zeros(v.shape, v.context, dtype=v.dtype)  # arrays of the caller's
                    for r, v in zip(self.results, self.variables)]
        return None

    def _pass(self, heads: list, head_grads: Any, retain: bool, names: set) -> None:
        """One autograd pass: a backward, or for autograd.grad the gradients of the asked
        variables and of the marked arrays it reaches, kept by variable."""
        if self.variables is None:
            _originals["backward"](heads, head_grads, retain, self.train_mode)
            return
        mx = load_mxnet()
        asked = [(i, v) for i, v in enumerate(self.variables) if _name(v) in names]
        marked = [(c.vars[k], o) for c in self.pending for k, o in enumerate(c.marked)
                  if o is not None and c.vars[k] in names]
        marked += [(e.var, e.x) for e in self.entries if e.var in names]
        wanted = [v for _, v in asked] + [o for _, o in marked]
        if not wanted:
            return
        got = _originals["grad"](heads, wanted, head_grads, retain, False, self.train_mode)
        with mx.autograd.pause():
            for (i, _), g in zip(asked, got):
                self.results[i].append(g)
            for (name, _), g in zip(marked, got[len(asked):]):
                self.given.setdefault(name, []).append(g)

    def _autograd_terms(self, var: str, buffer: Any, marked: Any, saved: list) -> list:
        """What autograd's passes gave one marked array: kept copies and the buffer it
        wrote last (backward), or every pass's returned gradient (autograd.grad)."""
        if self.variables is not None:
            return list(self.given.get(var, []))
        return saved + ([buffer] if marked._fresh_grad else [])

    def _after_autograd(self) -> None:
        known, order_heads = self._replay_graph()
        order, self.contributors = replay(order_heads)
        self.known = known
        reached = [n.call for n in order if n.call is not None]
        self._keep_param_grads(reached)
        # an input's history runs once every planned call reading it has run (its node
        # in the order), and before any call whose output that history reads: all that
        # are ready then run in one pass, in the order they were recorded
        anchors = {e.old_name: e for e in self.entries}
        ready: list = []
        for node in order:
            if node.call is not None:
                if any(e.vars & set(node.call.vars) for e in ready):
                    self._flush(ready)
                    ready = []
                self._process(node.call)
            elif node.name in anchors and anchors[node.name].terms:
                ready.append(anchors[node.name])
        self._flush(ready)
        self._write_params()
        self._write_leaves()
        done = set(reached)
        for call in self.pending:
            if call in done:
                if self.retain:
                    call.retained = True
                    call.saved = [[] for _ in call.outputs]
                    call.terms = [{} for _ in call.outputs]
                else:
                    call.drop()
            else:
                call.missed += 1
        readers = {id(s.entry) for c in calls.pending() for s in c.sources if s.entry}
        for e in calls.remarked():  # no planned call waiting reads it: a plain array again
            if id(e) not in readers:
                calls.forget(e)

    # ------------------------------------------------------------------ the replayed graph
    def _replay_graph(self) -> tuple[dict, list]:
        """The recorded graph with every pending call as one node (as the CachedOp would
        be) and every re-marked input back on its history."""
        known, heads = from_json(self.graph)
        for e in self.entries:
            from_json(e.graph, known)
        replace: dict[str, Any] = {}
        for call in self.pending:
            for k, v in enumerate(call.vars):
                if v is not None:
                    replace[v] = (call, k)
        for e in self.entries:
            replace[e.var] = e

        def entry(src: Node, k: int) -> tuple:
            target = replace.get(src.name) if src.is_variable else None
            if target is None:
                return (src, k)
            if isinstance(target, calls.Remarked):
                return self._old_entry(target, known)
            return (self._call_node(target[0], known), target[1])

        for node in list(known.values()):
            node.inputs = [entry(src, k) for src, k in node.inputs]
        return known, [entry(n, k) for n, k in heads]

    @staticmethod
    def _old_entry(e: calls.Remarked, known: dict) -> tuple:
        head = e.graph["heads"][0]
        return (known[e.graph["nodes"][head[0]]["name"]], head[1])

    def _call_node(self, call: Any, known: dict) -> Node:
        node = self.call_nodes.get(call)
        if node is not None:
            return node
        node = self.call_nodes[call] = Node(f"call {id(call)}", call=call,
                                            num_outputs=len(call.outputs))
        ex = call.executor
        data = dict(zip(ex.names, call.sources))
        for name in ex.inputs_order:  # as the CachedOp lists its inputs
            s = data.get(name)
            if s is not None and s.kind == "output":
                node.inputs.append((self._call_node(s.call, known), s.index))
            elif s is not None and s.kind == "leaf":
                node.inputs.append((_var(s.var, known), 0))
            elif s is not None and s.kind == "remarked":
                node.inputs.append(self._old_entry(s.entry, known))
            elif name in ex.param_vars:
                node.inputs.append((_var(ex.param_vars[name], known), 0))
        return node

    def _order(self, key: tuple, planned: list, autograd: bool) -> list:
        """Who gives the terms of one gradient, in the order its sum takes them: the
        planned calls where the replay puts them, 'autograd' (whose pass summed the tape's
        terms already) at the first operator of the tape (or head) that contributes."""
        out, placed, left = [], not autograd, list(planned)
        for contributor in self.contributors.get(key, []):  # None: a head's gradient
            if contributor is not None and contributor.call is not None:
                if contributor.call in left:
                    out.append(contributor.call)
                    left.remove(contributor.call)
            elif not placed:
                out.append("autograd")
                placed = True
        return out + (["autograd"] if not placed else []) + left

    def _ordered(self, key: tuple, planned: dict, autograd: list) -> list:
        """The terms of one gradient in its sum's order (see _order)."""
        order = self._order(key, list(planned), bool(autograd))
        return [t for who in order for t in (autograd if who == "autograd" else [planned[who]])]

    # ------------------------------------------------------------------ running calls
    def _process(self, call: Any) -> None:
        mx = load_mxnet()
        ex = call.executor
        if call.retained and ex.random:
            raise PlanError(
                f"backward() reaches a planned call of {call.planned.block.name} a second "
                f"time (retain_graph=True) and its graph draws random numbers (Dropout): "
                f"running its forward again would draw other ones. Use one backward() "
                f"per record(), or policy none for this block")
        ex.hold(call)
        shared = len(ex.calls) > 1  # its gradient arrays are written again by the others
        node = self.call_nodes[call]
        heads = []
        for k, o in enumerate(call.outputs):
            terms = []
            if call.marked[k] is not None:
                given = self._autograd_terms(call.vars[k], call.buffers[k], call.marked[k],
                                             call.saved[k])
                terms = self._ordered((node, k), call.terms[k], given)
            heads.append(combine(terms) if terms else mx.nd.zeros(o.shape, o.context,
                                                                   dtype=o.dtype))
        ex.backward(heads)
        if not self.retain:
            ex.resident = None  # no backward needs its forward values any more
        for s, g in zip(call.sources, ex.input_grads):
            if shared and g is not None:
                g = g.copy()
            if s.kind == "output":
                _term(s.call.terms[s.index], call, g)
            elif s.kind == "leaf":
                _term(self.leaves.setdefault(id(s.array), (s.array, s.var, {}))[2], call, g)
            elif s.kind == "remarked":
                _term(s.entry.terms, call, g)
        for name, p in ex.trained:
            key, term = (p, str(ex.ctx)), ex.grad_term(name)
            self.sums[key].add(call, term, (key, id(term)) in self.shared)

    def _flush(self, group: list) -> None:
        """autograd's backward of re-marked inputs' histories, each with its summed
        gradient (one pass for the inputs whose planned calls have all run)."""
        if not group:
            return
        mx = load_mxnet()
        recorded = {id(e): i for i, e in enumerate(self.entries)}
        group = sorted(group, key=lambda e: recorded[id(e)])
        totals = []
        for e in group:
            given = self._autograd_terms(e.var, e.buffer, e.x, e.saved)
            terms = self._ordered(self._old_entry(e, self.known), e.terms, given)
            totals.append(combine(terms) if terms else mx.nd.zeros(e.x.shape, e.x.context,
                                                                   dtype=e.x.dtype))
        reach = set().union(*(e.vars for e in group))
        if self.variables is None:  # what an earlier pass wrote, kept as terms
            for call in self.pending:
                for k, v in enumerate(call.vars):
                    if v in reach and call.marked[k]._fresh_grad:
                        call.saved[k].append(call.buffers[k].copy())
            for other in self.entries:
                if other.var in reach and other.x._fresh_grad:
                    other.saved.append(other.buffer.copy())
        self.flushed.update(id(e) for e in group)
        later = [e for e in self.entries if id(e) not in self.flushed]
        names = set().union(*({n["name"] for n in e.graph["nodes"]} for e in group))
        keep = self.retain or any(names & {n["name"] for n in e.graph["nodes"]} for e in later)
        self._pass([e.old for e in group], totals, keep, names)
        for e in group:
            e.terms = {}
            if not self.retain:
                calls.forget(e)

    # ------------------------------------------------------------------ Parameters, inputs
    def _isolate_adds(self) -> None:
        """Before autograd's pass: the old gradient of every Parameter with grad_req 'add'
        a pending call trains, set aside and zeroed, so that what autograd adds (another
        recorded use) is its own term."""
        self.old: dict[tuple, Any] = {}
        if self.variables is not None:
            return
        for call in self.pending:
            ex = call.executor
            for _, p in ex.trained:
                key = (p, str(ex.ctx))
                if p.grad_req == "add" and key not in self.old:
                    grad = p.grad(ex.ctx)
                    self.old[key] = (grad.copy(), ex.ctx)
                    grad[:] = 0

    def _keep_param_grads(self, reached: list) -> None:
        """Before any executor writes a Parameter's own gradient array: what autograd
        wrote there (another recorded use) set aside, and each trained Parameter's sum
        set up. A Parameter whose one term is the executor's gets its old gradient back,
        to add to in the kernel as the CachedOp does; the others stay zeroed. For
        autograd.grad the whole array, restored afterwards."""
        kept: dict[tuple, Any] = {}
        trainers: dict[tuple, list] = {}
        writers: set = set()
        seen: set = set()
        for call in reached:
            ex = call.executor
            for name, p in ex.trained:
                key = (p, str(ex.ctx))
                trainers.setdefault(key, []).append(call)
                self.param_facts[key] = (p, ex.ctx, ex.param_vars[name])
                if ex.writes(name):
                    writers.add(key)
                target = (key, id(ex.grad_term(name)))
                if target in seen:
                    self.shared.add(target)
                seen.add(target)
        for key, who in trainers.items():
            p, ctx, var_name = self.param_facts[key]
            data, grad = p.data(ctx), p.grad(ctx)
            if self.variables is not None:
                if key in writers:
                    self.restore[key] = grad.copy()
                    grad[:] = 0
            elif data._fresh_grad:  # autograd's term
                kept[key] = grad.copy() if key in writers else grad
                if p.grad_req == "add" and key in writers:
                    grad[:] = 0
            elif key in self.old and len(who) == 1 and key in writers:
                grad[:] = self.old.pop(key)[0]
            order = self._order((self.known.get(var_name), 0), who, key in kept)
            old = self.old.get(key, (None,))[0]
            self.sums[key] = RunningSum(order, old)
            if key in kept:
                self.sums[key].add("autograd", kept[key], False)

    def _write_params(self) -> None:
        for key, running in self.sums.items():
            p, ctx, _ = self.param_facts[key]
            data, grad = p.data(ctx), p.grad(ctx)
            total = running.result()
            if self.variables is not None:
                self._give(data, [total.copy() if total is grad else total])
                if key in self.restore:
                    grad[:] = self.restore[key]
                continue
            if key in self.old:
                old = self.old.pop(key)[0]
                if running.old is not None:  # 5 to 7 terms: added to the old one by one
                    grad[:] = total
                else:
                    grad[:] = old + total
            elif total is not grad:  # else written (or added in the kernel) by the executor
                grad[:] = total
            data._fresh_grad = True
        for (p, _), (old, ctx) in self.old.items():  # no planned call reached: autograd's
            grad = p.grad(ctx)
            if p.data(ctx)._fresh_grad:
                accumulate(grad, old, [grad])
            else:
                grad[:] = old

    def _write_leaves(self) -> None:
        for x, var_name, planned in self.leaves.values():
            total = combine(self._ordered((_var(var_name, self.known), 0), planned, []))
            if self.variables is not None:
                self._give(x, [total])
            elif x._fresh_grad:  # autograd wrote its other uses' gradient: add the rest
                x.grad[:] += total
            else:
                _originals["backward"]([x], [total], False, self.train_mode)  # its grad_req

    def _give(self, array: Any, terms: list) -> None:
        """autograd.grad: terms of the gradient of an asked variable."""
        for i, v in enumerate(self.variables):
            if v is array:
                self.results[i].extend(terms)


def _term(terms: dict, call: Any, grad: Any) -> None:
    """A call's gradient term of one array; an array it takes as two inputs gets both
    inputs' gradients, added in their order (as autograd adds a CachedOp's two)."""
    terms[call] = grad if call not in terms else terms[call] + grad


def _name(x: Any) -> str | None:
    from mxmirror.gluon.inputs import recorded

    graph = recorded(x)
    return None if graph is None else graph["nodes"][graph["heads"][0][0]]["name"]


def _var(name: str, known: dict) -> Node:
    if name not in known:
        known[name] = Node(name, needs_grad=True)
    return known[name]
