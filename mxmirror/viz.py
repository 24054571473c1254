"""Draw a plan with graphviz: kept checkpoints, recomputed nodes and the rest look different."""

from __future__ import annotations

import shutil
from pathlib import Path

from .plan import Plan
from .planners.common import node_bytes

STYLE = {
    "checkpoint": {"style": "filled,bold", "fillcolor": "#2e7d32", "fontcolor": "white"},
    "recomputed": {"style": "filled,dashed", "fillcolor": "#ffcc80"},
    "kept": {"style": "filled", "fillcolor": "#e0e0e0"},
}


def node_roles(plan: Plan) -> dict[int, str]:
    """checkpoint / recomputed / kept for every op node."""
    ckpt = set(plan.checkpoints)
    roles = {}
    for n in plan.graph.op_nodes:
        if n.id in plan.mirror_ids:
            roles[n.id] = "recomputed"
        elif n.name in ckpt:
            roles[n.id] = "checkpoint"
        else:
            roles[n.id] = "kept"
    return roles


def to_dot(plan: Plan) -> str:
    """Deterministic DOT source of the plan's forward graph."""
    roles = node_roles(plan)
    lines = ["digraph plan {", '  rankdir=TB; node [shape=box, fontname="Helvetica", '
             'fontsize=10]; edge [fontsize=8, color="#757575"];',
             f'  label="policy={plan.policy}  baseline={plan.baseline_mb:.0f} MB  '
             f'planned={plan.planned_mb:.0f} MB  recompute={plan.recompute_ratio:.2f}x\\n'
             'green: checkpoint (kept)  orange dashed: recomputed in backward  '
             'grey: kept"; labelloc=t;']
    for n in plan.graph.op_nodes:
        style = ", ".join(f'{k}="{v}"' for k, v in STYLE[roles[n.id]].items())
        mb = node_bytes(n) / 2**20
        lines.append(f'  n{n.id} [label="{n.name}\\n{n.op}  {mb:.1f} MB", '
                     f'class="{roles[n.id]}", {style}];')
    for n in plan.graph.op_nodes:
        for src, _ in n.inputs:
            if not plan.graph.nodes[src].is_variable:
                lines.append(f"  n{src} -> n{n.id};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def plot_plan(plan: Plan, path: str | Path) -> tuple[Path, str]:
    """Write .dot, or render .svg/.pdf/.png through Debian's `dot` when it is installed."""
    path = Path(path)
    source = to_dot(plan)
    fmt = path.suffix.lstrip(".").lower()
    if fmt in ("dot", "gv", ""):
        path.write_text(source)
        return path, ""
    if shutil.which("dot") is None:
        dot_path = path.with_suffix(".dot")
        dot_path.write_text(source)
        return dot_path, "graphviz 'dot' not found: wrote the DOT source instead"
    import graphviz

    src = graphviz.Source(source, format=fmt)
    out = src.render(filename=path.with_suffix("").name, directory=str(path.parent),
                     cleanup=True)
    return Path(out), ""
