"""Graphs with amp_cast (what mx.contrib.amp inserts, or a user's own casts to float16).

``Symbol.tojson()`` leaves amp_cast and amp_multicast out by default (``remove_amp_cast``),
while a bind runs them: mxmirror read such a graph without its casts, found its node order
unlike its internals' and refused it ("internal error"), the bind hook binding unplanned and
PlannedBlock raising. It now reads the graph MXNet binds (adapter/symbol.symbol_json): its
plans keep the casts, recompute them like any op, and train as plain MXNet does, MKL-DNN on
and off (a child).
"""

from __future__ import annotations

import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxmirror
from mxmirror.adapter.reader import load_graph
from mxmirror.gluon import PlannedBlock
from tests import mkldnn_off
from tests.helpers import assert_planned, bound_regardless, hooked_steps

BATCH, IN, HIDDEN, CLASSES, STEPS = 32, 16, 64, 10, 3


def amp_symbol() -> mx.sym.Symbol:
    """FullyConnected layers whose outputs round through float16 (amp_cast there and
    back), an amp_multicast of two of them, relu, SoftmaxOutput."""
    h = mx.sym.var("data")
    for i in range(4):
        h = mx.sym.FullyConnected(h, num_hidden=HIDDEN, name=f"fc{i}")
        h = mx.sym.amp_cast(mx.sym.amp_cast(h, dtype="float16"), dtype="float32")
        h = mx.sym.Activation(h, act_type="relu", name=f"relu{i}")
    a, b = mx.sym.amp_multicast(h, mx.sym.FullyConnected(h, num_hidden=HIDDEN, name="side"),
                                num_outputs=2)
    out = mx.sym.FullyConnected(a + b, num_hidden=CLASSES, name="out")
    return mx.sym.SoftmaxOutput(out, name="softmax")


def test_the_graph_read_keeps_the_casts():
    sym = amp_symbol()
    graph = load_graph(sym, {"data": (BATCH, IN)})
    ops = [n.op for n in graph.nodes if not n.is_variable]
    assert ops.count("amp_cast") == 8 and ops.count("amp_multicast") == 1
    assert len(graph.nodes) == len(json.loads(sym.tojson(remove_amp_cast=False))["nodes"])
    assert "amp_cast" not in sym.tojson()  # what mxmirror read before


def _train(policy: str | None) -> tuple[dict, list[str]]:
    """STEPS steps of simple_bind training (plain, or bound under the hook) and the ops of
    the mirrored nodes MXNet's executor runs."""
    return hooked_steps(amp_symbol(), {"data": (BATCH, IN), "softmax_label": (BATCH,)},
                        policy, STEPS, CLASSES, lr=0.01)


@pytest.mark.parametrize("policy", ["sqrt", "search"])
def test_bind_hook_plans_and_trains_like_plain(policy):
    plain, none = _train(None)
    assert none == []
    with bound_regardless():
        seen, mirrored = _train(policy)
    assert "amp_cast" in mirrored, mirrored  # the casts recomputed like any op
    assert seen.keys() == plain.keys()
    bad = [k for k in plain if not np.array_equal(seen[k], plain[k])]
    assert not bad, bad[:5]


def test_planned_symbol_keeps_the_casts():
    p = mxmirror.plan(amp_symbol(), "sqrt", data=(BATCH, IN), softmax_label=(BATCH,))
    nodes = json.loads(p.symbol.tojson(remove_amp_cast=False))["nodes"]
    assert sum(n["op"] == "amp_cast" for n in nodes) == 8
    assert p.mirrored


class AmpNet(gluon.HybridBlock):
    """Dense layers whose outputs round through float16, as amp_symbol's (wider, for a
    plan that pays beside PlannedBlock's copies)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.layers = nn.HybridSequential()
            self.layers.add(*(nn.Dense(4 * HIDDEN) for _ in range(6)))
            self.out = nn.Dense(CLASSES)

    def hybrid_forward(self, F, x):
        for dense in self.layers:
            x = F.relu(F.amp_cast(F.amp_cast(dense(x), dtype="float16"), dtype="float32"))
        return self.out(x)


def _gluon(policy: str | None) -> dict:
    mx.random.seed(0)
    net = AmpNet(prefix="amp_")
    net.initialize(mx.init.Xavier())
    net.hybridize()
    model = net if policy is None else PlannedBlock(net, policy)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    rs = np.random.RandomState(1)
    seen = {}
    for step in range(STEPS):
        x = mx.nd.array(rs.uniform(-1, 1, (BATCH, IN)))
        y = mx.nd.array(rs.randint(0, CLASSES, (BATCH,)))
        with autograd.record():
            out = model(x)
            loss = gluon.loss.SoftmaxCrossEntropyLoss()(out, y)
        loss.backward()
        seen[f"out{step}"] = out.asnumpy()
        for name, p in net.collect_params().items():
            seen[f"grad{step} {name}"] = p.grad().asnumpy()
        trainer.step(BATCH)
    seen.update({f"value {k}": p.data().asnumpy() for k, p in net.collect_params().items()})
    if policy is not None:
        assert_planned(model)
        (executor,) = model.executors
        assert any(name.startswith("amp_amp_cast") for name in executor.plan.mirrored)
    return seen


def test_planned_block_trains_like_plain():
    plain = _gluon(None)
    with bound_regardless():
        seen = _gluon("sqrt")
    bad = [k for k in plain if not np.array_equal(seen[k], plain[k])]
    assert seen.keys() == plain.keys() and not bad, bad[:5]


def test_without_mkldnn():
    """The same with MKL-DNN off (read at process start: a child)."""
    if not mkldnn_off.MKLDNN:
        pytest.skip("this process already runs without MKL-DNN")
    mkldnn_off.run_pytest(__file__, "not without_mkldnn", passed=5)
