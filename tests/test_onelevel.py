"""One extra forward on the segmented executor: the multi-level DP over several chains.

The finest chain's DP starts at about 1.8 extra forwards; Algorithm 3's coarser chains
(planners.dp.chains) reach 1.0 (store-all: every segment's forward twice) and fill the
range between. Checked: the curve reaches recompute <= 1.0, the budget answer is monotone
with no budget between the recursive and the store-all figure left without a plan, and
the plans of coarse chains (store-all and a deeper DP tree) train exactly like MXNet:
bitwise against the graph with plain layout at the cuts (MKL-DNN on, see
test_segmented_users) and against the unchanged graph in a child with MKL-DNN off.
"""

from __future__ import annotations

import mxnet as mx
import numpy as np
import pytest
from test_segmented_users import _equal, _shapes, lm, plain_at_cuts

from mxmirror.api import prepare
from mxmirror.planning import chains, dp
from mxmirror.runtime.segmented.executor import SegmentedExecutor
from mxmirror.segments.cost import make_segment_plan
from mxmirror.segments.cuts import chain_cuts
from mxmirror.segments.grad_sums import weight_sums
from symbols.lstm import input_shapes, paper_lstm
from symbols.resnet import resnet_by_depth
from tests import mkldnn_off
from tests.helpers import assert_same

MKLDNN = mkldnn_off.MKLDNN
STEPS, LR = 2, 0.05


def _nets():
    lstm = paper_lstm(8, num_layers=2, num_hidden=16, num_embed=16, input_size=12,
                      num_classes=10, dropout=0.5)
    resnet = resnet_by_depth(20, bottleneck=False, num_classes=10, image_shape=(3, 32, 32))
    return {"lstm": (lstm, input_shapes(8, 4, num_layers=2, num_hidden=16, input_size=12)),
            "resnet": (resnet, {"data": (4, 3, 32, 32), "softmax_label": (4,)})}


@pytest.fixture(scope="module", params=["lstm", "resnet"])
def net(request):
    sym, shapes = _nets()[request.param]
    return request.param, sym, shapes, prepare(sym, **shapes)


def _curve_ends(prep):
    """The recursive plan's bytes and the least bytes of a store-all plan on any chain."""
    every = [dp.chain_curve(prep.analysis, sp)[1][2] for sp in dp.chains(prep.analysis)]
    assert all(max(p.dry.runs) == 2 for p in every)
    return prep.own_plan("recursive").planned_bytes, min(p.planned_bytes for p in every)


def test_small_segments_joined_where_no_worse(net) -> None:
    """The finest chain joins its segments of fewer than MIN_OPS operators where the binary
    recursion then neither recomputes more nor needs more bytes (and sums every gradient as
    MXNet does), and keeps every cut where it would. On the LSTM the join (each step's
    h = o * tanh(c) on its own) recomputes less but needs 256 bytes more: the zero-op
    blocks of the last states' gradients are no longer held (value_sums), 512 bytes less
    kept with every cut, 256 with the join, whose pool is 512 bytes larger; over 12 steps
    the join is taken (test_lstm_join_taken)."""
    name, _, _, prep = net
    a = prep.analysis
    every = chain_cuts(a.graph, [c.pos for c in a.cuts])
    joined = chains.joined_cuts(a, every)
    bounds = [-1, *joined, len(a.graph.op_order) - 1]
    assert set(joined) < set(every)  # both nets have segments of 1 and 2 operators
    assert min(hi - lo for lo, hi in zip(bounds, bounds[1:])) >= chains.MIN_OPS
    plain, merged = make_segment_plan(a.graph, every), make_segment_plan(a.graph, joined)
    no_worse = (dp.recompute_of(merged) <= dp.recompute_of(plain)
                and merged.planned_bytes <= plain.planned_bytes and merged.segments.exact)
    rec = prep.own_plan("recursive").execution.segment_plan
    assert chains.segment_chain(a).cuts == rec.cuts == (joined if no_worse else every)
    assert not no_worse
    if name == "lstm":
        assert dp.recompute_of(merged) < dp.recompute_of(plain) and merged.segments.exact
        assert merged.planned_bytes == plain.planned_bytes + 256


def test_lstm_join_taken() -> None:
    """The test LSTM over 12 steps: the join needs no more bytes, and is taken."""
    sym = paper_lstm(12, num_layers=2, num_hidden=16, num_embed=16, input_size=12,
                     num_classes=10, dropout=0.5)
    a = prepare(sym, **input_shapes(12, 4, num_layers=2, num_hidden=16, input_size=12)).analysis
    every = chain_cuts(a.graph, [c.pos for c in a.cuts])
    joined = chains.joined_cuts(a, every)
    plain, merged = make_segment_plan(a.graph, every), make_segment_plan(a.graph, joined)
    assert merged.planned_bytes <= plain.planned_bytes and merged.segments.exact
    assert dp.recompute_of(merged) < dp.recompute_of(plain)
    assert chains.segment_chain(a).cuts == joined


