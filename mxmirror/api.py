"""The public entry point: plan a symbol by policy."""

from __future__ import annotations

import re
from typing import Any

from . import mxnet_adapter
from .errors import PlanError
from .graph import Graph
from .plan import Plan, strip_json
from .planners import POLICIES, make_plan

_UNITS = {"": 1, "B": 1, "KB": 2**10, "K": 2**10, "MB": 2**20, "M": 2**20, "GB": 2**30,
          "G": 2**30, "TB": 2**40}


def parse_budget(budget: Any) -> int | None:
    """Bytes from an int or a string like '800MB', '1.5GB'."""
    if budget is None:
        return None
    if isinstance(budget, bool):
        raise PlanError(f"budget must be a size such as 800MB, not {budget!r}")
    if isinstance(budget, (int, float)):
        value = int(budget)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?B?|[kmgt]i?b)?\s*", str(budget),
                         flags=re.IGNORECASE)
        if not m:
            raise PlanError(f"budget must be a size such as 800MB or 1.5GB, not {budget!r}")
        unit = (m.group(2) or "").upper().replace("IB", "B")
        value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise PlanError(f"budget must be positive, not {budget!r}")
    return value


def plan(symbol: Any, policy: str = "sqrt", budget: Any = None,
         type_dict: dict[str, str] | None = None, grad_req: Any = None, **shapes: Any) -> Plan:
    """Plan which nodes to recompute so that training fits in less memory.

    `symbol` is an mx.sym.Symbol, JSON text or a path; `shapes` are the input
    shapes as for simple_bind. The result's `symbol` binds in plain MXNet.
    """
    if policy not in POLICIES:
        raise PlanError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    graph, source = prepare(symbol, type_dict=type_dict, grad_req=grad_req, **shapes)
    return plan_graph(graph, source, policy, budget)


def prepare(symbol: Any, type_dict: dict[str, str] | None = None, grad_req: Any = None,
            **shapes: Any) -> tuple[Graph, str]:
    """The graph IR and the unplanned symbol JSON, to plan several policies on."""
    if not shapes:
        raise PlanError("give the input shapes, e.g. plan(sym, data=(32, 3, 224, 224))")
    sym = mxnet_adapter.load_symbol(symbol)
    req = mxnet_adapter.normalize_grad_req(sym, shapes, grad_req)
    if all(r == "null" for r in req.values()):  # before any template is learned
        raise PlanError("nothing is trained: no argument gets a gradient, so there is no "
                        "backward pass to plan")
    source = strip_json(sym.tojson())
    graph = mxnet_adapter.load_graph(source, shapes, type_dict=type_dict, grad_req=grad_req)
    if not graph.grad_args():
        raise PlanError("nothing is trained: no argument gets a gradient, so there is no "
                        "backward pass to plan")
    return graph, source


def plan_graph(graph: Graph, source: str, policy: str = "sqrt", budget: Any = None) -> Plan:
    """Plan an already prepared graph."""
    result = make_plan(graph, policy, parse_budget(budget))
    result.source_json = source
    return result
