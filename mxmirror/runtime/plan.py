"""The Plan value: what to recompute, what it costs, and how to bind it.

A plan runs in one of two ways, and callers never need to know which:
``MirrorExecution`` (MXNet's own executor, the plan written into the symbol as
``__force_mirroring__`` attributes; each recomputed node runs once more) and
``SegmentedExecution`` (mxmirror's SegmentedExecutor; segments may run several
times). Both answer ``bind``, ``training_graph``, ``executor_graphs``, ``mxnet_mb`` and
``describe``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from mxmirror.adapter.figure import mxnet_mb_many
from mxmirror.adapter.free_memory import on_gpu
from mxmirror.adapter.symbol import load_mxnet
from mxmirror.errors import PlanError
from mxmirror.ir import ops
from mxmirror.ir.graph import BindInputs, Graph
from mxmirror.ir.symbol_json import annotate_json
from mxmirror.log import mb_text
from mxmirror.planning.analysis import Analysis
from mxmirror.planning.choice import Decision
from mxmirror.runtime.aux_order import order_aux_updates
from mxmirror.runtime.binds import unhooked
from mxmirror.runtime.segmented.executor import SegmentedExecutor
from mxmirror.runtime.segmented.measure import measure
from mxmirror.runtime.segmented.sharing import mxnet_bind
from mxmirror.segments.cost import SegmentPlan, template_graphs
from mxmirror.sim import training_graph
from mxmirror.sim.training_graph import TrainingGraph


@dataclass
class MirrorExecution:
    """MXNet's own executor runs the plan: recomputed nodes carry ``__force_mirroring__``."""

    kind = "mirror"
    _json: str | None = None

    def symbol_json(self, plan: Plan) -> str:
        if self._json is None:
            if plan.source_json is None:
                raise ValueError("this plan was made from a graph without a symbol")
            self._json = annotate_json(plan.source_json, plan.recomputed_ids)
        return self._json

    def bind(self, plan: Plan, ctx: Any, symbol: Any = None, args: Any = None,
             **kwargs: Any) -> Any:
        mx = load_mxnet()
        sym = mx.sym.load_json(self.symbol_json(plan))
        if args is not None:
            return mxnet_bind(unhooked("bind"), sym, ctx, args=args, **kwargs)
        return mxnet_bind(unhooked("simple_bind"), sym, ctx, **kwargs)

    def training_graph(self, plan: Plan) -> TrainingGraph | None:
        return training_graph.build(plan.graph, set(plan.recomputed_ids))

    def executor_graphs(self, plan: Plan) -> list[TrainingGraph]:
        return [self.training_graph(plan)]

    def mxnet_mb(self, plan: Plan) -> float | None:
        inputs = plan.inputs
        return mxnet_mb_many([{
            "symbol": self.symbol_json(plan), "grad_req": inputs.grad_req,
            "shapes": {k: list(v) for k, v in inputs.shapes.items()},
            "type_dict": inputs.type_dict}])[0]

    def describe(self) -> dict:
        return {}


