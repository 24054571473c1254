"""When a plan pays: the share of training memory that is intermediate values (what a
plan can shrink) against arguments, their gradients and aux states (what it cannot).

A plan recomputes activations; it saves nothing on the parameters, their gradients, the
optimizer's state or MXNet itself. On a small batch or a shallow network the
intermediates are a small share of what the process holds, and so is any saving.
"""

from __future__ import annotations

from mxmirror.log import mb_text
from mxmirror.runtime.plan import Plan

SMALL = 0.10  # a saving below this share of the training memory is said to be small


def memory_share(plan: Plan) -> list[str]:
    """Lines for `mxmirror plan` / `memory`: the intermediates' share of training memory,
    what the plan saves of it, and whether that is under SMALL."""
    args, grads, aux = plan.resident_bytes
    total = plan.baseline_bytes + args + grads + aux
    saved = plan.baseline_bytes - plan.planned_bytes
    lines = [f"training memory without a plan: {mb_text(total / 2**20)}, of which "
             f"intermediates (activations and their gradients, what a plan can shrink) "
             f"{mb_text(plan.baseline_bytes / 2**20)} = {plan.baseline_bytes / total:.0%}; "
             f"arguments {mb_text(args / 2**20)}, their gradients {mb_text(grads / 2**20)} and "
             f"aux states {mb_text(aux / 2**20)} stay (optimizer state and MXNet itself come "
             f"on top)",
             f"this plan saves {mb_text(saved / 2**20)} = {saved / total:.0%} of it"]
    if saved < SMALL * total:
        lines[-1] += (f": under {SMALL:.0%}, the intermediates are too small a share here to "
                      f"gain much (a larger batch or a deeper network gains more)")
    return lines
