"""The unchanged-script hook: the outermost hybridized block with Parameters called under
autograd.record() goes through a PlannedBlock while the bind hook names a policy
(``mxmirror run``, ``enabled()``, ``MXMIRROR_POLICY``). What a plan cannot serve, or does
not pay for, trains unplanned, said once per block; a block without Parameters (a loss)
is left alone without a word. Nothing here raises into the script."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from mxmirror.adapter.symbol import load_mxnet
from mxmirror.errors import PlanError
from mxmirror.gluon.block import BlockError, PlannedBlock
from mxmirror.log import log

_hook: dict[str, Any] = {}  # "call": HybridBlock.__call__ as MXNet has it
_planned: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # block -> its PlannedBlock
_reported: weakref.WeakSet = weakref.WeakSet()  # blocks whose unplanned line was logged
_with_params: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # block -> bool
_depth = threading.local()  # .inside: within a planned call; .quiet: within an unhybridized one


def _has_params(block: Any) -> bool:
    """The block has Parameters (found once per block: collect_params walks every child
    and checks its containers, which a loop of 200 calls feels)."""
    found = _with_params.get(block)
    if found is None:
        found = _with_params[block] = bool(block.collect_params().keys())
    return found


def planned_for(block: Any) -> PlannedBlock | None:
    """The PlannedBlock the hook trains `block` through, if it made one."""
    return _planned.get(block)


def install(state: Callable[[], tuple[str | None, Any]]) -> None:
    """Route the outermost hybridized block called under autograd.record() through a
    PlannedBlock while ``state()`` (the bind hook's policy, budget) names a policy."""
    if _hook:
        return
    mx = load_mxnet()
    hybrid = mx.gluon.HybridBlock
    original = _hook["call"] = hybrid.__call__

    def say(block: Any, line: str) -> None:
        if block not in _reported and not getattr(_depth, "quiet", False):
            _reported.add(block)
            log.info(line)

    def call(self, *args, **kwargs):
        policy, budget = state()
        if policy in (None, "none") or getattr(_depth, "inside", False) \
                or not mx.autograd.is_recording() or not mx.autograd.is_training() \
                or any(isinstance(a, mx.sym.Symbol) for a in args) \
                or not _has_params(self):  # a graph being traced; a loss
            if policy in (None, "none") and self in _planned and mx.autograd.is_recording() \
                    and mx.autograd.is_training():  # it trains unplanned now (hook off)
                _planned.pop(self).let_go()
            elif self in _planned and mx.autograd.is_recording() \
                    and not mx.autograd.is_training():
                _planned[self].predicting()
            return original(self, *args, **kwargs)
        if not self._active:  # its hybridized children may still be planned
            say(self, f"mxmirror: gluon {self.name} is not hybridized: trained unplanned "
                      f"(call .hybridize() to plan it)")
            quiet, _depth.quiet = getattr(_depth, "quiet", False), True
            try:
                return original(self, *args, **kwargs)
            finally:
                _depth.quiet = quiet
        planned = _planned.get(self)
        if planned is None or (planned.policy, planned.budget) != (policy, budget):
            if planned is not None:  # another policy: the other plan's executors go
                planned.let_go()
            planned = _planned[self] = PlannedBlock(self, policy, budget)
            planned.quiet = True  # the block's own call says what fails (below)
        out, why = None, None
        _depth.inside = True
        try:
            out = planned.planned_call(args, kwargs)
        except BlockError as e:  # the block's own first call fails so too: as plainly
            raise e.error from None
        except Exception as e:  # noqa: BLE001 - never stop the script: train it unplanned
            planned.fell_back()
            why = str(e) if isinstance(e, PlanError) else f"{type(e).__name__}: {e}"
        finally:
            _depth.inside = False
        if out is not None:
            return out
        out = original(self, *args, **kwargs)  # the block's own error, if it has one: no line
        if why is not None:
            say(self, f"mxmirror: gluon {self.name} trained unplanned: {why}")
        return out

    hybrid.__call__ = call