def test_no_join_summing_weights_otherwise() -> None:
    """A join is not taken where its segments would sum a shared weight's gradient in
    another order than MXNet (a 4-step LM), though its plan is no larger."""
    shapes = _shapes("lm", 4)
    sym = lm(4)
    a = prepare(sym, grad_req={n: "null" if n in shapes else "write"
                               for n in sym.list_arguments()}, **shapes).analysis
    every = chain_cuts(a.graph, [c.pos for c in a.cuts])
    plain = make_segment_plan(a.graph, every)
    merged = make_segment_plan(a.graph, chains.joined_cuts(a, every))
    assert merged.planned_bytes <= plain.planned_bytes
    assert dp.recompute_of(merged) <= dp.recompute_of(plain)
    assert not all(exact for _, exact in merged.segments.weight_sums.values())
    assert chains.finest_cuts(a) == every


def test_curve_reaches_one_recompute(net) -> None:
    _, _, _, prep = net
    a = prep.analysis
    chains = dp.chains(a)
    # the finest chain first (its segments of fewer than MIN_OPS operators joined: an LSTM
    # step's h = o * tanh(c), as long as Algorithm 3's finest grid chain)
    assert len(chains) > 1 and chains[0].segments.m >= max(c.segments.m for c in chains[1:])
    pts = dp.curve(a)
    rec = prep.own_plan("recursive")
    assert (pts[0][0], pts[0][1]) == (rec.planned_bytes, rec.recompute_ratio)  # unchanged
    assert min(r for _, r, _ in pts) <= 1.0  # store-all schedules
    assert {id(p.segments) for _, _, p in pts} == {id(c.segments) for c in chains}


def test_budget_monotone_no_holes(net) -> None:
    """Every budget from the recursive figure up to the smallest store-all plan gets a plan
    that fits, recompute never rises with the budget, and it ends at one extra forward."""
    name, _, _, prep = net
    a = prep.analysis
    low, high = _curve_ends(prep)
    assert low < high
    budgets = [int(low * (high / low) ** (k / 12)) for k in range(12)] + [high]
    plans = [dp.plan_for_budget(a, b) for b in budgets]
    assert all(p.planned_bytes <= b for p, b in zip(plans, budgets))
    ratios = [dp.recompute_of(p) for p in plans]
    assert all(x >= y - 1e-12 for x, y in zip(ratios, ratios[1:]))
    assert ratios[-1] <= 1.0 < ratios[0]
    finest = dp._chain_for_budget(a, dp.chains(a)[0], high)
    if name == "resnet":  # coarse chains help (on the LSTM the finest chain, one segment per
        # step once each step's h = o * tanh(c) joins it, is as coarse as the grid's best)
        assert finest is None or dp.recompute_of(finest) > ratios[-1]


def _coarse_plans(prep):
    """A coarse chain's store-all plan and the tightest DP schedule on that chain."""
    a = prep.analysis
    sp = next(c for c in dp.chains(a)[1:] if c.segments.m >= 4)
    every = dp.chain_curve(a, sp)[1][2]
    tight = dp._least_on_chain(a, sp)
    assert max(every.dry.runs) == 2 and max(tight.dry.runs) >= 3
    return [every, tight]


def _fill(sym, shapes, exs, seed=0):
    rng = np.random.RandomState(seed)
    ref = exs[0]
    for k, v in ref.arg_dict.items():
        val = rng.randint(0, 10, v.shape) if k.endswith("label") else \
            rng.uniform(-0.5, 0.5, v.shape)
        for e in exs:
            e.arg_dict[k][:] = val
    for k, v in ref.aux_dict.items():
        val = rng.uniform(0.5, 1.5, v.shape) if "var" in k else rng.uniform(-.1, .1, v.shape)
        for e in exs:
            e.aux_dict[k][:] = val


def test_coarse_schedules_train_like_mxnet(net) -> None:
    name, sym, shapes, prep = net
    req = {a: ("null" if a in shapes else "write") for a in sym.list_arguments()}
    for sp in _coarse_plans(prep):
        # the LSTM's weights, read by every step, are summed in MXNet's own order
        # (grad_sums): every gradient bitwise
        assert all(exact for _, exact in weight_sums(sp.segments).values())
        ref_sym = plain_at_cuts(sym, sp) if MKLDNN else sym
        ref = ref_sym.simple_bind(mx.cpu(), grad_req=req, **shapes)
        ex = SegmentedExecutor(sym, mx.cpu(), sp)
        _fill(sym, shapes, [ref, ex])
        for step in range(STEPS):
            for e in (ref, ex):
                mx.random.seed(11 + step)  # the same Dropout masks in both
                e.forward(is_train=True)
                e.backward()
            mx.nd.waitall()
            for a, b in zip(ref.outputs, ex.outputs):
                assert _equal(a.asnumpy(), b.asnumpy())
            assert_same(ref.grad_dict, ex.grad_dict, f"gradients at step {step}", _equal)
            assert_same(ref.aux_dict, ex.aux_dict, f"aux states at step {step}", _equal)
            for k, g in ref.grad_dict.items():
                if g is not None:
                    ref.arg_dict[k][:] -= LR * g
                    ex.arg_dict[k][:] -= LR * ex.grad_dict[k]
        assert ex.runner.peak_kept_bytes == sp.dry.peak_bytes


def test_without_mkldnn() -> None:
    """The same schedules bit-identical to the unchanged graph with MKL-DNN off (child)."""
    if not MKLDNN:
        pytest.skip("already the child")
    mkldnn_off.run_pytest(__file__, "train_like_mxnet", passed=2)
