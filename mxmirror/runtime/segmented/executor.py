"""SegmentedExecutor: a segment plan run as a chain of MXNet executors on one memory pool,
behind MXNet's ``Executor`` interface.

Each template of a ``segments.SegmentPlan`` is bound as an ordinary MXNet executor, all
of them drawing on one pool (``pool.bind_templates``); the plan's operations
(``segments.schedule``) are replayed on them by ``runner.ScheduleRunner``. This class is
the interface only: the user's arrays (``user_arrays``), forward, backward and the rest
of what ``mx.executor.Executor`` offers.
"""

from __future__ import annotations

import warnings
from typing import Any

from mxmirror.adapter.children import allocated_mb
from mxmirror.errors import PlanError
from mxmirror.runtime.segmented.pool import bind_templates
from mxmirror.runtime.segmented.runner import ScheduleRunner
from mxmirror.runtime.segmented.user_arrays import assign, user_arrays
from mxmirror.segments.cost import SegmentPlan


class SegmentedExecutor:
    """An executor with the ``mx.executor.Executor`` interface that runs a SegmentPlan."""

    def __init__(self, symbol: Any, ctx: Any, plan: SegmentPlan, grad_req: Any = "write",
                 args: dict | None = None, args_grad: dict | None = None,
                 aux_states: dict | None = None, shared_exec: Any = None,
                 shared_arg_names: list[str] | None = None,
                 shared_buffer: dict | None = None) -> None:
        import mxnet as mx

        self._mx = mx
        self._symbol = symbol
        self.ctx = ctx
        self.plan = plan
        self._arg_names = symbol.list_arguments()
        self._aux_names = symbol.list_auxiliary_states()
        self._out_names = symbol.list_outputs()
        user = user_arrays(symbol, plan.segments.graph, ctx, args, args_grad, aux_states,
                           shared_exec, shared_arg_names, shared_buffer)
        self.arg_dict, self.grad_dict, self.aux_dict = user.arg_dict, user.grad_dict, \
            user.aux_dict
        self.outputs = user.outputs
        self.templates = bind_templates(plan, ctx, user)
        self.runner = ScheduleRunner(plan, ctx, user, self.templates)

    # -------------------------------------------------------------- interface
    @property
    def arg_arrays(self) -> list:
        return [self.arg_dict[n] for n in self._arg_names]

    @property
    def grad_arrays(self) -> list:
        return [self.grad_dict[n] for n in self._arg_names]

    @property
    def aux_arrays(self) -> list:
        return [self.aux_dict[n] for n in self._aux_names]

    @property
    def output_dict(self) -> dict:
        return dict(zip(self._out_names, self.outputs))

    def forward(self, is_train: bool = False, **kwargs: Any) -> list:
        for name, value in kwargs.items():
            if name not in self.arg_dict:
                raise ValueError(f"unknown argument {name!r}")
            assign(self.arg_dict[name], value)
        self.runner.forward(is_train)
        return self.outputs

    def backward(self, out_grads: Any = None, is_train: bool = True) -> None:
        mx = self._mx
        if not self.runner.has_training_forward:
            raise PlanError("backward() needs a forward(is_train=True) first (the segmented "
                            "executor keeps only the states of one training forward)")
        if out_grads is None:
            out_grads = []
        elif isinstance(out_grads, mx.nd.NDArray):
            out_grads = [out_grads]
        elif isinstance(out_grads, dict):
            out_grads = [out_grads.get(n) for n in self._out_names]
        self.runner.backward(list(out_grads) + [None] * (len(self.outputs) - len(out_grads)))

    def copy_params_from(self, arg_params: dict, aux_params: dict | None = None,
                         allow_extra_params: bool = False) -> None:
        for name, array in arg_params.items():
            if name in self.arg_dict:
                assign(self.arg_dict[name], array)
            elif not allow_extra_params:
                raise ValueError(f"Find name \"{name}\" that is not in the arguments")
        for name, array in (aux_params or {}).items():
            if name in self.aux_dict:
                assign(self.aux_dict[name], array)
            elif not allow_extra_params:
                raise ValueError(f"Find name \"{name}\" that is not in the auxiliary states")

    def set_monitor_callback(self, callback: Any, monitor_all: bool = False) -> None:
        warnings.warn("mxmirror: the segmented executor does not support monitor callbacks; "
                      "ignored", stacklevel=2)

    def reshape(self, partial_shaping: bool = False, allow_up_sizing: bool = False,
                **kwargs: Any):
        raise PlanError("the segmented executor cannot reshape: bind again with the new "
                        "shapes (mxmirror.simple_bind plans them afresh)")

    def debug_str(self) -> str:
        parts, total = [], 0
        for ex in self.templates.executors.values():
            text = ex.debug_str()
            total += sum(allocated_mb(text))
            parts.append(text)
        head = (f"mxmirror segmented executor: {self.plan.segments.m} segments, "
                f"{len(self.templates.executors)} executors sharing one pool\nTotal {total} "
                f"MB allocated (sum over the executors)\n")
        return head + "\n".join(parts)

    @property
    def executors(self) -> dict:
        """The template executors (key -> MXNet executor), largest first."""
        return dict(self.templates.executors)
