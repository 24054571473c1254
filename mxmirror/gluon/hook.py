"""The unchanged-script hook: the outermost hybridized block called under autograd.record()
goes through a PlannedBlock while the bind hook names a policy (``mxmirror run``,
``enabled()``, ``MXMIRROR_POLICY``); what a plan cannot serve trains unplanned, said once."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from mxmirror.adapter.symbol import load_mxnet
from mxmirror.errors import PlanError
from mxmirror.gluon.block import PlannedBlock
from mxmirror.gluon.inputs import check_fed_by_planned, check_inputs
from mxmirror.log import log

_hook: dict[str, Any] = {}  # "call": HybridBlock.__call__ as MXNet has it
_planned: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # block -> its PlannedBlock
_reported: weakref.WeakSet = weakref.WeakSet()  # blocks whose unplanned line was logged
_depth = threading.local()  # .inside: within a planned call; .quiet: within an unhybridized one


def install(state: Callable[[], tuple[str | None, Any]]) -> None:
    """Route the outermost hybridized block called under autograd.record() through a
    PlannedBlock while ``state()`` (the bind hook's policy, budget) names a policy."""
    if _hook:
        return
    mx = load_mxnet()
    hybrid = mx.gluon.HybridBlock
    original = _hook["call"] = hybrid.__call__

    def call(self, *args, **kwargs):
        policy, budget = state()
        if policy in (None, "none") or getattr(_depth, "inside", False) \
                or not mx.autograd.is_recording() or not mx.autograd.is_training() \
                or any(isinstance(a, mx.sym.Symbol) for a in args):  # a graph being traced
            return original(self, *args, **kwargs)
        if not self._active:  # its hybridized children may still be planned
            if self not in _reported and not getattr(_depth, "quiet", False):
                _reported.add(self)
                log.info(f"mxmirror: gluon {self.name} is not hybridized: trained "
                         f"unplanned (call .hybridize() to plan it)")
            quiet, _depth.quiet = getattr(_depth, "quiet", False), True
            try:
                return original(self, *args, **kwargs)
            finally:
                _depth.quiet = quiet
        try:
            check_inputs(args, kwargs)
            check_fed_by_planned(args)
        except PlanError as e:
            if self not in _reported and not getattr(_depth, "quiet", False):
                _reported.add(self)
                log.info(f"mxmirror: gluon {self.name} trained unplanned: {e}")
            return original(self, *args, **kwargs)
        planned = _planned.get(self)
        if planned is None or (planned.policy, planned.budget) != (policy, budget):
            planned = _planned[self] = PlannedBlock(self, policy, budget)
        _depth.inside = True
        try:
            return planned(*args)
        finally:
            _depth.inside = False

    hybrid.__call__ = call
