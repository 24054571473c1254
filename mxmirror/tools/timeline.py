"""Memory over one training step: the live bytes after each op of MXNet's training
schedule, for the unplanned graph (``sharing``, MXNet's default) and for the plan, from the
simulator; ``plot_timeline`` draws both with the forward/backward boundary, the
recomputation steps and MXNet's total allocated for each."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mxmirror.errors import PlanError
from mxmirror.runtime.plan import Plan
from mxmirror.sim import memory_plan, training_graph
from mxmirror.sim.training_graph import TrainingGraph
from mxmirror.tools.viz import check_outputs


@dataclass
class Timeline:
    """Live bytes after each training-graph op node, in MXNet's execution order."""

    live: list[int]  # bytes held by live blocks after each op node
    total_bytes: int  # MXNet-style total allocated
    backward_start: int  # index of the first node that is not forward
    recompute_at: list[int]  # indices of mirror (recompute) nodes


def timeline(tg: TrainingGraph) -> Timeline:
    """Simulate `sharing` on a training graph and keep the live-bytes curve."""
    sim = memory_plan.simulate(tg, "sharing", timeline=True)
    live, bwd, rec = [], None, []
    for t, b in zip(tg.nodes, sim.timeline):
        if t.op is None:
            continue
        if bwd is None and t.role != "fwd":
            bwd = len(live)
        if t.role == "mirror":
            rec.append(len(live))
        live.append(b)
    return Timeline(live, sim.total_bytes, len(live) if bwd is None else bwd, rec)


def timeline_data(plan: Plan) -> dict[str, Timeline | None]:
    """{'sharing': no plan, 'plan': the plan}.

    A segmented plan (several recomputations per node, run by the segmented
    executor) has no single MXNet training graph to replay: its 'plan' is None and
    only its planned total is known.
    """
    planned = plan.training_graph()
    return {"sharing": timeline(training_graph.build(plan.graph, set())),
            "plan": None if planned is None else timeline(planned)}


def plot_timeline(plan: Plan, path: str | Path, title: str | None = None) -> Path:
    """PNG (or .svg/.pdf) of live MB over the training schedule, no plan vs the plan."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    check_outputs(None, str(path))
    data = timeline_data(plan)
    base, planned = data["sharing"], data["plan"]
    mb = 1 / 2**20
    fig = Figure(figsize=(10, 4.8), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(range(len(base.live)), [b * mb for b in base.live], color="#546e7a", lw=1.2,
            label=f"no plan (sharing): live, total allocated {base.total_bytes * mb:.0f} MB")
    if planned is not None:
        ax.plot(range(len(planned.live)), [b * mb for b in planned.live], color="#e65100",
                lw=1.2, label=f"{plan.policy} plan: live, total allocated "
                              f"{planned.total_bytes * mb:.0f} MB")
        ax.axhline(planned.total_bytes * mb, color="#e65100", ls="--", lw=1)
        if planned.recompute_at:
            ax.plot(planned.recompute_at, [0] * len(planned.recompute_at), "|",
                    color="#fb8c00", ms=8,
                    label=f"recomputation ({len(planned.recompute_at)} mirror nodes)")
    else:
        ax.axhline(plan.planned_bytes * mb, color="#e65100", ls="--", lw=1,
                   label=f"{plan.policy} plan: total {plan.planned_bytes * mb:.0f} MB "
                         "(segmented executor: no per-node curve)")
    ax.axhline(base.total_bytes * mb, color="#546e7a", ls="--", lw=1)
    ax.axvline(base.backward_start, color="black", ls=":", lw=1)
    top = max(base.total_bytes, plan.planned_bytes if planned is None
              else planned.total_bytes) * mb
    ax.text(base.backward_start, top * 1.03, "forward  ", fontsize=9, va="bottom",
            ha="right")
    ax.text(base.backward_start, top * 1.03, "  backward", fontsize=9, va="bottom")
    ax.set_ylim(0, top * 1.12)
    ax.set_xlim(0, max(len(base.live), len(planned.live) if planned else 0))
    ax.set_xlabel("training-graph op node, in MXNet's execution order")
    ax.set_ylabel("MB (MXNet counting: 4 bytes per element)")
    ax.set_title(title or (f"Memory over one training step: policy={plan.policy}, "
                           f"recompute {plan.recompute_ratio:.2f}x"), fontsize=11)
    ax.legend(loc="upper right", fontsize=8, framealpha=0.9,
              title="dashed: total allocated (what MXNet reports)", title_fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    try:
        fig.savefig(str(path), metadata={"Software": None} if path.suffix == ".png" else None)
    except OSError as exc:
        raise PlanError(f"cannot write {path}: {exc.strerror}") from None
    return path
