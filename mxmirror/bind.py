"""The bind-time flag: plan every Symbol.simple_bind / Symbol.bind, so unchanged
training scripts (Module, BucketingModule, several contexts) train with the plan.

Planning never breaks the user's run: if it fails, a warning says why and the
unplanned bind goes ahead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from .api import parse_budget, plan
from .errors import PlanError
from .executor import SegmentedBinding
from .mxnet_adapter import UNHOOKED as _originals

log = logging.getLogger("mxmirror")
if not log.handlers:
    _h = logging.StreamHandler(sys.stderr)
    _h.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(_h)
    log.setLevel(logging.INFO)
    log.propagate = False

_state: dict[str, Any] = {"policy": None, "budget": None}
_cache: dict[str, str] = {}
_segmented_cache: dict[str, SegmentedBinding] = {}
_failed: dict[str, str] = {}  # plan key -> why planning failed (warned once)


def _mx():
    import mxnet as mx

    return mx


def enable(policy: str = "sqrt", budget: Any = None) -> None:
    """Plan every bind from now on (Symbol.simple_bind and Symbol.bind)."""
    from .planners import POLICIES

    if policy not in POLICIES:
        raise PlanError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    parse_budget(budget)
    _install()
    _state.update(policy=policy, budget=budget)


def disable() -> None:
    """Stop planning binds."""
    _state.update(policy=None, budget=None)


@contextlib.contextmanager
def enabled(policy: str = "sqrt", budget: Any = None) -> Iterator[None]:
    """Plan every bind inside the block."""
    saved = dict(_state)
    enable(policy, budget)
    try:
        yield
    finally:
        _state.update(saved)


def simple_bind(symbol: Any, ctx: Any, policy: str = "sqrt", budget: Any = None,
                **kwargs: Any):
    """Symbol.simple_bind with a plan; same arguments plus the plan's."""
    _install()
    planned = _planned_symbol(symbol, policy, budget, kwargs.get("grad_req", "write"),
                              kwargs.get("type_dict"), _shape_kwargs(kwargs), strict=True)
    if isinstance(planned, SegmentedBinding):  # several recomputations: mxmirror drives
        return planned.bind(symbol, ctx, **kwargs)
    return _originals["simple_bind"](planned, ctx, **kwargs)


def _shape_kwargs(kwargs: dict) -> dict:
    named = {"grad_req", "type_dict", "stype_dict", "group2ctx", "shared_arg_names",
             "shared_exec", "shared_buffer"}
    return {k: v for k, v in kwargs.items() if k not in named}


def _planned_symbol(symbol, policy, budget, grad_req, type_dict, shapes, strict=False):
    """The planned copy of `symbol`, cached per graph, shapes, grad_req and policy."""
    if policy in (None, "none"):
        return symbol
    if grad_req == "null" or (isinstance(grad_req, dict)
                              and all(v == "null" for v in grad_req.values())):
        return symbol  # inference: nothing to recompute
    key = None
    try:
        text = symbol.tojson()
        key = hashlib.sha1(json.dumps([text, sorted((k, str(tuple(v) if isinstance(v, list) else v))
                                              for k, v in shapes.items()),
                                       grad_req, type_dict and sorted(type_dict.items()),
                                       policy, str(budget)], default=str).encode()).hexdigest()
        if key in _cache:
            return _mx().sym.load_json(_cache[key])
        if key in _segmented_cache:
            return _segmented_cache[key]
        if key in _failed:  # warned once already; do not plan (or learn) again
            return symbol
        p = plan(symbol, policy=policy, budget=budget, type_dict=type_dict, grad_req=grad_req,
                 **shapes)
        if p.segmented is not None:  # runs on SegmentedExecutor, not on MXNet's own
            log.info(p.summary())
            _segmented_cache[key] = SegmentedBinding(p)
            return _segmented_cache[key]
        planned = p.symbol
    except Exception as exc:  # never break the user's script
        if strict:
            raise
        why = str(exc) if isinstance(exc, PlanError) else f"{type(exc).__name__}: {exc}"
        if key is not None:
            _failed[key] = why
        warnings.warn(f"mxmirror: planning failed, binding unplanned: {why}", stacklevel=3)
        return symbol
    log.info(p.summary())
    _cache[key] = planned.tojson()
    return planned


