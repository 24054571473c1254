"""Several calls of one planned block in one record() (a GAN's discriminator on real and
fake data, a siamese pair) train exactly as plain hybridized Gluon: every Parameter
gradient (summed over the calls), parameter, BatchNorm statistic, output, loss and input
gradient, bit for bit, whichever inputs need a gradient; and so does the block itself
called beside its planned calls, and a generator's output read by two planned calls and
by the loss.

A planned call's backward runs from backward() on the caller's thread, in the order
plain Gluon's autograd runs the calls' backwards (mxmirror/gluon/order.py): BatchNorm
updates its running statistics in backward, so that order is what makes them equal.
Scenarios that hung MXNet's engine under the earlier design run in child processes with
timeouts, so that a hang fails a test instead of stalling the suite.
"""

from __future__ import annotations

import contextlib
import itertools
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
from tests.helpers import assert_planned, bound_regardless, read_step, read_values
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


def calls(make, policy=None, *args, **kw):
    """Every array a user can read after `steps` Trainer steps whose record() calls the
    block `n` times on different batches: gradients, parameters with BatchNorm
    statistics, outputs, losses (and the gradients of the inputs `input_grad` asks for:
    True, or one flag per call); parameters by position, or by name for blocks that list
    them in another order. The output of call `unused` (an index) is left out of the
    loss. Plans are bound whatever they save beside their executors' own structures (the
    graphs are small): this compares what they compute."""
    with bound_regardless():
        return _calls(make, policy, *args, **kw)


def _calls(make, policy=None, n=2, steps=3, input_grad=False, shape=(128, 10), by_name=False,
           optimizer="sgd", unused=None):
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
    wants = tuple(input_grad) if isinstance(input_grad, tuple) else (input_grad,) * n
    for step in range(steps):
        xs = [mx.nd.array(rs.rand(*shape)) for _ in range(n)]
        for x, wanted in zip(xs, wants):
            if wanted:
                x.attach_grad()
        with autograd.record():
            outs = [model(x) for x in xs]
            loss = sum(((o - k) ** 2).mean() for k, o in enumerate(outs) if k != unused)
        loss.backward()
        seen[f"loss{step}"] = loss
        for i, (x, o) in enumerate(zip(xs, outs)):
            seen[f"out{step}.{i}"] = o
            if wants[i]:
                seen[f"dx{step}.{i}"] = x.grad.asnumpy()
        for k, p in zip(keys, params):
            if p.grad_req != "null":
                seen[f"grad{step}.{k}"] = p.grad().asnumpy()
        trainer.step(shape[0])
    for k, p in zip(keys, params):
        seen[f"value.{k}"] = p.data()
    if policy is not None:  # every call ran on a planned executor
        assert model.decisions and all(used for _, used in model.decisions)
    return {k: v.asnumpy() if isinstance(v, mx.nd.NDArray) else v for k, v in seen.items()}


def test_two_and_three_calls_like_plain():
    planned = PlannedBlock(_hybridized(dense_bn), "sqrt")
    with autograd.record(), bound_regardless():
        (planned(mx.nd.zeros((128, 10))) + planned(mx.nd.ones((128, 10)))).mean().backward()
    assert len(planned.executors) == 1  # shared: the second call runs its forward again
    assert all(ex.plan.mirrored for ex in planned.executors)
    for n in (2, 3):
        plain = calls(dense_bn, n=n)
        for policy in ("none", "sqrt"):
            assert_same(calls(dense_bn, policy, n=n), plain)


