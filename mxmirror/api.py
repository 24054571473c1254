"""The public entry point: plan a symbol by policy.

``prepare`` reads a symbol once (the MXNet side: Symbol -> Graph with its templates) and
analyses it; ``Prepared.plan`` runs a policy (planning: a Decision, read from the plan
cache where one is kept) and makes the Plan a user binds. ``plan`` reads the graph only
when the plan is not kept on disk: a restarted job, the CLI run again or a bucket seen
before binds at the speed of reading its symbol.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from mxmirror.adapter.free_memory import auto_budget, on_gpu
from mxmirror.adapter.learn import learned_by
from mxmirror.adapter.reader import load_graph, parse_shapes
from mxmirror.adapter.symbol import read_symbol
from mxmirror.errors import BudgetTooSmall, PlanError
from mxmirror.ir.graph import BindInputs, Graph, module_default, normalize_grad_req
from mxmirror.ir.symbol_json import node_table, strip_json
from mxmirror.log import size
from mxmirror.planning import cache
from mxmirror.planning.analysis import Analysis
from mxmirror.planning.decide import decide
from mxmirror.planning.registry import BUDGETED, NEEDS_BUDGET, parse_budget, resolve
from mxmirror.progress import scoring, task
from mxmirror.runtime.plan import Plan
from mxmirror.sim.memory_plan import gc_paused

__all__ = ["Prepared", "parse_budget", "plan", "prepare"]


@dataclass
class Prepared:
    """A symbol read for its inputs: plan it by as many policies as wanted. Its graph is read
    (templates learned where the cache lacks them) and analysed once, on first use."""

    source_json: str  # the symbol without mirror attributes
    inputs: BindInputs
    read_graph: Callable[[], Graph] = field(repr=False)
    seconds: float = 0.0  # reading and analysing the graph (each Plan counts it in its time)
    gpu: bool = False  # planned for a GPU (ops that must write there: ir/ops.must_write)

    @cached_property
    def analysis(self) -> Analysis:
        start = time.perf_counter()
        with task("reading and analysing the graph"), gc_paused():
            analysis = Analysis(self.read_graph(), self.gpu)
        self.seconds += time.perf_counter() - start
        return analysis

    def release(self) -> None:
        """Forget the analysed graph, most of what planning holds (read again if asked for):
        a plan kept for its binds (the bind hook's, one per bucket) holds no graph."""
        self.__dict__.pop("analysis", None)

    @cached_property
    def nodes(self) -> list[tuple[str, str]]:
        """(name, op) of the graph's nodes by id, from the symbol (no graph read)."""
        return node_table(self.source_json)

    def plan(self, policy: str = "sqrt", budget: Any = None, ctx: Any = None,
             or_smallest: bool = False) -> Plan:
        """A Plan never worse than no plan, and segmented only where that is below the best
        one-recompute plan for the same budget too. ``ctx``: for policy ``auto`` without a
        budget, the device whose free memory is the budget (default: the CPU's available
        memory). ``or_smallest``: a budget no plan reaches gets the smallest plan (as
        ``auto`` does; the bind hook's rule) instead of BudgetTooSmall."""
        source = None
        if resolve(policy, budget) == ("auto", None):
            budget, source = auto_budget(self.analysis.graph, ctx)
        return self._plan(policy, budget, never_worse=True, budget_source=source,
                          or_smallest=or_smallest)

    def own_plan(self, policy: str = "sqrt", budget: Any = None) -> Plan:
        """The policy's own plan, segmented even where one recomputation is smaller (for
        studies of the segmented executor: its tests and benchmarks)."""
        return self._plan(policy, budget, never_worse=False)

    def _plan(self, policy: str, budget: Any, never_worse: bool,
              budget_source: str | None = None, or_smallest: bool = False) -> Plan:
        with gc_paused():  # planning makes ~10^5 objects freed by reference counts
            return self._plan_now(policy, budget, never_worse, budget_source, or_smallest)

    def _plan_now(self, policy: str, budget: Any, never_worse: bool,
                  budget_source: str | None, or_smallest: bool) -> Plan:
        name, budget_bytes = resolve(policy, budget)
        or_smallest = or_smallest and name in NEEDS_BUDGET
        start, read = time.perf_counter(), self.seconds  # reading the graph here: counted once
        key = cache.plan_key(name + " or the smallest" * or_smallest, budget_bytes,
                             self.source_json, self.inputs, never_worse,
                             {**learned_by(), **({"device": "gpu"} if self.gpu else {})})
        decision = cache.load(key, lambda: self.analysis, len(self.nodes))
        if decision is None:
            nodes = len(self.analysis.graph.op_nodes)
            with scoring(self.analysis, f"planning ({name}, {nodes} op nodes)"):
                try:
                    decision = decide(self.analysis, name, budget_bytes, never_worse)
                except BudgetTooSmall:
                    if not or_smallest:
                        raise
                    # auto's rule on the given budget: the smallest plan where none fits
                    decision = decide(self.analysis, "auto", budget_bytes, never_worse)
            cache.save(key, decision)
        label = None
        if budget_bytes is not None and name in BUDGETED:
            label = f"{size(budget_bytes, 0)} ({budget_source or 'given'})"
        return Plan.of(name, lambda: self.analysis, self.nodes, decision, self.inputs,
                       self.source_json, read + time.perf_counter() - start, label,
                       self.release, self.gpu)


def plan(symbol: Any, policy: str = "sqrt", budget: Any = None,
         type_dict: dict[str, str] | None = None, grad_req: Any = None, ctx: Any = None,
         or_smallest: bool = False, **shapes: Any) -> Plan:
    """Plan which nodes to recompute so that training fits in less memory.

    `symbol` is an mx.sym.Symbol, JSON text or a path; `shapes` are the input
    shapes as for simple_bind. ``plan.bind(ctx)`` trains with it; for the policies
    MXNet's own executor runs, ``plan.symbol`` binds in plain MXNet. ``ctx``: where the plan
    is bound (default: a CPU); a plan for a GPU keeps back copies of ops that must write
    there (cuDNN's BatchNorm), and a CPU plan that recomputes one is refused on a GPU. Policy
    ``auto`` without a budget plans for the free memory of ``ctx`` (default: the CPU's
    available memory) less arguments, gradients, aux states and a margin. ``or_smallest``:
    as Prepared.plan (the bind hook's rule).
    """
    resolve(policy, budget)  # bad policy or budget: say so before reading the graph
    return _read(symbol, type_dict, grad_req, shapes, on_gpu(ctx)).plan(policy, budget, ctx,
                                                                        or_smallest)


def prepare(symbol: Any, type_dict: dict[str, str] | None = None, grad_req: Any = None,
            ctx: Any = None, **shapes: Any) -> Prepared:
    """The analysed graph and the unplanned symbol JSON, to plan several policies on (for
    the device of ``ctx``, as ``plan``)."""
    prep = _read(symbol, type_dict, grad_req, shapes, on_gpu(ctx))
    _ = prep.analysis  # read now: what is wrong with the symbol, shapes or dtypes is said here
    return prep


def _read(symbol: Any, type_dict: dict[str, str] | None, grad_req: Any,
          shapes: dict[str, Any], gpu: bool = False) -> Prepared:
    """The symbol and its bind inputs, checked; the graph read on first use."""
    if not shapes:
        raise PlanError("give the input shapes, e.g. plan(sym, data=(32, 3, 224, 224))")
    sym = read_symbol(symbol)  # MXNet is imported only where no plan is kept for it
    arguments = sym.arguments
    shapes = parse_shapes(sym, shapes, arguments)
    req = normalize_grad_req(arguments, grad_req, module_default(shapes))
    if all(r == "null" for r in req.values()):  # before any template is learned
        raise PlanError("nothing is trained: no argument gets a gradient, so there is no "
                        "backward pass to plan")
    inputs = BindInputs(shapes, dict(type_dict) if type_dict else None, req)
    return Prepared(strip_json(sym.text), inputs, lambda: load_graph(
        sym.symbol, shapes, type_dict=type_dict, grad_req=req, strip=True, text=sym.text),
        gpu=gpu)
