"""The public entry point: plan a symbol by policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import mxnet_adapter
from .analysis import Analysis
from .device_memory import auto_budget
from .errors import PlanError
from .plan import BindInputs, Plan, strip_json
from .planners import make_plan, own_plan, parse_budget, resolve

__all__ = ["Prepared", "parse_budget", "plan", "prepare"]


@dataclass
class Prepared:
    """A symbol read and analysed once for its inputs: plan it by as many policies as wanted."""

    analysis: Analysis
    source_json: str  # the symbol without mirror attributes
    inputs: BindInputs

    def plan(self, policy: str = "sqrt", budget: Any = None, ctx: Any = None) -> Plan:
        """``ctx``: for policy ``auto`` without a budget, the device whose free memory is
        the budget (default: the CPU's available memory)."""
        source = None
        if resolve(policy, budget) == ("auto", None):
            budget, source = auto_budget(self.analysis.graph, ctx)
        return make_plan(self.analysis, policy, budget, self.source_json, self.inputs,
                         budget_source=source)

    def own_plan(self, policy: str = "sqrt", budget: Any = None) -> Plan:
        """The policy's own plan, segmented even where one recomputation is smaller."""
        return own_plan(self.analysis, policy, budget, self.source_json, self.inputs)


def plan(symbol: Any, policy: str = "sqrt", budget: Any = None,
         type_dict: dict[str, str] | None = None, grad_req: Any = None, ctx: Any = None,
         **shapes: Any) -> Plan:
    """Plan which nodes to recompute so that training fits in less memory.

    `symbol` is an mx.sym.Symbol, JSON text or a path; `shapes` are the input
    shapes as for simple_bind. ``plan.bind(ctx)`` trains with it; for the policies
    MXNet's own executor runs, ``plan.symbol`` binds in plain MXNet. Policy ``auto``
    without a budget plans for the free memory of ``ctx`` (default: the CPU's
    available memory) less arguments, gradients, aux states and a margin.
    """
    resolve(policy, budget)  # bad policy or budget: say so before reading the graph
    return prepare(symbol, type_dict=type_dict, grad_req=grad_req,
                   **shapes).plan(policy, budget, ctx)


def prepare(symbol: Any, type_dict: dict[str, str] | None = None, grad_req: Any = None,
            **shapes: Any) -> Prepared:
    """The analysed graph and the unplanned symbol JSON, to plan several policies on."""
    if not shapes:
        raise PlanError("give the input shapes, e.g. plan(sym, data=(32, 3, 224, 224))")
    sym = mxnet_adapter.load_symbol(symbol)
    req = mxnet_adapter.normalize_grad_req(sym, shapes, grad_req)
    if all(r == "null" for r in req.values()):  # before any template is learned
        raise PlanError("nothing is trained: no argument gets a gradient, so there is no "
                        "backward pass to plan")
    source = strip_json(sym.tojson())
    graph = mxnet_adapter.load_graph(source, shapes, type_dict=type_dict, grad_req=grad_req)
    inputs = BindInputs({k: tuple(v) for k, v in shapes.items()},
                        dict(type_dict) if type_dict else None, req)
    return Prepared(Analysis(graph), source, inputs)
