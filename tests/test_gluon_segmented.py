"""PlannedBlock on the segmented executor, and what a recorded call can take.

The network is a deep chain of small conv-BatchNorm-ReLU blocks (symbols/gluon_chain.py),
where the registry really applies the recursive plan: it is below the best
one-recompute plan, so the planned executor is a SegmentedExecutor (checked).

The reference is plain hybridized Gluon. With MKL-DNN on, a value crossing into a
sub-executor arrives in plain layout where the whole graph keeps a blocked one, and
MKL-DNN's BatchNorm then reduces in another order (docs/recursive.md); so with MKL-DNN
on the reference is the same block with ``clip(-3e38, 3e38)`` on every value crossing a
cut (tests/test_segmented_users.plain_at_cuts), trained as a hybridized SymbolBlock on the
same Parameters. Every comparison is bitwise; ``test_mkldnn_off_bit_identical`` reruns them
in a child with ``MXNET_MKLDNN_ENABLED=0`` against the unchanged block.
"""

from __future__ import annotations

import logging
import os
import textwrap
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from mxmirror.errors import PlanError
from mxmirror.gluon import PlannedBlock
from mxmirror.log import show as show_log
from mxmirror.runtime.segmented.executor import SegmentedExecutor
from symbols.gluon_chain import ConvChain
from tests.helpers import assert_planned, bound_regardless
from tests.mkldnn_off import run_code
from tests.test_gluon import CTXS, assert_same, train
from tests.test_segmented_users import plain_at_cuts

ROOT = Path(__file__).resolve().parents[1]
MKLDNN = os.environ.get("MXNET_MKLDNN_ENABLED") != "0"
SIZE, BLOCKS = 16, 32


def chain(dtype="float32", dropout=False):
    mx.random.seed(0)
    # two masks: with more the plan is no longer below the one-recompute plan
    net = ConvChain(BLOCKS, dropout_after=(10, 21) if dropout else ())
    net.initialize(mx.init.Xavier(), ctx=CTXS)
    return net


def dropout_chain(dtype="float32"):
    return chain(dtype, dropout=True)


def segment_plan(make, batch):
    """The plan a PlannedBlock(recursive) binds for `make`'s block (whatever it saves: the
    chain is small): segmented, checked."""
    CTXS[:] = [mx.cpu(0)]
    net = make()
    net.hybridize()
    planned = PlannedBlock(net, "recursive")
    with autograd.record(), bound_regardless():
        planned(mx.nd.zeros((batch, 3, SIZE, SIZE)))
    (bound,) = planned.executors
    assert isinstance(bound.exec, SegmentedExecutor), (bound.plan.execution.kind, bound.plan.notes)
    return bound.plan.execution.segment_plan


def reference(make, batch):
    """What plain hybridized Gluon computes for the segmented plan (module doc)."""
    if not MKLDNN:
        return make
    plan = segment_plan(make, batch)

    def clipped(dtype="float32"):
        net = make(dtype)
        sym = plain_at_cuts(net(mx.sym.var("data")), plan)
        return gluon.SymbolBlock(sym, mx.sym.var("data"), params=net.collect_params())

    return clipped


def run(make, policy=None, **kw):
    return train(make, policy, size=SIZE, by_name=True, **kw)


def test_segmented_plan_trains_like_plain_hybridized(caplog):
    show_log()  # the "mxmirror" logger at INFO, as a PlannedBlock sets it
    logger = logging.getLogger("mxmirror")
    logger.addHandler(caplog.handler)
    try:
        planned = run(chain, "recursive")
    finally:
        logger.removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records if "policy=" in r.getMessage()]
    assert len(set(lines)) == 1 and "segments, binary recursion" in lines[0], lines
    assert_same(planned, run(reference(chain, 2)))


def test_segmented_two_contexts():
    ctxs = (mx.cpu(0), mx.cpu(1))
    assert_same(run(chain, "recursive", ctxs=ctxs, batch=4),
                run(reference(chain, 2), ctxs=ctxs, batch=4))


def test_segmented_dropout_equals_policy_none():
    """The segmented executor draws each mask once per forward, as the unplanned executor
    does, and replays it in every recomputation."""
    ref = reference(dropout_chain, 2)
    assert_same(run(dropout_chain, "recursive", seed=3), run(ref, "none", seed=3))


