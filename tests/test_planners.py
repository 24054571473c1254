"""Planner rules that keep plans runnable and worth their recomputation."""

from __future__ import annotations

import mxnet as mx
import numpy as np
import pytest

import mxmirror
from mxmirror.adapter.figure import mxnet_mb
from mxmirror.api import prepare
from mxmirror.ir import ops
from mxmirror.ir.symbol_json import annotate_json
from mxmirror.planning.algorithm3 import greedy_cuts, segment_mirror
from mxmirror.planning.strategies import search
from mxmirror.runtime.segmented.executor import SegmentedExecutor
from mxmirror.sim import training_graph
from symbols import lstm
from symbols.chain import conv_chain
from symbols.resnet import resnet, resnet_by_depth


def _embedding_lm():
    emb = mx.sym.Embedding(mx.sym.Variable("data"), input_dim=20, output_dim=8, name="embed")
    cell = mx.rnn.LSTMCell(num_hidden=16, prefix="l0_")
    out, _ = cell.unroll(3, inputs=emb, layout="NTC", merge_outputs=True)
    pred = mx.sym.FullyConnected(mx.sym.Reshape(out, shape=(-1, 16)), num_hidden=20, name="pred")
    label = mx.sym.Reshape(mx.sym.Variable("softmax_label"), shape=(-1,))
    return mx.sym.SoftmaxOutput(pred, label, name="softmax"), dict(data=(4, 3),
                                                                   softmax_label=(4, 3))


@pytest.mark.parametrize("policy", ["cheap", "sqrt", "optimal"])
def test_ops_that_must_write_are_mirrored_only_when_read(policy: str) -> None:
    """A copy's unread first output is asked to write nothing; Embedding (and others off
    MKLDNN) refuse."""
    sym, shapes = _embedding_lm()
    p = mxmirror.plan(sym, policy=policy, **shapes)
    tg = training_graph.build(p.graph, p.recomputed_ids)
    read = {id(src) for t in tg.nodes for src, index in t.inputs if index == 0}
    unread = [t.name for t in tg.nodes if t.role == "mirror" and id(t) not in read
              and ops.must_write(p.graph.nodes[t.fwd].op, p.graph.nodes[t.fwd].attrs)]
    assert unread == []
    # and the planned graph runs (the mx.rnn zero begin states are never mirrored)
    req = {a: ("null" if a in shapes else "write") for a in sym.list_arguments()}
    ex = p.symbol.simple_bind(mx.cpu(), grad_req=req, **shapes)
    ex.arg_dict["data"][:] = np.random.RandomState(0).randint(0, 20, (4, 3))
    ex.forward(is_train=True)
    ex.backward()
    mx.nd.waitall()
    assert all(np.isfinite(g.asnumpy()).all() for g in ex.grad_dict.values() if g is not None)


def test_unread_copies_of_cheap_ops_are_kept_when_they_save_memory() -> None:
    """A copy nobody reads still lets its node's backward read recomputed inputs."""
    prep = prepare(lstm.paper_lstm(12, num_hidden=256, num_embed=256),
                       **lstm.input_shapes(12, 32, num_hidden=256))
    p = prep.plan("cheap")
    tg = training_graph.build(prep.analysis.graph, p.recomputed_ids)
    read = {id(src) for t in tg.nodes for src, _ in t.inputs}
    unread = {t.fwd for t in tg.nodes if t.role == "mirror" and id(t) not in read}
    assert unread, "the cheap LSTM plan has no unread copies: this test checks nothing"
    without = prep.analysis.score(p.recomputed_ids - unread)
    assert p.planned_bytes < p.baseline_bytes
    assert p.planned_bytes <= without.planned_bytes