def test_input_gradients_of_every_call():
    """Every combination of calls whose input needs a gradient, 2 and 3 calls: every array
    equals plain Gluon's, BatchNorm's running statistics included (plain Gluon updates
    them first call first when the first call's input needs a gradient, else last call
    first: the replay of its order follows both)."""
    for n in (2, 3):
        for wants in itertools.product((False, True), repeat=n):
            assert_same(calls(dense_bn, "sqrt", n=n, input_grad=wants),
                        calls(dense_bn, n=n, input_grad=wants))


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
    with autograd.record(), bound_regardless():
        (planned(mx.nd.zeros(shape)) + planned(mx.nd.ones(shape))).mean().backward()
    assert len(planned.executors) == 2
    assert all(isinstance(ex.exec, SegmentedExecutor) for ex in planned.executors)
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
            for _ in range(4):  # deep enough for sqrt to recompute
                self.body.add(gluon.nn.Dense(32), gluon.nn.BatchNorm(),
                              gluon.nn.Activation("relu"))
            self.body.add(gluon.nn.Dense(16), gluon.nn.Activation("tanh"))

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
    flows into G). Under enabled(policy) the generator is planned from its second
    record() (a second call beside it would not pay); the discriminator from its first,
    both its calls in a record() (the second shares the first's executor, running its
    forward again in backward: it holds less than plain Gluon's call), and in the
    generator's record() once G is planned: two executors (the fake input's gradient is
    another signature)."""
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
    scope = mxmirror.enabled(policy) if policy else contextlib.nullcontext()
    with scope, bound_regardless():  # small networks: their plans' nodes are not weighed
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
    if policy:  # both planned, their plans recompute
        d, g = (mxmirror.gluon.hook.planned_for(n).executors for n in (net_d, net_g))
        assert len(d) == 2 and len(g) == 1
        assert all(ex.plan.mirrored for ex in d + g)
    values = {f"{i}.{k}": p.data().asnumpy()
              for i, net in enumerate((net_g, net_d))
              for k, p in enumerate(net.collect_params().values())}
    return np.array(losses), values


def check_dcgan_loop_like_plain():
    plain_losses, plain_values = dcgan()
    losses, values = dcgan("sqrt")
    np.testing.assert_array_equal(losses, plain_losses)
    assert_same(values, plain_values)


def two_readers(policy=None, steps=3, batch=8):
    """A generator's output read by two planned calls and by the loss in one record() (the
    CycleGAN and pix2pix pattern: D(fake), F(fake), an L1 term): autograd would sum its
    gradient of three terms; the earlier design refused it (MXNet 1.9.1's engine
    deadlocked). Under enabled(policy) the three blocks are planned."""
    mx.random.seed(0)
    nets = [Generator(), Discriminator(), Discriminator()]
    for net in nets:
        net.initialize(mx.init.Normal(0.1))
        net.hybridize()
    net_g, net_d, net_f = nets
    params = gluon.ParameterDict()
    for net in nets:
        params.update(net.collect_params())
    trainer = gluon.Trainer(params, "adam", {"learning_rate": 0.01})
    rs = np.random.RandomState(0)
    seen = {}
    with mxmirror.enabled(policy) if policy else contextlib.nullcontext(), bound_regardless():
        for step in range(steps):
            noise, target = mx.nd.array(rs.randn(batch, 8)), mx.nd.array(rs.rand(batch, 16))
            with autograd.record():
                fake = net_g(noise)
                loss = (net_d(fake) ** 2).mean() + (net_f(fake) - 1).abs().mean() + \
                    (fake - target).abs().mean()
            loss.backward()
            read_step(seen, step, params.values(), loss=loss)
            trainer.step(batch)
    if policy:
        assert all(len(mxmirror.gluon.hook.planned_for(n).executors) == 1 for n in nets)
    return read_values(seen, params.values())


def check_two_readers_like_plain():
    assert_same(two_readers("sqrt"), two_readers())


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
        with bound_regardless():
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


def test_dcgan_two_readers_and_adam_like_plain():
    _child("""
        import sys
        sys.path.insert(0, sys.argv[1])
        from tests import test_gluon_calls as t
        t.check_dcgan_loop_like_plain()
        t.check_two_readers_like_plain()
        t.check_adam_tight_loop_like_plain()
        print("ok")
    """)


def beside(first: str, steps: int = 3) -> dict:
    """The block itself and a planned call of it in one record(), in either order (the
    earlier design refused it: their BatchNorm statistics updated in no fixed order)."""
    CTXS[:] = [mx.cpu(0)]
    net = dense_bn()
    net.hybridize()
    planned = PlannedBlock(net, "sqrt")
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    rs = np.random.RandomState(0)
    seen = {}
    for step in range(steps):
        a, b = mx.nd.array(rs.rand(8, 10)), mx.nd.array(rs.rand(8, 10))
        with autograd.record(), bound_regardless():  # the network is small
            if first == "planned":
                loss = planned(a).mean() + net(b).mean()
            elif first == "block":
                loss = net(a).mean() + planned(b).mean()
            else:
                loss = net(a).mean() + net(b).mean()
        loss.backward()
        read_step(seen, step, net.collect_params().values(), loss=loss)
        trainer.step(8)
    if first == "planned":  # its calls ran planned (the block itself first: none does)
        assert_planned(planned)
    return read_values(seen, net.collect_params().values())


def test_block_itself_beside_a_planned_call_like_plain():
    """Planned call first: the block's own call after it is a CachedOp on the tape, whose
    backward autograd runs first, as plain Gluon runs the later call first. The block
    itself first: the planned call that follows runs the block itself too (until the next
    backward()), so that autograd orders both. Bitwise either way, statistics included."""
    plain = beside("plain")
    for first in ("planned", "block"):
        assert_same(beside(first), plain)


def test_mkldnn_off_bit_identical():
    """MKL-DNN is read at process start: the comparisons above in a child with it off."""
    mkldnn_off.run_pytest(__file__, "not mkldnn_off and not hang", passed=6)


UNPLANNED_BEFORE = """
import contextlib
import sys
sys.path.insert(0, sys.argv[1])
import mxnet as mx
import numpy as np
from mxnet import autograd
import mxmirror
from mxmirror.errors import PlanError
from mxmirror.gluon import PlannedBlock
from tests import test_gluon_calls as t
from tests.helpers import assert_planned, bound_regardless

def run(policy):
    mx.random.seed(0)
    net_g, net_d = t.Generator(), t.Discriminator()
    net_g.initialize()
    net_d.initialize()
    net_d.hybridize()  # net_g stays unhybridized: trained unplanned, and so is net_d after it
    losses = []
    with mxmirror.enabled(policy) if policy else contextlib.nullcontext():
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
with autograd.record(), bound_regardless():  # its outputs need no gradient once detached:
    loss = planned(net_g(mx.nd.ones((8, 8))).detach()).mean()  # trained planned
loss.backward()
assert_planned(planned)
mx.nd.waitall()
print("ok")
"""


def test_unplanned_block_before_a_planned_one_never_hangs():
    """Under enabled(), a hybridized block whose input comes from unplanned operators
    that need its gradient from variables mxmirror does not hold (an unhybridized
    generator's Dense weights) is trained unplanned, said once: autograd's pass and the
    pass over the input's history could both write such a variable when the input has
    another use. A PlannedBlock used directly refuses that input with a PlanError."""
    done = subprocess.run([sys.executable, "-c", UNPLANNED_BEFORE, str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
    assert "discriminator0 trained unplanned: input 0 is computed by operators" in done.stderr
    assert "refused: input 0 is computed by operators trained unplanned" in done.stdout