@dataclass
class SegmentedExecution:
    """mxmirror's SegmentedExecutor runs the plan: a chain of MXNet executors on one pool."""

    segment_plan: SegmentPlan
    kind = "segmented"

    def symbol_json(self, plan: Plan) -> str:
        raise PlanError(f"policy {plan.policy!r} recomputes nodes more than once, which "
                        f"MXNet's own executor cannot do: bind it with plan.bind(ctx), "
                        f"mxmirror.simple_bind or inside mxmirror.enabled()")

    def bind(self, plan: Plan, ctx: Any, symbol: Any = None, args: Any = None,
             args_grad: Any = None, aux_states: Any = None, shared_exec: Any = None,
             shared_arg_names: Any = None, shared_buffer: Any = None, **_ignored: Any) -> Any:
        if symbol is None:
            symbol = load_mxnet().sym.load_json(plan.source_json)
        names = symbol.list_arguments()
        aux_names = symbol.list_auxiliary_states()

        def as_dict(values, keys):
            if values is None or isinstance(values, dict):
                return values
            return dict(zip(keys, values))

        if shared_exec is not None and not isinstance(shared_exec, SegmentedExecutor):
            shared_exec = shared_exec if hasattr(shared_exec, "arg_dict") else None
        return SegmentedExecutor(symbol, ctx, self.segment_plan, args=as_dict(args, names),
                                 args_grad=as_dict(args_grad, names),
                                 aux_states=as_dict(aux_states, aux_names),
                                 shared_exec=shared_exec, shared_arg_names=shared_arg_names,
                                 shared_buffer=shared_buffer)

    def training_graph(self, plan: Plan) -> TrainingGraph | None:
        return None  # several executors: no single MXNet training graph

    def executor_graphs(self, plan: Plan) -> list[TrainingGraph]:
        return list(template_graphs(self.segment_plan.segments).values())

    def mxnet_mb(self, plan: Plan) -> float | None:
        """The whole plan as allocated, measured in a child (measure.py): every array the
        bound executor holds, MB."""
        return self.measure(plan)["measured_mb"]["total"]

    def measure(self, plan: Plan, steps: int = 0) -> dict:
        """measure.measure's breakdown (measured and predicted MB) of this plan."""
        return measure(self.segment_plan, plan.source_json, steps)

    def describe(self) -> dict:
        return {"segmented": self.segment_plan.describe()}


