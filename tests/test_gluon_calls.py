"""Several calls of one planned block in one record() (a GAN's discriminator on real and
fake data) train exactly as plain hybridized Gluon: every Parameter gradient (summed over
the calls), parameter, BatchNorm statistic, output and loss, bit for bit.

MXNet 1.9.1 deadlocks when autograd sums the Parameter gradients of two planned calls
(mxmirror/gluon.py's docstring says why), so the mixed cases run in a child process with
a timeout: a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxmirror
from mxmirror.gluon import PlannedBlock
from mxmirror.runtime.segmented.executor import SegmentedExecutor
from tests import mkldnn_off
from tests import test_gluon_segmented as seg
from tests.test_gluon import CTXS, assert_same

ROOT = Path(__file__).resolve().parents[1]


def dense_bn(dtype="float32"):
    """Deep enough for sqrt to recompute (checked in test_two_and_three_calls_like_plain)."""
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    for _ in range(4):
        net.add(gluon.nn.Dense(32), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"))
    net.add(gluon.nn.Dense(1))
    net.initialize(mx.init.Xavier(), ctx=CTXS)
    return net


def calls(make, policy=None, n=2, steps=3, input_grad=False, shape=(8, 10), by_name=False,
          optimizer="sgd", unused=None):
    """Every array a user can read after `steps` Trainer steps whose record() calls the
    block `n` times on different batches: gradients, parameters with BatchNorm
    statistics, outputs, losses (and the inputs' gradients); parameters by position, or
    by name for blocks that list them in another order. The output of call `unused`
    (an index) is left out of the loss."""
    CTXS[:] = [mx.cpu(0)]
    net = make()
    net.hybridize()
    params = list(net.collect_params().values())
    keys = [p.name if by_name else k for k, p in enumerate(params)]
    model = net if policy is None else PlannedBlock(net, policy)
    opt = {"learning_rate": 0.01, "wd": 1e-4, **({"momentum": 0.9} if optimizer == "sgd" else {})}
    trainer = gluon.Trainer(net.collect_params(), optimizer, opt)
    rs = np.random.RandomState(1)
    seen = {}
    for step in range(steps):
        xs = [mx.nd.array(rs.rand(*shape)) for _ in range(n)]
        for x in xs if input_grad else []:
            x.attach_grad()
        with autograd.record():
            outs = [model(x) for x in xs]
            loss = sum(((o - k) ** 2).mean() for k, o in enumerate(outs) if k != unused)
        loss.backward()
        seen[f"loss{step}"] = loss
        for i, (x, o) in enumerate(zip(xs, outs)):
            seen[f"out{step}.{i}"] = o
            if input_grad:
                seen[f"dx{step}.{i}"] = x.grad.asnumpy()
        for k, p in zip(keys, params):
            if p.grad_req != "null":
                seen[f"grad{step}.{k}"] = p.grad().asnumpy()
        trainer.step(shape[0])
    for k, p in zip(keys, params):
        seen[f"value.{k}"] = p.data()
    return {k: v.asnumpy() if isinstance(v, mx.nd.NDArray) else v for k, v in seen.items()}


def test_two_and_three_calls_like_plain():
    planned = PlannedBlock(_hybridized(dense_bn), "sqrt")
    with autograd.record():
        (planned(mx.nd.zeros((8, 10))) + planned(mx.nd.ones((8, 10)))).mean().backward()
    assert len(planned._bound) == 2
    assert all(b.plan.mirrored for b in planned._bound.values())
    for n in (2, 3):
        plain = calls(dense_bn, n=n)
        for policy in ("none", "sqrt"):
            assert_same(calls(dense_bn, policy, n=n), plain)


def _statistics(planned: dict, plain: dict) -> None:
    """Every array equal but the BatchNorm running statistics, which differ."""
    names = [p.name for p in _hybridized(dense_bn).collect_params().values()]
    stats = {f"value.{k}" for k, n in enumerate(names) if "running" in n}
    assert_same({k: v for k, v in planned.items() if k not in stats},
                {k: v for k, v in plain.items() if k not in stats})
    assert any(not np.array_equal(planned[k], plain[k]) for k in stats)


def test_input_gradients_of_every_call():
    """With the inputs' gradients asked for, every gradient still equals plain Gluon's.
    BatchNorm's running statistics do not: plain Gluon updates them first call first
    when the first call's input needs a gradient (else last call first, as the planned
    calls always do; measured, docs/gluon.md)."""
    _statistics(calls(dense_bn, "sqrt", n=2, input_grad=True),
                calls(dense_bn, n=2, input_grad=True))


def test_call_whose_output_is_unused():
    """A call's output left out of the loss: its backward never runs, as in plain Gluon,
    so its BatchNorm statistics are not updated. For an earlier call a later call's
    token still reaches it on the tape; it then skips its backward (its outputs' node was
    not reached). Bit for bit, for the last and for the first of 2 calls."""
    for unused in (1, 0):
        assert_same(calls(dense_bn, "sqrt", unused=unused), calls(dense_bn, unused=unused))


def test_segmented_plan_called_twice():
    """The segmented kind: two calls of a 32-block chain under the recursive plan, against
    plain Gluon (with MKL-DNN on, plain Gluon with values clipped at the plan's cuts, as
    tests/test_gluon_segmented.py explains)."""
    shape = (2, 3, seg.SIZE, seg.SIZE)
    planned = PlannedBlock(_hybridized(seg.chain), "recursive")
    with autograd.record():
        (planned(mx.nd.zeros(shape)) + planned(mx.nd.ones(shape))).mean().backward()
    assert len(planned._bound) == 2
    assert all(isinstance(b.exec, SegmentedExecutor) for b in planned._bound.values())
    assert_same(calls(seg.chain, "recursive", shape=shape, by_name=True),
                calls(seg.reference(seg.chain, 2), shape=shape, by_name=True))


def _hybridized(make):
    CTXS[:] = [mx.cpu(0)]
    net = make()
    net.hybridize()
    return net


class Generator(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.body = gluon.nn.HybridSequential()
            self.body.add(gluon.nn.Dense(32), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
                          gluon.nn.Dense(16), gluon.nn.Activation("tanh"))

    def hybrid_forward(self, F, z):
        return self.body(z)


class Discriminator(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.body = gluon.nn.HybridSequential()
            for _ in range(3):
                self.body.add(gluon.nn.Dense(32), gluon.nn.BatchNorm(), gluon.nn.LeakyReLU(0.2))
            self.body.add(gluon.nn.Dense(1))

    def hybrid_forward(self, F, x):
        return self.body(x)


def dcgan(policy=None, steps=20, batch=8):
    """Gluon's DCGAN loop, unchanged: the discriminator on real and on detached fake data
    in one record(), then the generator through the discriminator (D's input gradient
    flows into G). Under enabled(policy) both blocks are planned."""
    mx.random.seed(0)
    net_g, net_d = Generator(), Discriminator()
    for net in (net_g, net_d):
        net.initialize(mx.init.Normal(0.1))
        net.hybridize()
    loss_fn = gluon.loss.SigmoidBinaryCrossEntropyLoss()
    opt = {"learning_rate": 0.01, "beta1": 0.5}
    trainer_g = gluon.Trainer(net_g.collect_params(), "adam", opt)
    trainer_d = gluon.Trainer(net_d.collect_params(), "adam", opt)
    rs = np.random.RandomState(0)
    real_label, fake_label = mx.nd.ones((batch,)), mx.nd.zeros((batch,))
    losses = []
    scope = mxmirror.enabled(policy) if policy else _nothing()
    with scope:
        for _ in range(steps):
            real = mx.nd.array(rs.rand(batch, 16) * 2 - 1)
            noise = mx.nd.array(rs.randn(batch, 8))
            with autograd.record():
                err_real = loss_fn(net_d(real).reshape((-1,)), real_label)
                fake = net_g(noise)
                err_fake = loss_fn(net_d(fake.detach()).reshape((-1,)), fake_label)
                err_d = err_real + err_fake
            err_d.backward()
            trainer_d.step(batch)
            with autograd.record():
                err_g = loss_fn(net_d(fake).reshape((-1,)), real_label)
            err_g.backward()
            trainer_g.step(batch)
            losses.append((err_d.mean().asscalar(), err_g.mean().asscalar()))
    if policy:  # the discriminator's plans recompute
        bounds = mxmirror.gluon.hook._planned[net_d]._bound.values()
        assert len(bounds) == 3 and all(b.plan.mirrored for b in bounds)
    values = {f"{i}.{k}": p.data().asnumpy()
              for i, net in enumerate((net_g, net_d))
              for k, p in enumerate(net.collect_params().values())}
    return np.array(losses), values


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def check_dcgan_loop_like_plain():
    plain_losses, plain_values = dcgan()
    losses, values = dcgan("sqrt")
    np.testing.assert_array_equal(losses, plain_losses)
    assert_same(values, plain_values)


def check_adam_tight_loop_like_plain():
    """One call per record(), Adam, inputs drawn by MXNet, nothing read between backward(),
    step() and the next forward: ops that take an engine resource (Adam's update, the
    draw) queued before the planned backward's deadlocked MXNet's engine before
    backward() waited for the backward callbacks (measured: stuck in the first steps)."""
    def run(policy):
        CTXS[:] = [mx.cpu(0)]
        net = _hybridized(dense_bn)
        model = net if policy is None else PlannedBlock(net, policy)
        trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01})
        mx.random.seed(1)
        losses = []
        for _ in range(20):
            x = mx.nd.random.uniform(shape=(8, 10))
            with autograd.record():
                loss = (model(x) ** 2).mean()
            loss.backward()
            trainer.step(8)
            losses.append(loss)
        values = {f"value.{k}": p.data() for k, p in enumerate(net.collect_params().values())}
        return {k: v.asnumpy() for k, v in [*enumerate(losses), *values.items()]}

    assert_same(run("sqrt"), run(None))


def _child(code: str, timeout: int = 600) -> None:
    """`code` in a child process (tests' helpers importable): a hang fails, not stalls."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(ROOT)],
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_dcgan_loop_and_adam_like_plain():
    _child("""
        import sys
        sys.path.insert(0, sys.argv[1])
        from tests import test_gluon_calls as t
        t.check_dcgan_loop_like_plain()
        t.check_adam_tight_loop_like_plain()
        print("ok")
    """)


MIXED = """
import sys
sys.path.insert(0, sys.argv[1])
import mxnet as mx
from mxnet import autograd
from mxmirror.errors import PlanError
from mxmirror.gluon import PlannedBlock
from tests import test_gluon_calls as t
net = t._hybridized(t.dense_bn)
planned = PlannedBlock(net, "sqrt")
x = mx.nd.ones((8, 10))
for first, second in ((planned, net), (net, planned)):
    with autograd.record():
        out = first(x)
        try:
            second(x)
        except PlanError as e:
            print("refused:", e)
        loss = (out * out).mean()
    loss.backward()
    mx.nd.waitall()
with autograd.record():  # planned twice, then the block itself once backward() has run
    loss = planned(x).mean() + planned(x + 1).mean()
loss.backward()
with autograd.record():
    net(x).mean().backward()
with autograd.record():
    planned(x).mean().backward()
mx.nd.waitall()
print("ok")
"""


def test_block_itself_beside_a_planned_call_is_refused_never_a_hang():
    done = subprocess.run([sys.executable, "-c", MIXED, str(ROOT)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
    refused = [line for line in done.stdout.splitlines() if line.startswith("refused: ")]
    assert len(refused) == 2 and all("statistics" in line for line in refused), done.stdout


def test_mkldnn_off_bit_identical():
    """MKL-DNN is read at process start: the comparisons above in a child with it off."""
    mkldnn_off.run_pytest(__file__, "not mkldnn_off and not hang", passed=5)


UNPLANNED_BEFORE = """
import sys
sys.path.insert(0, sys.argv[1])
import mxnet as mx
import numpy as np
from mxnet import autograd
import mxmirror
from mxmirror.errors import PlanError
from mxmirror.gluon import PlannedBlock
from tests import test_gluon_calls as t

def run(policy):
    mx.random.seed(0)
    net_g, net_d = t.Generator(), t.Discriminator()
    net_g.initialize()
    net_d.initialize()
    net_d.hybridize()  # net_g stays unhybridized: trained unplanned, and so is net_d after it
    losses = []
    with mxmirror.enabled(policy) if policy else t._nothing():
        for step in range(3):
            with autograd.record():
                loss = net_d(net_g(mx.nd.ones((8, 8)) * step)).mean()
            loss.backward()
            losses.append(loss.asnumpy())
    return np.array(losses)

np.testing.assert_array_equal(run("sqrt"), run(None))

# a PlannedBlock used directly refuses such an input (it cannot train it unplanned)
net_g, net_d = t.Generator(), t.Discriminator()
net_g.initialize()
net_d.initialize()
net_d.hybridize()
planned = PlannedBlock(net_d, "sqrt")
with autograd.record():
    try:
        planned(net_g(mx.nd.ones((8, 8))))
    except PlanError as e:
        print("refused:", e)
with autograd.record():  # its outputs need no gradient once detached: trained planned
    loss = planned(net_g(mx.nd.ones((8, 8))).detach()).mean()
loss.backward()
mx.nd.waitall()
print("ok")
"""


def test_unplanned_block_before_a_planned_one_never_hangs():
    """Under enabled(), a hybridized block whose input comes from unplanned operators
    that need its gradient (an unhybridized generator's Dense) is trained unplanned, said
    once: planned, the generator's backward deadlocked MXNet's engine (measured). A
    PlannedBlock used directly refuses that input with a PlanError."""
    done = subprocess.run([sys.executable, "-c", UNPLANNED_BEFORE, str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
    assert "discriminator0 trained unplanned: input 0 is computed by unplanned" in done.stderr
    assert "refused: input 0 is computed by unplanned operators" in done.stdout