def _install() -> None:
    """Wrap Symbol.simple_bind and Symbol.bind once."""
    if _originals:
        return
    Symbol = _mx().sym.Symbol
    _originals["simple_bind"] = Symbol.simple_bind
    _originals["bind"] = Symbol.bind

    def simple_bind_hook(self, ctx, grad_req="write", type_dict=None, stype_dict=None,
                         group2ctx=None, shared_arg_names=None, shared_exec=None,
                         shared_buffer=None, **kwargs):
        sym = _planned_symbol(self, _state["policy"], _state["budget"], grad_req, type_dict,
                              kwargs)
        return _bind_or_fall_back(
            _originals["simple_bind"], sym, self, ctx, grad_req=grad_req, type_dict=type_dict,
            stype_dict=stype_dict, group2ctx=group2ctx, shared_arg_names=shared_arg_names,
            shared_exec=shared_exec, shared_buffer=shared_buffer, **kwargs)

    def bind_hook(self, ctx, args, args_grad=None, grad_req="write", aux_states=None,
                  group2ctx=None, shared_exec=None):
        sym = self
        try:
            req = types = shapes = None
            if _state["policy"] not in (None, "none") and args_grad is not None:
                req, types, shapes = _bind_inputs(self, args, args_grad, grad_req)
        except Exception as exc:  # never break the user's script
            warnings.warn(f"mxmirror: cannot read the bind arguments ({type(exc).__name__}: "
                          f"{exc}); binding unplanned", stacklevel=2)
        if req is not None:
            sym = _planned_symbol(self, _state["policy"], _state["budget"], req, types, shapes)
        return _bind_or_fall_back(_originals["bind"], sym, self, ctx, args, args_grad=args_grad,
                                  grad_req=grad_req, aux_states=aux_states,
                                  group2ctx=group2ctx, shared_exec=shared_exec)

    Symbol.simple_bind = simple_bind_hook
    Symbol.bind = bind_hook


def _bind_inputs(self, args, args_grad, grad_req):
    """grad_req, dtypes and shapes per argument, as Symbol.bind receives them."""
    names = self.list_arguments()
    arrays = args if isinstance(args, dict) else dict(zip(names, args))
    grads = args_grad if isinstance(args_grad, dict) else dict(zip(names, args_grad))
    if isinstance(grad_req, str):
        req = {n: (grad_req if grads.get(n) is not None else "null") for n in names}
    elif isinstance(grad_req, (list, tuple)):
        req = dict(zip(names, grad_req))
    else:
        req = {n: grad_req.get(n, "null") for n in names}
    shapes = {n: a.shape for n, a in arrays.items()}
    types = {n: a.dtype.__name__ if hasattr(a.dtype, "__name__") else str(a.dtype)
             for n, a in arrays.items()}
    return req, types, shapes


def _bind_or_fall_back(original, planned, symbol, *args, **kwargs):
    """Bind the planned symbol; should MXNet refuse it, bind the user's own (with a warning)."""
    if planned is symbol:
        return original(symbol, *args, **kwargs)
    try:
        if isinstance(planned, SegmentedBinding):
            if original is _originals["bind"]:
                ctx, args_ = args[0], args[1]
                return planned.bind(symbol, ctx, args=args_, **kwargs)
            return planned.bind(symbol, *args, **kwargs)
        return original(planned, *args, **kwargs)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        warnings.warn(f"mxmirror: MXNet could not bind the planned symbol "
                      f"({type(exc).__name__}: {first}); binding unplanned", stacklevel=3)
        return original(symbol, *args, **kwargs)


def enable_from_env() -> None:
    """MXMIRROR_POLICY / MXMIRROR_BUDGET switch the hook on for any process."""
    policy = os.environ.get("MXMIRROR_POLICY")
    if policy:
        try:
            enable(policy, os.environ.get("MXMIRROR_BUDGET") or None)
        except PlanError as exc:
            warnings.warn(f"mxmirror: MXMIRROR_POLICY ignored: {exc}", stacklevel=2)
