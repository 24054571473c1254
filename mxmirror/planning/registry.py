"""The policies by name, and what a policy and a budget may be.

Each strategy takes an Analysis and a budget and returns a ``Choice``; this registry
names them and validates a policy and budget for the API, the bind hook and the CLI alike.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from mxmirror.errors import PlanError
from mxmirror.planning.analysis import Analysis
from mxmirror.planning.choice import Choice
from mxmirror.planning.strategies import (
    auto,
    budget,
    cheap,
    multilevel,
    none,
    recursive,
    search,
    sqrt,
)

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
    """Bytes from an int or a string like '800MB', '1.5GB'; a fraction of a byte is dropped
    (a plan within the whole bytes is within the budget)."""
    if budget is None:
        return None
    if isinstance(budget, bool):
        raise PlanError(f"budget must be a size such as 800MB, not {budget!r}")
    if isinstance(budget, (int, float)):
        value = budget
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?B?|[kmgt]i?b)?\s*", str(budget),
                         flags=re.IGNORECASE)
        if not m:
            raise PlanError(f"budget must be a size such as 800MB or 1.5GB, not {budget!r}")
        unit = (m.group(2) or "").upper().replace("IB", "B")
        value = float(m.group(1)) * _UNITS[unit]
    if not value > 0:  # NaN too
        raise PlanError(f"budget must be positive, not {budget!r}")
    if value < 1:  # not floored to 0 bytes and then called not positive
        raise PlanError(f"budget {budget!r} is below one byte: too small; a budget is a whole "
                        f"number of bytes, such as 800MB")
    if value == float("inf"):
        raise PlanError(f"budget must be a finite size such as 800MB, not {budget!r}")
    return int(value)


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


