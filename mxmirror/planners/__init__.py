"""The policies by name, and the one place a Plan is made.

Each strategy takes an Analysis and a budget and returns a ``Choice``; this
registry validates the policy and budget (for the API, the bind hook and the
CLI alike), runs the strategy, keeps it from ever being worse than no plan,
times it and builds the ``Plan``; plans are kept on disk (``cache``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from ..analysis import Analysis
from ..errors import PlanError
from ..plan import BindInputs, MirrorExecution, Plan, SegmentedExecution
from ..progress import scoring_bar
from . import auto, budget, cache, cheap, front, multilevel, none, recursive, search, sqrt
from .common import Choice

STRATEGIES: dict[str, Callable[[Analysis, int | None], Choice]] = {
    "none": none.choose,
    "cheap": cheap.choose,
    "sqrt": sqrt.choose,
    "budget": budget.choose,
    "search": search.choose,
    "recursive": recursive.choose,
    "multilevel": multilevel.choose,
    "auto": auto.choose,
}
ALIASES = {"optimal": "search"}  # the name `search` had before it said what it is
POLICIES: tuple[str, ...] = (*STRATEGIES, *ALIASES)  # every name a user may give
NEEDS_BUDGET = ("budget", "multilevel")  # the policies that cannot plan without a budget
BUDGETED = (*NEEDS_BUDGET, "auto")  # the policies that read a budget (auto: optional)
FROM_FRONT = ("budget", "auto")  # answered from the front, which applies the segmented rule

_UNITS = {"": 1, "B": 1, "KB": 2**10, "K": 2**10, "MB": 2**20, "M": 2**20, "GB": 2**30,
          "G": 2**30, "TB": 2**40}


def parse_budget(budget: Any) -> int | None:
    """Bytes from an int or a string like '800MB', '1.5GB'."""
    if budget is None:
        return None
    if isinstance(budget, bool):
        raise PlanError(f"budget must be a size such as 800MB, not {budget!r}")
    if isinstance(budget, (int, float)):
        value = int(budget)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?B?|[kmgt]i?b)?\s*", str(budget),
                         flags=re.IGNORECASE)
        if not m:
            raise PlanError(f"budget must be a size such as 800MB or 1.5GB, not {budget!r}")
        unit = (m.group(2) or "").upper().replace("IB", "B")
        value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise PlanError(f"budget must be positive, not {budget!r}")
    return value


def resolve(policy: str, budget: Any = None) -> tuple[str, int | None]:
    """(strategy name, budget bytes), or a PlanError that says what to fix."""
    if policy not in POLICIES:
        raise PlanError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    name = ALIASES.get(policy, policy)
    budget_bytes = parse_budget(budget)
    if name in NEEDS_BUDGET and budget_bytes is None:
        raise PlanError(f"policy {policy!r} needs a budget, e.g. --budget 800MB "
                        f"(budget=\"800MB\" in Python, MXMIRROR_BUDGET=800MB with "
                        f"MXMIRROR_POLICY)")
    if name not in BUDGETED and budget_bytes is not None:  # never silently ignored
        raise PlanError(f"policy {policy!r} takes no budget; only "
                        f"{', '.join(BUDGETED[:-1])} and {BUDGETED[-1]} plan to a budget: "
                        f"drop the budget or choose one of those")
    return name, budget_bytes


def make_plan(analysis: Analysis, policy: str = "sqrt", budget: Any = None,
              source_json: str | None = None, inputs: BindInputs | None = None,
              budget_source: str | None = None) -> Plan:
    """Run a policy on an analysed graph: a Plan never worse than no plan, and segmented
    only where that is below the best one-recompute plan for the same budget too.

    ``budget_source``: where the budget came from (said in the plan's summary); by
    default "given" when there is a budget."""
    return _make(analysis, policy, budget, source_json, inputs, budget_source,
                 never_worse=True)


def own_plan(analysis: Analysis, policy: str = "sqrt", budget: Any = None,
             source_json: str | None = None, inputs: BindInputs | None = None) -> Plan:
    """The policy's own plan, segmented even where a one-recompute plan is smaller (for
    studies of the segmented executor: its tests and benchmarks)."""
    return _make(analysis, policy, budget, source_json, inputs, None, never_worse=False)


def _make(analysis: Analysis, policy: str, budget: Any, source_json: str | None,
          inputs: BindInputs | None, budget_source: str | None, never_worse: bool) -> Plan:
    name, budget_bytes = resolve(policy, budget)
    start = time.perf_counter()
    key = cache.plan_key(name, budget_bytes, source_json, inputs, never_worse)
    found = cache.load(key, analysis)
    if found is None:
        found = _choose(analysis, name, budget_bytes, never_worse)
        cache.save(key, *found)
    choice, baseline_bytes, notes = found
    execution = (MirrorExecution() if choice.segments is None
                 else SegmentedExecution(choice.segments))
    return Plan(name, analysis, choice.score.mirror, list(choice.checkpoints),
                baseline_bytes, choice.score.planned_bytes, choice.score.recompute_ratio,
                execution, inputs=inputs, source_json=source_json,
                plan_seconds=time.perf_counter() - start, notes=notes,
                budget=None if budget_bytes is None or name not in BUDGETED else
                f"{budget_bytes / 2**20:.0f} MB ({budget_source or 'given'})")


def _choose(analysis: Analysis, name: str, budget_bytes: int | None, never_worse: bool
            ) -> tuple[Choice, int, list[str]]:
    """The strategy's choice kept from being worse than no plan (and, with `never_worse`,
    segmented only below the best one-recompute plan), the baseline bytes and the notes."""
    with scoring_bar(analysis, f"mxmirror: planning ({name})"):
        choice = STRATEGIES[name](analysis, budget_bytes)
        base = analysis.baseline
        notes = list(choice.notes)
        if never_worse and choice.segments is not None and name not in FROM_FRONT:
            choice, why = _segmented_or_one_recompute(analysis, choice, budget_bytes)
            notes += [why] if why else []
    recomputes = bool(choice.score.mirror)
    if choice.segments is not None and not recomputes:
        notes.append("nothing is recomputed: the graph is left as it is")
        choice = Choice(base)
    elif recomputes and choice.score.planned_bytes >= base.planned_bytes:
        notes.append(f"no recomputation lowers memory here (the {name} plan: "
                     f"{choice.score.planned_bytes / 2**20:.0f} MB, no plan: "
                     f"{base.planned_bytes / 2**20:.0f} MB): the graph is left as it is")
        choice = Choice(base)
    return choice, base.planned_bytes, notes


def _segmented_or_one_recompute(a: Analysis, segmented: Choice,
                                budget_bytes: int | None) -> tuple[Choice, str]:
    """Never worse: a segmented choice only below both no plan and the best one-recompute
    plan for the same budget; otherwise that plan (no recomputation: plain bind), and why."""
    alt = front.one_recompute(a, budget_bytes)
    seg_bytes = segmented.score.planned_bytes
    if seg_bytes < min(alt.score.planned_bytes, a.baseline.planned_bytes):
        return segmented, ""
    which = "the one-recompute plan" if alt.score.mirror else "no plan"
    return alt, (f"{which} is used: the segmented plan ({seg_bytes / 2**20:.2f} MB predicted, "
                 f"{segmented.score.recompute_ratio:.2f}x recompute) is not below {which} "
                 f"({alt.score.planned_bytes / 2**20:.2f} MB)")
