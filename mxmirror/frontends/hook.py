"""The bind-time flag: plan every Symbol.simple_bind / Symbol.bind, so unchanged
training scripts (Module, BucketingModule, several contexts) train with the plan.

Planning never breaks the user's run: if it fails, one log line says why and the
unplanned bind goes ahead. A budget no plan reaches binds the smallest plan (as policy
``auto`` does), said in the log line: a budget is never a reason to train unplanned. A plan
whose executor holds outside MXNet's figure (its mirror copies' own structures, MKL-DNN
layout copies: adapter/executor_memory.py) what its figure saves binds unplanned, said so:
unplanned is then the smaller. So does a bind sharing another executor's memory (a
BucketingModule's further bucket) that unplanned allocates no more beside it than planned
(sim/shared_pool): the plan would only add its recomputation.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple

from mxmirror.adapter.executor_memory import beyond_unplanned
from mxmirror.adapter.free_memory import on_gpu
from mxmirror.adapter.symbol import learner_ahead, load_mxnet, symbol_json
from mxmirror.api import plan
from mxmirror.errors import EXIT_BAD_INPUT, PlanError
from mxmirror.ir.graph import normalize_grad_req
from mxmirror.log import log, size
from mxmirror.log import show as _show_log
from mxmirror.planning.registry import resolve
from mxmirror.runtime.aux_order import order_aux_updates
from mxmirror.runtime.binds import UNHOOKED as _originals
from mxmirror.runtime.plan import Plan
from mxmirror.runtime.segmented.sharing import mxnet_bind
from mxmirror.sim import shared_pool

_state: dict[str, Any] = {"policy": None, "budget": None}
_plans: dict[str, tuple[Plan, str]] = {}  # plan key -> plan, and why it is not used ("": it is)
_logged: set[tuple[str, str]] = set()  # (plan key, log line) said once
_pools: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # executor -> its blocks
_failed: dict[str, str] = {}  # plan key -> why planning failed (warned once)


def enable(policy: str = "sqrt", budget: Any = None) -> None:
    """Plan every bind from now on (Symbol.simple_bind and Symbol.bind)."""
    resolve(policy, budget)
    _install()
    _state.update(policy=policy, budget=budget)
    if policy == "none":  # nothing is planned: still say the hook is on
        log.info("mxmirror: policy=none: the bind hook is on and plans nothing (BatchNorm "
                 "statistics are ordered after each backward)")
    from mxmirror.gluon import install

    install(lambda: (_state["policy"], _state["budget"]))


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
    p = _plan_for(symbol, policy, budget, kwargs.get("grad_req", "write"),
                  kwargs.get("type_dict"), _shape_kwargs(kwargs), ctx, strict=True).plan
    if p is None:
        return order_aux_updates(mxnet_bind(_originals["simple_bind"], symbol, ctx, **kwargs))
    return p.bind(ctx, symbol=symbol, **kwargs)


def _shape_kwargs(kwargs: dict) -> dict:
    named = {"grad_req", "type_dict", "stype_dict", "group2ctx", "shared_arg_names",
             "shared_exec", "shared_buffer"}
    return {k: v for k, v in kwargs.items() if k not in named}


class Bound(NamedTuple):
    """What a bind runs: the plan (None: the user's own symbol) and the storage blocks of
    MXNet's executor for it (None: not known), which a bind sharing its memory matches."""

    plan: Plan | None
    blocks: tuple[int, ...] | None


def _plan_for(symbol, policy, budget, grad_req, type_dict, shapes, ctx=None,
              strict=False, pool: list[int] | None = None) -> Bound:
    """What to bind for `symbol`: its plan (made once per graph, shapes, grad_req and
    policy), or unplanned where there is nothing to plan, (unless strict) planning failed, or
    a rule below finds the plan costs more than it saves. ``pool``: the blocks of the executor
    whose memory the bind shares. Policy ``auto`` measures the free memory of `ctx` at the
    first bind of the graph."""
    if policy in (None, "none"):
        return Bound(None, None)
    if grad_req == "null" or (isinstance(grad_req, dict)
                              and all(v == "null" for v in grad_req.values())):
        return Bound(None, None)  # inference: nothing to recompute
    key = None
    try:
        text = symbol_json(symbol)
        key = hashlib.sha1(json.dumps([text, sorted((k, str(tuple(v) if isinstance(v, list) else v))
                                              for k, v in shapes.items()),
                                       grad_req, type_dict and sorted(type_dict.items()),
                                       policy, str(budget), on_gpu(ctx)],
                                      default=str).encode()).hexdigest()
        if key in _failed:  # warned once already; do not plan (or learn) again
            return Bound(None, None)
        if key not in _plans:
            p = plan(symbol, policy=policy, budget=budget, type_dict=type_dict,
                     grad_req=grad_req, ctx=ctx, or_smallest=not strict, **shapes)
            _plans[key] = p, _own_memory_outweighs(p)
            p.release()  # what is kept for later binds of the key holds no graph
    except Exception as exc:  # never break the user's script
        if strict:
            raise
        why = str(exc) if isinstance(exc, PlanError) else f"{type(exc).__name__}: {exc}"
        if key is not None:
            _failed[key] = why
        log.warning(f"mxmirror: planning failed, binding unplanned: {why}")
        return Bound(None, None)
    p, why_not = _plans[key]
    if p.recomputed_ids and not why_not and pool is not None:
        why_not = _fits_shared_pool(p, pool)
    line = "; ".join([p.summary(), *(p.notes if p.recomputed_ids else [])])  # else in it
    if why_not:
        line += f"; not used, binding unplanned: {why_not}"
    if _state.get("bucket") is not None:  # which bucket of a BucketingModule binds
        given = " ".join(f"{k}={'x'.join(map(str, v))}" for k, v in shapes.items())
        line = line.replace("mxmirror: ", f"mxmirror: bucket {_state['bucket']} {given} ", 1)
    if (key, line) not in _logged:
        _logged.add((key, line))
        log.info(line)
    use = bool(p.recomputed_ids) and not why_not
    return Bound(p if use else None, (p.planned_blocks if use else p.baseline_blocks) or None)


def _own_memory_outweighs(p: Plan) -> str:
    """Why `p` is not used where what its executor holds outside MXNet's figure beyond an
    unplanned executor's (its mirror copies' structures and layout copies,
    adapter/executor_memory.py) holds what its figure saves; "" where it does not."""
    if not p.recomputed_ids:
        return ""
    more = beyond_unplanned(p)
    saving = p.baseline_bytes - p.planned_bytes
    if more.total >= saving:
        return (f"the plan saves {size(saving)} of MXNet's figure, not more than its executor "
                f"holds outside it beyond an unplanned executor: {more.text()}")
    return ""


def _fits_shared_pool(p: Plan, pool: list[int]) -> str:
    """Why `p` is not used where the bind shares an executor's memory (a BucketingModule's
    further bucket) and unplanned it allocates no more beside it than planned; "" else."""
    if not p.planned_blocks or not p.baseline_blocks:
        return ""
    unplanned = sum(shared_pool.fit(pool, p.baseline_blocks)[1])
    planned = sum(shared_pool.fit(pool, p.planned_blocks)[1])
    if unplanned > planned:
        return ""
    return (f"unplanned it allocates {size(unplanned)} beside the memory of the executor it "
            f"shares ({size(planned)} planned): the plan would only add its recomputation")


def _track(executor: Any, bound: Bound, shared_exec: Any) -> None:
    """Keep the blocks `executor` holds, and add what it allocated to the pool of the
    executor it shares (as MXNet does), for the binds that share it later."""
    pool = [] if shared_exec is None else _pool_of(shared_exec)
    if bound.blocks is None or pool is None:
        return
    taken, new = shared_pool.fit(pool, bound.blocks)
    pool.extend(new)
    with contextlib.suppress(TypeError):  # an executor that takes no weak reference
        _pools[executor] = taken + new


def _install() -> None:
    """Wrap Symbol.simple_bind and Symbol.bind once."""
    _show_log()
    if _originals:
        return
    Symbol = load_mxnet().sym.Symbol
    _originals["simple_bind"] = Symbol.simple_bind
    _originals["bind"] = Symbol.bind

    def simple_bind_hook(self, ctx, grad_req="write", type_dict=None, stype_dict=None,
                         group2ctx=None, shared_arg_names=None, shared_exec=None,
                         shared_buffer=None, **kwargs):
        bound = _plan_for(self, _state["policy"], _state["budget"], grad_req, type_dict,
                          kwargs, ctx, pool=_pool_of(shared_exec))
        return _ordered(_bind_or_fall_back(
            bound, _originals["simple_bind"], self, ctx, grad_req=grad_req,
            type_dict=type_dict, stype_dict=stype_dict, group2ctx=group2ctx,
            shared_arg_names=shared_arg_names, shared_exec=shared_exec,
            shared_buffer=shared_buffer, **kwargs))

    def bind_hook(self, ctx, args, args_grad=None, grad_req="write", aux_states=None,
                  group2ctx=None, shared_exec=None):
        bound = Bound(None, None)
        try:
            if _state["policy"] not in (None, "none") and args_grad is not None:
                req, types, shapes = _bind_inputs(self, args, args_grad, grad_req)
                bound = _plan_for(self, _state["policy"], _state["budget"], req, types, shapes,
                                  ctx, pool=_pool_of(shared_exec))
        except Exception as exc:  # never break the user's script
            log.warning(f"mxmirror: cannot read the bind arguments ({type(exc).__name__}: "
                        f"{exc}); binding unplanned")
        return _ordered(_bind_or_fall_back(bound, _originals["bind"], self, ctx, args=args,
                                           args_grad=args_grad, grad_req=grad_req,
                                           aux_states=aux_states, group2ctx=group2ctx,
                                           shared_exec=shared_exec))

    Symbol.simple_bind = simple_bind_hook
    Symbol.bind = bind_hook
    _watch_buckets(load_mxnet().mod.BucketingModule)


def _watch_buckets(bucketing) -> None:
    """While a BucketingModule binds a bucket, its key is known (for the log line)."""
    def watching(method, key_of):
        def call(self, *args, **kwargs):
            saved = _state.get("bucket")
            _state["bucket"] = key_of(self, *args, **kwargs)
            try:
                return method(self, *args, **kwargs)
            finally:
                _state["bucket"] = saved
        return call

    bucketing.bind = watching(bucketing.bind, lambda self, *a, **k: self._default_bucket_key)
    bucketing.switch_bucket = watching(bucketing.switch_bucket,
                                       lambda self, bucket_key, *a, **k: bucket_key)


def _ordered(executor):
    """While enabled (any policy, `none` too), BatchNorm statistics are ordered (aux_order)."""
    return executor if _state["policy"] is None else order_aux_updates(executor)


def _bind_inputs(self, args, args_grad, grad_req):
    """grad_req, dtypes and shapes per argument, as Symbol.bind receives them."""
    names = self.list_arguments()
    arrays = args if isinstance(args, dict) else dict(zip(names, args))
    grads = args_grad if isinstance(args_grad, dict) else dict(zip(names, args_grad))
    req = normalize_grad_req(names, grad_req, lambda _: "null")  # as MXNet's own bind
    if isinstance(grad_req, str):  # one string: no gradient where no array is given
        req = {n: r if grads.get(n) is not None else "null" for n, r in req.items()}
    shapes = {n: a.shape for n, a in arrays.items()}
    types = {n: a.dtype.__name__ if hasattr(a.dtype, "__name__") else str(a.dtype)
             for n, a in arrays.items()}
    return req, types, shapes


def _pool_of(shared_exec: Any) -> list[int] | None:
    """The blocks of the executor a bind shares (None: none shared, or not known here)."""
    if shared_exec is None:
        return None
    with contextlib.suppress(TypeError):
        return _pools.get(shared_exec)
    return None


def _bind_or_fall_back(bound: Bound, original, symbol, ctx, **kwargs):
    """Bind the plan; should that fail, bind the user's own symbol (with a log line)."""
    executor = None
    if bound.plan is not None:
        try:
            executor = bound.plan.bind(ctx, symbol=symbol, **kwargs)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            log.warning(f"mxmirror: could not bind the planned symbol "
                        f"({type(exc).__name__}: {first}); binding unplanned")
            bound = Bound(None, bound.plan.baseline_blocks or None)
    if executor is None:
        executor = mxnet_bind(original, symbol, ctx, **kwargs)
    _track(executor, bound, kwargs.get("shared_exec"))
    return executor


def enable_from_env() -> None:
    """MXMIRROR_POLICY / MXMIRROR_BUDGET switch the hook on for any process, once it imports
    mxnet (mxmirror.frontends.startup). A bad value ends the process there, as the command
    line does: one ``mxmirror: error:`` line, exit code 2; never a silent unplanned run."""
    from mxmirror.frontends.startup import when_imported

    if os.environ.get("MXMIRROR_POLICY"):
        learner_ahead()  # the script imports MXNet itself: start the learner before it
        when_imported("mxnet", _enable_env)


def _enable_env() -> None:
    policy, budget = os.environ.get("MXMIRROR_POLICY"), os.environ.get("MXMIRROR_BUDGET")
    try:
        enable(policy, budget or None)
    except PlanError as exc:
        print(f"mxmirror: error: MXMIRROR_POLICY={policy}"
              + (f" MXMIRROR_BUDGET={budget}" if budget else "")
              + f": {exc} (or unset MXMIRROR_POLICY)", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_BAD_INPUT) from None