@dataclass
class Plan:
    """What to recompute, what to keep, what it costs, and how to bind it."""

    @classmethod
    def of(cls, policy: str, analysis_of: Callable[[], Analysis],
           nodes: list[tuple[str, str]], decision: Decision, inputs: BindInputs | None = None,
           source_json: str | None = None, plan_seconds: float = 0.0,
           budget: str | None = None, release: Callable[[], None] | None = None,
           gpu: bool = False) -> Plan:
        """The Plan of a planning Decision, run by whichever executor its choice needs;
        `nodes`: (name, op) by node id; `analysis_of`: the analysed graph, asked for only
        where it is needed (drawing, a segmented bind)."""
        choice = decision.choice
        execution = (MirrorExecution() if choice.segments is None
                     else SegmentedExecution(choice.segments))
        return cls(policy, analysis_of, nodes, choice.score.recomputed_ids,
                   list(choice.checkpoints), decision.baseline_bytes,
                   choice.score.planned_bytes, choice.score.recompute_ratio, execution,
                   inputs=inputs, source_json=source_json, plan_seconds=plan_seconds,
                   notes=list(decision.notes), budget=budget,
                   resident_bytes=decision.resident_bytes,
                   baseline_blocks=decision.baseline_blocks,
                   planned_blocks=decision.planned_blocks, release_analysis=release, gpu=gpu)

    policy: str
    analysis_of: Callable[[], Analysis] = field(repr=False)
    nodes: list[tuple[str, str]] = field(repr=False)  # (name, op) by node id
    recomputed_ids: frozenset[int]  # op nodes whose forward runs more than once a step
    checkpoints: list[str]  # names of kept segment boundaries
    baseline_bytes: int
    planned_bytes: int  # predicted, as MXNet's debug_str would count it
    recompute_ratio: float  # extra forward FLOPs / forward FLOPs
    execution: MirrorExecution | SegmentedExecution
    inputs: BindInputs | None = None
    source_json: str | None = None  # the symbol as given, without mirror attributes
    plan_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    budget: str | None = None  # the budget planned for and where it came from
    resident_bytes: tuple[int, int, int] = (0, 0, 0)  # arguments, their gradients, aux states
    # MXNet's executor's storage blocks unplanned and planned (planning.choice.Decision)
    baseline_blocks: tuple[int, ...] = ()
    planned_blocks: tuple[int, ...] = ()
    release_analysis: Callable[[], None] | None = field(default=None, repr=False)
    gpu: bool = False  # planned for a GPU (api.plan's ctx)

    @cached_property
    def analysis(self) -> Analysis:
        return self.analysis_of()

    def release(self) -> None:
        """Drop the analysed graph (read again where something asks for it): most of the
        memory planning took, which MXNet's executor does not need to bind the plan (the
        segmented executor does: its plans keep it)."""
        if isinstance(self.execution, SegmentedExecution):
            return
        self.__dict__.pop("analysis", None)
        if self.release_analysis is not None:
            self.release_analysis()

    @property
    def graph(self) -> Graph:
        return self.analysis.graph

    @property
    def skipped(self) -> dict[str, str]:
        """Nodes never recomputed, with the reason."""
        return self.analysis.skipped

    @property
    def mirrored(self) -> list[str]:
        """Names of the recomputed nodes, in graph order."""
        return [self.nodes[i][0] for i in sorted(self.recomputed_ids)]

    @property
    def baseline_mb(self) -> float:
        return self.baseline_bytes / 2**20

    @property
    def planned_mb(self) -> float:
        return self.planned_bytes / 2**20

    @property
    def symbol(self) -> Any:
        """A copy of the symbol with the plan in its attributes; plain MXNet binds it.
        PlanError for plans only the segmented executor can run."""
        return load_mxnet().sym.load_json(self.execution.symbol_json(self))

    def bind(self, ctx: Any, symbol: Any = None, **kwargs: Any) -> Any:
        """An executor (mx.executor.Executor interface) that trains with this plan.

        Keywords as ``Symbol.simple_bind``; with ``args=`` (and ``args_grad``,
        ``aux_states``) as ``Symbol.bind``. ``symbol``: the user's symbol, for the names
        of its arguments (default: the planned one). BatchNorm statistics are ordered after
        each backward (aux_order). A plan made for a CPU whose MXNet executor would run a
        copy that must write on a GPU (ir/ops.MUST_WRITE_ON_GPU) with its output unread is
        refused there."""
        if on_gpu(ctx) and not self.gpu and isinstance(self.execution, MirrorExecution) \
                and {self.nodes[i][1] for i in self.recomputed_ids} & ops.MUST_WRITE_ON_GPU \
                and Analysis(self.graph, gpu=True).drop_unread(self.recomputed_ids) \
                != set(self.recomputed_ids):
            raise PlanError(f"this plan was made for a CPU and recomputes BatchNorm where "
                            f"nothing reads the copy's output, which cuDNN refuses on a GPU: "
                            f"plan it for the GPU, mxmirror.plan(..., ctx={ctx!r})")
        return order_aux_updates(self.execution.bind(self, ctx, symbol=symbol, **kwargs))

    def training_graph(self) -> TrainingGraph | None:
        """The one MXNet training graph that runs this plan, or None (several executors)."""
        return self.execution.training_graph(self)

    def executor_graphs(self) -> list[TrainingGraph]:
        """The training graph of every MXNet executor this plan binds: the one, or each
        template executor's."""
        return self.execution.executor_graphs(self)

    def mxnet_mb(self) -> float | None:
        """MXNet's own figure for this plan, from a bind in a child process (None: not
        measurable as one figure)."""
        if self.inputs is None:
            raise ValueError("this plan was made from a graph without its bind inputs")
        return self.execution.mxnet_mb(self)

    def to_dict(self) -> dict:
        return {
            "policy": self.policy,
            "nodes": sum(op != "null" for _, op in self.nodes),
            "mirrored": list(self.mirrored),
            "checkpoints": list(self.checkpoints),
            "baseline_mb": round(self.baseline_mb, 3),
            "planned_mb": round(self.planned_mb, 3),
            "recompute_ratio": round(self.recompute_ratio, 4),
            "plan_seconds": round(self.plan_seconds, 3),
            **({"budget": self.budget} if self.budget else {}),
            **self.execution.describe(),
        }

    def summary(self) -> str:
        """One line (the bind hook logs it); a plan that recomputes nothing says why."""
        why = f" ({'; '.join(self.notes)})" if self.notes and not self.recomputed_ids else ""
        return (f"mxmirror: policy={self.policy} baseline={mb_text(self.baseline_mb, 0)} "
                f"planned={mb_text(self.planned_mb, 0)} recompute={self.recompute_ratio:.2f}x "
                f"mirrored={len(self.mirrored)} nodes"
                + (f" budget={self.budget}" if self.budget else "") + why)

