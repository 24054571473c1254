"""The largest batch (or deepest network) whose training fits a memory size, per policy.

Memory counted: the plan's planned intermediates (MXNet's memory plan, simulated)
+ arguments + argument gradients + aux states (MXNet allocates those outside its
plan). Sizes are searched on the simulator (no bind): where the line through the last
two planned totals reaches the memory, with doubling and bisection steps between.
The search assumes a larger batch (or depth) never needs less memory.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mxmirror.api import Prepared, prepare
from mxmirror.errors import PlanError
from mxmirror.ir.graph import resident_bytes
from mxmirror.planning import dp
from mxmirror.planning.registry import BUDGETED, resolve
from mxmirror.progress import task

POLICIES = ("none", "cheap", "sqrt", "search", "recursive", "multilevel")
COUNTED = "planned intermediates + arguments + argument gradients + aux states"
LIMIT = 1 << 20  # no size beyond this is searched
KEPT_GRAPHS = 3  # analysed graphs kept while searching (big graphs take memory)
NEAR = {"multilevel": "recursive"}  # a budgeted policy -> one whose size lands near it
# a budgeted policy -> the least planned bytes it reaches on a graph: where that (+ the
# resident bytes) passes the memory, the policy stops fitting (up to the DP's rounding)
LEAST: dict[str, Callable[[Any], int]] = {
    "multilevel": lambda a: dp.least_memory(a).planned_bytes}


@dataclass(frozen=True)
class Fit:
    """One policy's figures at one size."""

    policy: str
    size: int  # the searched parameter (batch, residual units, unroll length)
    value: int  # what the user reads: batch, depth in layers, unroll length
    planned_bytes: int
    total_bytes: int
    recompute_ratio: float
    fits: bool
    guide_bytes: int | None = None  # the total that decides `fits`, as a line can follow it

    def to_dict(self, key: str = "batch") -> dict:
        return {"policy": self.policy, key: self.value,
                "planned_mb": round(self.planned_bytes / 2**20, 1),
                "total_mb": round(self.total_bytes / 2**20, 1),
                "recompute_ratio": round(self.recompute_ratio, 4)}


def check_policies(policies: tuple[str, ...]) -> None:
    """PlanError for an unknown policy (budgeted ones get their budget per size)."""
    for p in policies:
        resolve(p, 1 if p in BUDGETED else None)


class SizeSearch:
    """Graphs indexed by one size parameter, analysed and planned on demand (memoized).

    ``build(k)`` gives the prepared graph at size k; ``value(k)`` the figure shown
    (e.g. a ResNet's depth in layers for k residual units); ``key`` its name.
    """

    def __init__(self, build: Callable[[int], Prepared], key: str = "batch", start: int = 1,
                 value: Callable[[int], int] = lambda k: k) -> None:
        self.build, self.key, self.start, self.value = build, key, start, value
        self._graphs: OrderedDict[int, Prepared] = OrderedDict()
        self._plans: dict[tuple[str, int], tuple[int, int, float]] = {}

    def prepared(self, k: int) -> Prepared:
        if k in self._graphs:
            self._graphs.move_to_end(k)
        else:
            while len(self._graphs) >= KEPT_GRAPHS:
                self._graphs.popitem(last=False)
            self._graphs[k] = self.build(k)
        return self._graphs[k]

    def at(self, policy: str, k: int, memory_bytes: int) -> Fit:
        """Whether `policy`'s plan at size k fits `memory_bytes`, with its figures."""
        if policy in BUDGETED:
            prep = self.prepared(k)
            resident = sum(resident_bytes(prep.analysis.graph))
            guide = resident + LEAST[policy](prep.analysis) if policy in LEAST else None
            try:
                if memory_bytes <= resident:
                    raise PlanError("the resident arrays alone do not fit")
                p = prep.plan(policy, memory_bytes - resident)
            except PlanError:
                return Fit(policy, k, self.value(k), 0, resident, 0.0, False, guide)
            return Fit(policy, k, self.value(k), p.planned_bytes, p.planned_bytes + resident,
                       p.recompute_ratio, True, guide)
        else:  # the plan does not depend on the memory size: plan once per size
            if (policy, k) not in self._plans:
                prep = self.prepared(k)
                p = prep.plan(policy)
                self._plans[policy, k] = (p.planned_bytes,
                                          sum(resident_bytes(prep.analysis.graph)),
                                          p.recompute_ratio)
            figures = self._plans[policy, k]
        planned, resident, ratio = figures
        total = planned + resident
        return Fit(policy, k, self.value(k), planned, total, ratio, total <= memory_bytes,
                   total)

    def largest(self, policy: str, memory_bytes: int,
                limit: int = LIMIT) -> tuple[Fit | None, Fit | None]:
        """(the largest size that fits, the smallest size found not to fit); (None, figures
        at start) when not even that fits.

        Memory grows about linearly with the size, so a plan's size is probed where the
        line through the last two guide totals (one: through zero) reaches the memory,
        which usually needs 3-4 plans; every third probe doubles or bisects instead, so a
        curve far from a line still converges. A plan's guide is its total; a budgeted
        policy's total says nothing of where its smallest plan stops fitting, so its guide
        is the least it reaches (LEAST: ``multilevel``), or it has none (``budget``,
        ``auto``: doubling and bisection only). ``multilevel`` first probes the size
        ``recursive`` (cheap to plan) reaches. Any probe order gives the same answer when
        memory grows with the size; the probes only decide how many plans.
        """
        with task(f"the largest {self.key} that fits ({policy})",
                  unit=f"{self.key} sizes tried") as tried:
            def at(k: int) -> Fit:
                tried.advance()
                return self.at(policy, k, memory_bytes)

            return self._largest(policy, memory_bytes, limit, at)

    def _largest(self, policy: str, memory_bytes: int, limit: int,
                 at: Callable[[int], Fit]) -> tuple[Fit | None, Fit | None]:
        first = at(self.start)
        if not first.fits:
            return None, first
        good, bad = first, None
        points = [first]
        near = self.largest(NEAR[policy], memory_bytes, limit)[0] if policy in NEAR else None
        if near is not None and near.size > good.size:
            f = at(near.size)
            good, bad = (f, bad) if f.fits else (good, f)
            points.append(f)
        probes = 0
        while good.size < limit and (bad is None or bad.size - good.size > 1):
            probes += 1
            k = None if probes % 3 == 0 else _where_line_reaches(points[-2:], memory_bytes)
            if k is None:
                k = 2 * good.size if bad is None else (good.size + bad.size) // 2
            k = max(good.size + 1, min(k, limit if bad is None else bad.size - 1))
            f = at(k)
            good, bad = (f, bad) if f.fits else (good, f)
            points.append(f)
        return good, bad


