"""The budget policy over budgets from 0.05x to 1x of the unplanned figure: MXNet's own figure
of every plan it returns is within the budget, recompute never grows with the budget, and a
budget is refused only below the smallest figure any policy reaches."""

from __future__ import annotations

import pytest
from test_memory_vs_mxnet import bind_in_children

from mxmirror import PlanError
from mxmirror.api import Prepared, prepare
from mxmirror.planning.budget_front import budget_front
from symbols import lstm
from symbols.resnet import resnet_by_depth

FRACTIONS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
ONE_POLICY_PLANS = ("none", "cheap", "sqrt", "search", "recursive")


def _net(name: str) -> Prepared:
    if name == "resnet50":
        return prepare(resnet_by_depth(50, image_shape=(3, 64, 64)), data=(4, 3, 64, 64))
    if name == "cifar110":
        return prepare(resnet_by_depth(110, bottleneck=False, num_classes=10,
                                       image_shape=(3, 32, 32)), data=(4, 3, 32, 32))
    return prepare(lstm.paper_lstm(12, num_layers=2, num_hidden=64, num_embed=64),
                   **lstm.input_shapes(12, 8, num_layers=2, num_hidden=64))


@pytest.mark.parametrize("name", ["resnet50", "cifar110", "lstm"])
def test_budget_sweep(name: str) -> None:
    prep = _net(name)
    base = prep.analysis.baseline.planned_bytes
    smallest = min(prep.plan(p).planned_bytes for p in ONE_POLICY_PLANS)
    plans, refused = [], []
    for f in FRACTIONS:
        budget = int(base * f)
        try:
            plans.append((budget, prep.plan("budget", budget)))
        except PlanError as exc:
            assert "any policy reaches" in str(exc)
            refused.append(budget)
            with pytest.raises(PlanError):
                prep.plan("multilevel", budget)  # no family reaches it
    assert plans and plans[-1][1].recompute_ratio == 0.0  # 1x: nothing to recompute
    assert all(b < smallest for b in refused)
    assert all(b < plans[0][0] for b in refused)  # refused budgets are the smallest ones
    ratios = [p.recompute_ratio for _, p in plans]
    assert ratios == sorted(ratios, reverse=True)
    assert len(set(ratios)) >= 4, f"the front is coarse: {ratios}"
    for budget, p in plans:
        assert p.planned_bytes <= budget
    # MXNet's own figure (whole MB, rounded down) of each distinct mirror plan, bound in
    # two children (what plan.mxnet_mb() measures one child at a time); segmented plans:
    # the predicted figure above, until the segmented executor is measured as a whole
    mirror = {p.recomputed_ids: p for _, p in plans
              if p.execution.kind == "mirror" and p.recomputed_ids}
    assert mirror
    jobs = [{"symbol": p.execution.symbol_json(p), "grad_req": p.inputs.grad_req,
             "shapes": {k: list(v) for k, v in p.inputs.shapes.items()}, "env": {},
             "cost": 1} for p in mirror.values()]
    measured = dict(zip(mirror, bind_in_children(jobs).result()))
    for budget, p in plans:
        if p.recomputed_ids in measured:
            assert measured[p.recomputed_ids] <= budget / 2**20, (budget, p.summary())


def test_the_front_is_monotone_and_the_smallest_is_named() -> None:
    prep = _net("cifar110")
    pts = budget_front(prep.analysis)
    assert all(x.planned_bytes < y.planned_bytes and x.recompute_ratio > y.recompute_ratio
               for x, y in zip(pts, pts[1:]))
    low = pts[0]
    with pytest.raises(PlanError, match=f"{low.planned_bytes / 2**20:.1f} MB \\(the "
                                        f"{low.policy} plan"):
        prep.plan("budget", low.planned_bytes - 1)
    assert prep.plan("budget", low.planned_bytes).planned_bytes == low.planned_bytes


@pytest.mark.parametrize("name", ["resnet50", "cifar110", "lstm"])
def test_answers_without_the_segmented_family_are_the_fronts(name: str) -> None:
    """least_recompute skips the segmented plans where a one-recompute plan that fits
    recomputes less than dp.recompute_floor: the floor holds for every segmented plan, and the
    answer is the whole front's at every budget."""
    from mxmirror.planning import budget_front as fr
    from mxmirror.planning.choice import segmented_choice
    from mxmirror.planning.dp import curve, recompute_floor

    a = _net(name).analysis
    floor = recompute_floor(a)
    ratios = [segmented_choice(a, sp).score.recompute_ratio for _, _, sp in curve(a)]
    assert min(ratios) >= floor > 0, (min(ratios), floor)
    skipped = 0
    for f in FRACTIONS:
        budget = int(a.baseline.planned_bytes * f)
        fr._fronts.pop(a, None)  # as a fresh process: the whole front not computed yet
        lazy = fr.least_recompute(a, budget)
        skipped += a not in fr._fronts
        fits = [p for p in fr.budget_front(a) if p.planned_bytes <= budget]
        assert lazy == (fits[-1] if fits else None), f
    assert skipped  # some budgets never compute the segmented plans
