"""Gluon patterns of ordinary training scripts, met by trying the product as a user:
export after planned training, a validation pass inside record(train_mode=False), and
what a planned call cannot take part in (autograd.grad, backward(retain_graph=True)),
which must be refused with a PlanError before anything runs: measured without the
refusal, autograd.grad through a planned call stalled MXNet's engine and a second
backward of a retained graph trained wrong values. Each scenario that could hang runs in
a child process with a timeout (tests.test_gluon_calls._child).
"""

from __future__ import annotations

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from mxmirror.errors import PlanError
from mxmirror.gluon import PlannedBlock
from tests import mkldnn_off
from tests.test_gluon_calls import _child, dense_bn

CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
from tests import test_gluon_patterns as t
t.{name}()
print("ok")
"""


def _step(model, x, y, trainer=None):
    with autograd.record():
        loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    if trainer is not None:
        trainer.step(x.shape[0])
    return loss


def check_grad_refused() -> None:
    net = dense_bn()
    net.hybridize()
    planned = PlannedBlock(net, "sqrt")
    x = mx.nd.random.uniform(shape=(8, 10))
    x.attach_grad()
    for of_weight in (False, True):
        with autograd.record():
            loss = planned(x).sum()
        try:
            autograd.grad(loss, [net[0].weight.data() if of_weight else x])
        except PlanError as e:
            assert "autograd.grad" in str(e)
        else:
            raise AssertionError("autograd.grad through a planned call was not refused")
        loss.backward()  # the refused graph is still whole: train on
    mx.nd.waitall()


def check_retain_graph_refused() -> None:
    net = dense_bn()
    net.hybridize()
    planned = PlannedBlock(net, "sqrt")
    x = mx.nd.random.uniform(shape=(8, 10))
    with autograd.record():
        loss = planned(x).sum()
    for call in (lambda: loss.backward(retain_graph=True),
                 lambda: autograd.backward([loss], retain_graph=True)):
        try:
            call()
        except PlanError as e:
            assert "retain_graph" in str(e)
        else:
            raise AssertionError("backward(retain_graph=True) was not refused")
    loss.backward()
    mx.nd.waitall()


def test_autograd_grad_refused():
    _child(CHILD.format(name="check_grad_refused"), timeout=300)


def test_retain_graph_refused():
    _child(CHILD.format(name="check_retain_graph_refused"), timeout=300)


def test_export_after_planned_training(tmp_path):
    """HybridBlock.export saves the Parameters the block's CachedOp lists; a block only
    ever called planned must still export all of them, with their trained values."""
    net = dense_bn()
    net.hybridize()
    planned = PlannedBlock(net, "sqrt")
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    x, y = mx.nd.random.uniform(shape=(8, 10)), mx.nd.random.uniform(shape=(8, 1))
    for _ in range(2):
        _step(planned, x, y, trainer)
    net.export(str(tmp_path / "net"))
    saved = mx.nd.load(str(tmp_path / "net-0000.params"))
    params = net.collect_params()
    assert len(saved) == len(list(params.keys()))
    for key, value in saved.items():
        assert np.array_equal(value.asnumpy(), params[key.split(":", 1)[1]].data().asnumpy())
    back = gluon.SymbolBlock.imports(str(tmp_path / "net-symbol.json"), ["data"],
                                     str(tmp_path / "net-0000.params"))
    assert np.array_equal(back(x).asnumpy(), net(x).asnumpy())


def test_validation_inside_record_predict_mode():
    """A validation pass in record(train_mode=False) between training steps (updates no
    statistics) does not stop the next planned call, and training equals plain Gluon."""
    results = []
    for policy in (None, "sqrt"):
        net = dense_bn()
        net.hybridize()
        model = net if policy is None else PlannedBlock(net, policy)
        trainer = gluon.Trainer(net.collect_params(), "sgd",
                                {"learning_rate": 0.1, "momentum": 0.9})
        rs = np.random.RandomState(0)
        outs = []
        for _ in range(3):
            x, y = mx.nd.array(rs.rand(8, 10)), mx.nd.array(rs.rand(8, 1))
            _step(model, x, y, trainer)
            with autograd.record(train_mode=False):
                outs.append(net(x).asnumpy())
        outs += [p.data().asnumpy() for p in net.collect_params().values()]
        results.append(outs)
    for plain, planned in zip(*results):
        assert np.array_equal(plain, planned)


def test_without_mkldnn():
    """The same with MKL-DNN off (read at process start: a child)."""
    if not mkldnn_off.MKLDNN:
        pytest.skip("this process already runs without MKL-DNN")
    mkldnn_off.run_pytest(__file__, "not without_mkldnn", passed=4)