def _where_line_reaches(points: list[Fit], memory_bytes: int) -> int | None:
    """The largest size whose guide total, on the line through `points` (one point:
    through zero), is within `memory_bytes`; None when a point has no guide or the line
    does not rise."""
    if any(p.guide_bytes is None for p in points):
        return None
    (k0, t0), (k1, t1) = ((0, 0) if len(points) == 1 else (points[0].size,
                                                            points[0].guide_bytes),
                          (points[-1].size, points[-1].guide_bytes))
    if (k1 - k0) * (t1 - t0) <= 0:
        return None
    return k1 + int((memory_bytes - t1) * (k1 - k0) // (t1 - t0))


def scaled_shapes(template: dict[str, tuple[Any, ...]], n: int) -> dict[str, tuple[int, ...]]:
    """Every dimension written as N becomes n."""
    return {k: tuple(n if d == "N" else int(d) for d in dims) for k, dims in template.items()}


def batch_search(symbol: Any, template: dict[str, tuple[Any, ...]],
                 type_dict: dict[str, str] | None = None) -> SizeSearch:
    """The batch N of shapes written with N (e.g. data=(N, 3, 224, 224))."""
    if not any(d == "N" for dims in template.values() for d in dims):
        raise PlanError("write the batch dimension as N in a --shape, e.g. data=N,3,224,224")
    return SizeSearch(lambda n: prepare(symbol, type_dict=type_dict,
                                        **scaled_shapes(template, n)))


NETWORKS = ("resnet", "lstm")


def depth_search(network: str, batch: int, image: int = 224) -> SizeSearch:
    """The networks of symbols/ by depth: a bottleneck ResNet (ImageNet layout, depth 3k+2
    for k >= 16 residual units; CIFAR layout for images of 32 pixels or less, depth 9k+2),
    or the paper's 4 x 1024 LSTM by unroll length."""
    from symbols import lstm, resnet

    if network == "lstm":
        return SizeSearch(lambda t: prepare(lstm.paper_lstm(t), **lstm.input_shapes(t, batch)),
                          key="seq_len")
    if network != "resnet":
        raise PlanError(f"unknown network {network!r}; choose from {', '.join(NETWORKS)}")
    imagenet = image > 32
    per_unit, start = (3, 16) if imagenet else (9, 1)

    def build(k: int) -> Prepared:
        depth = per_unit * k + 2
        sym = resnet.resnet_by_depth(depth, num_classes=1000 if imagenet else 10,
                                     image_shape=(3, image, image))
        return prepare(sym, data=(batch, 3, image, image))

    return SizeSearch(build, key="depth", start=start, value=lambda k: per_unit * k + 2)
