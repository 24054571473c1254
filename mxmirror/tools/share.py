"""When a plan pays: the share of training memory that is intermediate values (what a
plan can shrink) against arguments, their gradients and aux states (what it cannot).

A plan recomputes activations; it saves nothing on the parameters, their gradients, the
optimizer's state or MXNet itself. On a small batch or a shallow network the
intermediates are a small share of what the process holds, and so is any saving.
"""

from __future__ import annotations

from mxmirror.runtime.plan import Plan
from mxmirror.tools.viz import fmt_mb

SMALL = 0.10  # a saving below this share of the training memory is said to be small


def memory_share(plan: Plan) -> list[str]:
    """Lines for `mxmirror plan` / `memory`: the intermediates' share of training memory,
    what the plan saves of it, and whether that is under SMALL."""
    args, grads, aux = plan.resident_bytes
    total = plan.baseline_bytes + args + grads + aux
    saved = plan.baseline_bytes - plan.planned_bytes
    lines = [f"training memory without a plan: {fmt_mb(total / 2**20)}, of which "
             f"intermediates (activations and their gradients, what a plan can shrink) "
             f"{fmt_mb(plan.baseline_bytes / 2**20)} = {plan.baseline_bytes / total:.0%}; "
             f"arguments {fmt_mb(args / 2**20)}, their gradients {fmt_mb(grads / 2**20)} and "
             f"aux states {fmt_mb(aux / 2**20)} stay (optimizer state and MXNet itself come "
             f"on top)",
             f"this plan saves {fmt_mb(saved / 2**20)} = {saved / total:.0%} of it"]
    if saved < SMALL * total:
        lines[-1] += (f": under {SMALL:.0%}, the intermediates are too small a share here to "
                      f"gain much (a larger batch or a deeper network gains more)")
    return lines