class TwoInputs(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.a = gluon.nn.Conv2D(4, 3, padding=1)
            self.b = gluon.nn.Conv2D(4, 3, padding=1)
            self.bn = gluon.nn.BatchNorm()
            self.out = gluon.nn.Dense(10)

    def hybrid_forward(self, F, x, y):
        return self.out(F.relu(self.bn(self.a(x) + self.b(y))))


def train_two_inputs(policy):
    mx.random.seed(0)
    net = TwoInputs()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    model = net if policy is None else PlannedBlock(net, policy)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    rs = np.random.RandomState(1)
    seen = {}
    for step in range(3):
        x = mx.nd.array(rs.rand(2, 3, 8, 8))
        y = mx.nd.array(rs.rand(2, 3, 8, 8))
        y.attach_grad()  # a gradient for the second input only
        with autograd.record():
            loss = (model(x, y) ** 2).mean()
        loss.backward()
        trainer.step(2)
        seen[f"loss{step}"] = loss.asnumpy()
        seen[f"dy{step}"] = y.grad.asnumpy()
    assert_planned(model)
    for k, p in enumerate(net.collect_params().values()):
        seen[f"value{k}"] = p.data().asnumpy()
    return seen


def test_several_positional_inputs():
    """Two positional inputs, the second needing its gradient, on MXNet's executor (policy
    none: so shallow a graph has nothing sqrt's plan would recompute that saves memory)."""
    assert_same(train_two_inputs("none"), train_two_inputs(None))


def test_unsupported_inputs_are_refused_quickly():
    mx.random.seed(0)
    net = TwoInputs()
    net.initialize()
    net.hybridize()
    planned = PlannedBlock(net, "sqrt")
    x = mx.nd.ones((2, 3, 8, 8))
    cases = [((x, x.asnumpy()), {}, "input 1 is ndarray"),
             ((x, x.as_in_context(mx.cpu(1))), {}, "cpu\\(0\\), cpu\\(1\\)"), ((), {}, "none")]
    for args, kwargs, match in cases:
        with autograd.record(), pytest.raises(PlanError, match="NDArrays.*" + match):
            planned(*args, **kwargs)
    # a second call before backward() reached the first: its own executor (policy none
    # always binds one; tests/test_gluon_calls.py compares such calls with plain Gluon)
    planned = PlannedBlock(net, "none")
    with autograd.record():
        both = planned(x, x) + planned(x, x)
    both.backward()
    assert len(planned.executors) == 2
    with autograd.record():  # after backward() the block trains on, on the same executors
        planned(x, x).backward()
    assert len(planned.executors) == 2


def test_inference_in_a_recording_runs_the_block():
    """record(train_mode=False) (gradients of an inference pass): the block itself, so a
    planned executor only ever runs training forwards."""
    CTXS[:] = [mx.cpu(0)]
    net = chain()
    net.hybridize()
    planned = PlannedBlock(net, "recursive")
    x = mx.nd.ones((2, 3, SIZE, SIZE))
    x.attach_grad()
    with autograd.record(train_mode=False):
        planned(x).sum().backward()
    dx = x.grad.asnumpy()
    with autograd.record(train_mode=False):
        net(x).sum().backward()
    np.testing.assert_array_equal(dx, x.grad.asnumpy())
    assert not planned.executors


def test_mkldnn_off_bit_identical():
    """MKL-DNN is read at process start: the comparisons above in a child with it off,
    against the unchanged block."""
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        from tests import test_gluon_segmented as t
        t.assert_same(t.run(t.chain, "recursive"), t.run(t.reference(t.chain, 2)))
        t.test_segmented_two_contexts()
        t.test_segmented_dropout_equals_policy_none()
        t.test_several_positional_inputs()
        print("ok")
    """)
    run_code(code)


class OptionalInput(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.dense = gluon.nn.Dense(3)

    def hybrid_forward(self, F, x, y=None):
        return self.dense(x) if y is None else self.dense(x + y)


def test_hook_trains_unsupported_inputs_unplanned(caplog):
    """Under enabled(), a call PlannedBlock cannot take (here a sparse input, which plain
    Gluon's CachedOp takes) is trained by the block itself, said once."""
    import mxmirror

    show_log()  # the "mxmirror" logger at INFO, as a PlannedBlock sets it
    logger = logging.getLogger("mxmirror")
    logger.addHandler(caplog.handler)
    grads = []
    try:
        for hooked in (True, False):
            mx.random.seed(0)
            net = OptionalInput()
            net.initialize()
            net.hybridize()
            x = mx.nd.ones((2, 4)).tostype("csr")
            with mxmirror.enabled("sqrt" if hooked else "none"):
                for _ in range(2):
                    with autograd.record():
                        out = net(x)
                    out.backward()
            grads.append(net.dense.weight.grad().asnumpy())
    finally:
        logger.removeHandler(caplog.handler)
    np.testing.assert_array_equal(grads[0], grads[1])
    lines = {r.getMessage() for r in caplog.records if "gluon" in r.getMessage()}
    assert lines == {"mxmirror: gluon optionalinput0 trained unplanned: PlannedBlock takes "
                     "NDArrays (nested in lists or tuples, None allowed) on one context; "
                     "input 0 is sparse (csr)"}, lines
