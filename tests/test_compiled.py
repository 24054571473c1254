"""The compiled training graph scores every mirror set as building it would: same execution
order, same reads, same MXNet figure, same copies (memory_plan.simulate on training_graph.build
is itself checked against MXNet in test_memory_vs_mxnet.py)."""

from __future__ import annotations

import random

import mxnet as mx
import pytest

from mxmirror.api import prepare
from mxmirror.sim import memory_plan, training_graph
from symbols.lstm import input_shapes, paper_lstm
from symbols.resnet import resnet


def _embedding_lm():
    emb = mx.sym.Embedding(mx.sym.Variable("data"), input_dim=20, output_dim=8, name="embed")
    cell = mx.rnn.LSTMCell(num_hidden=16, prefix="l0_")
    out, _ = cell.unroll(9, inputs=emb, layout="NTC", merge_outputs=True)
    out = mx.sym.Dropout(out, p=0.3, name="drop")
    pred = mx.sym.FullyConnected(mx.sym.Reshape(out, shape=(-1, 16)), num_hidden=20, name="pred")
    label = mx.sym.Reshape(mx.sym.Variable("softmax_label"), shape=(-1,))
    return mx.sym.SoftmaxOutput(pred, label, name="softmax"), dict(data=(4, 9),
                                                                   softmax_label=(4, 9))


NETS = {
    "resnet": lambda: (resnet([2, 2, 2], bottleneck=False, num_classes=10,
                              image_shape=(3, 32, 32)),
                       {"data": (4, 3, 32, 32), "softmax_label": (4,)}),
    # 9 steps: weights shared by >= 8 readers get a _grad_add chain with control deps
    "lstm": lambda: (paper_lstm(9, num_layers=2, num_hidden=32, num_embed=32, num_classes=50,
                                dropout=0.2),
                     input_shapes(9, 4, num_layers=2, num_hidden=32)),
    "embedding+dropout": _embedding_lm,
}


def _built(a, kept):
    tg = training_graph.build(a.graph, kept)
    sim = memory_plan.simulate(tg, timeline=True)
    return ([t.op for t in tg.nodes], sim.total_bytes, sim.block_bytes, sim.timeline,
            sorted(t.fwd for t in tg.nodes if t.role == "mirror"))


def _compiled(a, kept):
    c = a.compiled
    fg, copies = c.flat(kept)
    sim = memory_plan.simulate_flat(fg, timeline=True)
    return ([c.op[i] for i in fg.order], sim.total_bytes, sim.block_bytes, sim.timeline,
            sorted(copies))


@pytest.mark.parametrize("name", sorted(NETS))
def test_compiled_equals_built(name: str) -> None:
    sym, shapes = NETS[name]()
    a = prepare(sym, **shapes).analysis
    assert a.compiled is not None
    ids = [n.id for n in a.order]
    rng = random.Random(7)
    sets = [frozenset(), frozenset(ids)]
    sets += [frozenset(i for i in ids if rng.random() < p) for p in (0.1, 0.3, 0.5, 0.7, 0.9)]
    for mirror in sets:
        kept = a.drop_unread(mirror)  # what Analysis.score simulates
        assert _compiled(a, kept) == _built(a, kept)
        assert _compiled(a, set(mirror)) == _built(a, set(mirror))  # even unread copies


@pytest.mark.parametrize("name", sorted(NETS))
def test_score_below_stops_only_at_the_bound(name: str) -> None:
    sym, shapes = NETS[name]()
    a = prepare(sym, **shapes).analysis
    ids = [n.id for n in a.order]
    mirror = frozenset(ids[::2])
    fg, _ = a.compiled.flat(a.drop_unread(mirror))
    total = memory_plan.simulate_flat(fg).total_bytes
    assert memory_plan.simulate_flat(fg, stop_at=total) is None
    assert memory_plan.simulate_flat(fg, stop_at=total + 1).total_bytes == total
    assert a.score_below(mirror, total) is None  # not below: remembered as a lower bound
    assert a.score_below(mirror, total - 1) is None
    assert a.score_below(mirror, total + 1).planned_bytes == total
    assert a.score(mirror).planned_bytes == total
    assert a.score_below(mirror, total) is None  # memoized exact score, same answer