def test_budget_below_one_recomputation_falls_back_to_the_multilevel_executor() -> None:
    """A budget no one-recompute plan meets gets a segmented plan that fits, and trains."""
    sym = conv_chain(48, 8, batchnorm=False)  # deep and narrow: segments win
    # values large enough that the plan saves more than its recomputed nodes' structures
    shapes = dict(data=(16, 3, 16, 16), softmax_label=(16,))
    prep = prepare(sym, **shapes)
    one_recompute = prep.plan("optimal")
    deepest = prep.own_plan("recursive")
    assert deepest.planned_bytes < one_recompute.planned_bytes, "no room below one recompute"
    budget = (one_recompute.planned_bytes + deepest.planned_bytes) // 2
    p = mxmirror.plan(sym, policy="budget", budget=budget, **shapes)
    assert p.execution.kind == "segmented"
    assert p.planned_bytes <= budget
    assert p.recompute_ratio > one_recompute.recompute_ratio

    rng = np.random.RandomState(0)
    values = {n: rng.uniform(-0.1, 0.1, s) for n, s in
              zip(sym.list_arguments(), sym.infer_shape(**shapes)[0])}
    values["softmax_label"] = rng.randint(0, 10, shapes["softmax_label"])
    req = {a: ("null" if a in shapes else "write") for a in sym.list_arguments()}
    grads = []
    planned = mxmirror.simple_bind(sym, mx.cpu(), policy="budget", budget=budget,
                                   grad_req=req, **shapes)
    assert isinstance(planned, SegmentedExecutor)
    for ex in (sym.simple_bind(mx.cpu(), grad_req=req, **shapes), planned):
        for name, arr in ex.arg_dict.items():
            arr[:] = values[name]
        ex.forward(is_train=True)
        ex.backward()
        mx.nd.waitall()
        grads.append({k: g.asnumpy() for k, g in ex.grad_dict.items() if g is not None})
    for name in grads[0]:
        np.testing.assert_allclose(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("net", ["lstm", "resnet"])
def test_budget_at_the_sqrt_figure_needs_no_segmented_executor(net: str) -> None:
    """Whatever sqrt reaches with one recomputation per node, budget reaches without more."""
    if net == "lstm":
        prep = prepare(lstm.paper_lstm(8, num_hidden=64, num_embed=64),
                           **lstm.input_shapes(8, 16, num_hidden=64))
    else:
        prep = prepare(resnet_by_depth(20, bottleneck=False, num_classes=10,
                                           image_shape=(3, 32, 32)),
                           data=(16, 3, 32, 32))
    sq = prep.plan("sqrt")
    p = prep.plan("budget", sq.planned_bytes)
    assert p.execution.kind == "mirror"
    assert p.planned_bytes <= sq.planned_bytes
    assert p.recompute_ratio <= sq.recompute_ratio + 1e-9


def test_a_cut_costs_its_values_and_the_inputs_their_backward_pins() -> None:
    """A kept h = o * tanh(c) is read by its own backward together with o and tanh(c), so
    the LSTM step cut {c, h} (two values cross) holds four tensors; a residual sum's backward
    reads nothing."""
    batch, hidden = 4, 16
    prep = prepare(lstm.paper_lstm(3, num_layers=1, num_hidden=hidden, num_embed=hidden),
                       **lstm.input_shapes(3, batch, num_layers=1, num_hidden=hidden))
    graph = prep.analysis.graph
    step = {frozenset(graph.nodes[i].name for i in c.keep): c for c in prep.analysis.cuts}
    cut = step[frozenset({"t1_l0_c", "t1_l0_h"})]
    assert (cut.bytes, cut.pinned) == (2 * batch * hidden * 4, 4 * batch * hidden * 4)

    prep = prepare(resnet([2, 2, 2], bottleneck=False, num_classes=10,
                              image_shape=(3, 8, 8)), data=(2, 3, 8, 8), softmax_label=(2,))
    graph = prep.analysis.graph
    sums = [c for c in prep.analysis.cuts
            if [graph.nodes[i].name for i in c.keep] == ["stage1_unit1_sum"]]
    assert len(sums) == 1
    assert sums[0].bytes == sums[0].pinned == 2 * 16 * 8 * 8 * 4


def test_the_taper_search_improves_a_flat_plan_and_mxnet_allocates_its_prediction() -> None:
    """optimal's last phase (segment lengths per stage, piecewise constant; stages of 24+
    candidate cuts) changes where cuts go, so its plans must still be exactly what MXNet
    allocates."""
    sym = resnet([26, 26, 26], bottleneck=False, num_classes=10, image_shape=(3, 32, 32))
    shapes = dict(data=(16, 3, 32, 32), softmax_label=(16,))
    prep = prepare(sym, **shapes)
    a = prep.analysis

    def evaluate(chosen, below=None):
        mirror = segment_mirror(a, chosen)
        return a.score_below(mirror, below), mirror

    start = greedy_cuts(a, 6 * max(c.bytes for c in a.cuts))
    flat, mirror = evaluate(start)
    got, _, _ = search._taper_search(evaluate, a.cuts, flat, mirror, start)
    assert got.planned_bytes < flat.planned_bytes
    planned = annotate_json(prep.source_json, got.recomputed_ids)
    assert mxnet_mb(planned, shapes, grad_req="write") == got.planned_bytes // 2**20


def test_search_is_never_above_the_cheap_plan() -> None:
    """On a small conv net (a user's five Conv-BatchNorm-ReLU-pool stages) no cut pays and
    search found nothing below the unplanned graph while cheap saves: search takes it."""
    x = mx.sym.Variable("data")
    for i, c in enumerate((16, 16, 32, 32, 32)):
        x = mx.sym.Convolution(x, num_filter=c, kernel=(3, 3), pad=(1, 1), name=f"conv{i}")
        x = mx.sym.Activation(mx.sym.BatchNorm(x, name=f"bn{i}"), act_type="relu")
        x = mx.sym.Pooling(x, kernel=(2, 2), stride=(2, 2), pool_type="max")
    sym = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(x, num_hidden=10), name="softmax")
    prep = prepare(sym, data=(16, 3, 64, 64), softmax_label=(16,))
    cheap, found = prep.plan("cheap"), prep.plan("search")
    assert cheap.planned_bytes < cheap.baseline_bytes, "cheap saves nothing: this checks nothing"
    assert found.planned_bytes <= cheap.planned_bytes
