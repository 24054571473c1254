"""Gluon patterns of ordinary training scripts, met by trying the product as a user:
export after planned training, a validation pass inside record(train_mode=False),
autograd.grad through a planned call (an FGSM step: the input's gradient; and a
Parameter's), and backward(retain_graph=True) then a second backward. The earlier design
refused the last two (autograd.grad stalled MXNet's engine, a second backward of a
retained graph trained wrong values); both now equal plain Gluon. Each scenario that
could hang runs in a child process with a timeout (tests.test_gluon_calls._child).
"""

from __future__ import annotations

import contextlib

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import mxmirror.gluon.calls as calls
from mxmirror.errors import PlanError
from mxmirror.gluon import PlannedBlock
from tests import mkldnn_off
from tests.helpers import assert_planned, bound_regardless, read_step, read_values
from tests.test_gluon_calls import _child, dense_bn

# the graphs are small: plans are bound whatever they save, to compare what they compute
# (in this process; the children's code asks for it itself)
pytestmark = pytest.mark.usefixtures("plans_bound_regardless")

CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
from tests import test_gluon_patterns as t
from tests.helpers import bound_regardless

with bound_regardless():  # the graphs are small: plans bound whatever they save
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


def grads_asked(policy: str | None) -> dict:
    """autograd.grad of a loss with respect to the input, then to a weight, in two
    record()s, then one training step: what it returns, and every gradient array it must
    leave as it was (autograd.grad writes none)."""
    net = dense_bn()
    net.hybridize()
    model = net if policy is None else PlannedBlock(net, policy)
    rs = np.random.RandomState(0)
    x = mx.nd.array(rs.rand(8, 10))
    x.attach_grad()
    seen = {}
    net(x)  # finish the Parameters' shapes
    for k, variable in enumerate((x, net[0].weight.data())):
        with autograd.record():
            loss = (model(x) ** 2).sum()
        (seen[f"asked{k}"],) = autograd.grad(loss, [variable])
        seen[f"x.grad{k}"] = x.grad.asnumpy()
        for j, p in enumerate(net.collect_params().values()):
            if p.grad_req != "null":
                seen[f"grad{k}.{j}"] = p.grad().asnumpy()
    _step(model, x, mx.nd.array(rs.rand(8, 1)))  # then trains on
    assert_planned(model)
    for j, p in enumerate(net.collect_params().values()):
        seen[f"value.{j}"] = p.data().asnumpy()
        if p.grad_req != "null":
            seen[f"trained{j}"] = p.grad().asnumpy()
    return {k: v.asnumpy() if isinstance(v, mx.nd.NDArray) else v for k, v in seen.items()}


def check_grad_like_plain() -> None:
    from tests.test_gluon import assert_same

    assert_same(grads_asked("sqrt"), grads_asked(None))


def retained(policy: str | None, grad_req: str = "add") -> dict:
    """backward(retain_graph=True), then a second backward of the same graph through
    another head (grad_req 'add' sums both, 'write' keeps the second's): plain Gluon runs
    the backward twice on the kept forward; a planned call runs its forward again first."""
    net = dense_bn()
    net.hybridize()
    net.collect_params().setattr("grad_req", grad_req)
    model = net if policy is None else PlannedBlock(net, policy)
    rs = np.random.RandomState(0)
    seen = {}
    for step in range(2):
        x = mx.nd.array(rs.rand(8, 10))
        with autograd.record():
            loss = (model(x) ** 2).sum()
            again = loss * 2
        loss.backward(retain_graph=True)
        autograd.backward([again])  # the same graph, through another head
        assert_planned(model)
        for j, p in enumerate(net.collect_params().values()):
            seen[f"grad{step}.{j}"] = p.grad().asnumpy() if p.grad_req != "null" else None
            seen[f"value{step}.{j}"] = p.data().asnumpy()
    return {k: v for k, v in seen.items() if v is not None}


def check_retain_graph_like_plain() -> None:
    from tests.test_gluon import assert_same

    for grad_req in ("add", "write"):
        assert_same(retained("sqrt", grad_req), retained(None, grad_req))


def test_autograd_grad_like_plain():
    _child(CHILD.format(name="check_grad_like_plain"), timeout=300)


def test_retain_graph_like_plain():
    _child(CHILD.format(name="check_retain_graph_like_plain"), timeout=300)


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
    assert_planned(planned)
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
        assert_planned(model)
        outs += [p.data().asnumpy() for p in net.collect_params().values()]
        results.append(outs)
    for plain, planned in zip(*results):
        assert np.array_equal(plain, planned)


def test_predict_mode_records_with_backward_let_the_executors_go():
    """record(train_mode=False) with a backward (fine-tuning with frozen statistics),
    alternating with training records: the predict-mode call runs the block itself, its
    planned executors let go meanwhile and bound again at the next training call (they
    stayed bound beside the CachedOp's arrays: a user's script peaked at 383-384 MB
    against plain's 304-313 MB), and every loss, gradient and Parameter equals plain
    Gluon's, with a PlannedBlock and under the hook."""
    import mxmirror
    from mxmirror.gluon.hook import planned_for
    from tests.test_gluon import assert_same

    def run(policy, hooked=False):
        mx.random.seed(0)
        net = dense_bn()
        net.hybridize()
        model = net if policy is None or hooked else PlannedBlock(net, policy)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
        rs = np.random.RandomState(0)
        seen, bound = {}, []
        with mxmirror.enabled(policy) if hooked else contextlib.nullcontext(), \
                bound_regardless():
            for step in range(4):
                x, y = mx.nd.array(rs.rand(64, 10)), mx.nd.array(rs.rand(64, 1))
                with autograd.record(train_mode=step % 2 == 0):
                    loss = ((model(x) - y) ** 2).mean()
                planned = planned_for(net) if hooked else model
                bound.append(None if planned in (None, net) else len(planned.executors))
                loss.backward()
                trainer.step(64)
                read_step(seen, step, net.collect_params().values(), loss=loss)
        return read_values(seen, net.collect_params().values()), bound

    plain, _ = run(None)
    for hooked in (False, True):
        planned, bound = run("sqrt", hooked)
        assert bound == [1, 0, 1, 0], (hooked, bound)
        assert_same(planned, plain)


def test_without_mkldnn():
    """The same with MKL-DNN off (read at process start: a child)."""
    if not mkldnn_off.MKLDNN:
        pytest.skip("this process already runs without MKL-DNN")
    mkldnn_off.run_pytest(__file__, "not without_mkldnn", passed=17)


class Repeats(gluon.HybridBlock):
    """Outputs as user blocks give them: one array twice, beside a feature list holding the
    output again, and the input given back."""

    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.body = dense_bn()

    def hybrid_forward(self, F, x):
        h = self.body(x)
        return h, [h * 2, h], x


def repeats(policy: str | None) -> dict:
    mx.random.seed(0)
    net = Repeats()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    model = net if policy is None else PlannedBlock(net, policy)
    rs = np.random.RandomState(0)
    x = mx.nd.array(rs.rand(8, 10))
    x.attach_grad()
    seen = {}
    for step in range(2):
        with autograd.record():
            a, (b, c), same = model(x)
            loss = a.sum() + 2 * b.sum() + 3 * c.sum() + (same ** 2).sum()
        loss.backward()
        read_step(seen, step, net.collect_params().values(), dx=x.grad)
    assert_planned(model)
    return seen


def test_an_output_given_twice_like_plain():
    """MXNet's executor keeps one head gradient per array, so an output given twice lost
    one of its gradients (a list of features holding the output again: all of them);
    copied as the CachedOp copies them, every gradient equals plain Gluon's."""
    from tests.test_gluon import assert_same

    assert_same(repeats("none"), repeats(None))
    assert_same(repeats("sqrt"), repeats(None))


class TwoInputs(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.a, self.b = gluon.nn.Dense(6, in_units=10), gluon.nn.Dense(6, in_units=10)

    def hybrid_forward(self, F, x, y):
        return self.a(x) * self.b(y)


def one_array_twice(policy: str | None) -> dict:
    """net(u, u) for an input that needs its gradient and for another planned call's
    output."""
    mx.random.seed(0)
    up, net = gluon.nn.Dense(10, in_units=10), TwoInputs()
    for block in (up, net):
        block.initialize(mx.init.Xavier())
        block.hybridize()
    run_up, run = (up, net) if policy is None else (PlannedBlock(up, "none"),  # a call
                                                    PlannedBlock(net, policy))  # always
    rs = np.random.RandomState(0)
    u = mx.nd.array(rs.rand(8, 10))
    u.attach_grad()
    seen = {}
    with autograd.record():
        loss = (run(u, u) ** 2).sum()
    loss.backward()
    seen["du"] = u.grad.asnumpy()
    with autograd.record():
        h = run_up(u)
        loss = (run(h, h) ** 2).sum()
    loss.backward()
    for j, p in enumerate(list(up.collect_params().values()) +
                          list(net.collect_params().values())):
        seen[f"grad{j}"] = p.grad().asnumpy()
    if policy == "none":  # bound: sqrt finds nothing to recompute in so small a graph
        assert_planned(run_up, run)
    return seen


def test_one_array_as_two_inputs_like_plain():
    """The same array as two inputs of a call (self-attention's pattern) gets both inputs'
    gradients (the second was kept alone), as plain Gluon's autograd adds them."""
    from tests.test_gluon import assert_same

    assert_same(one_array_twice("none"), one_array_twice(None))
    assert_same(one_array_twice("sqrt"), one_array_twice(None))


def skipped_updates(policy: str | None) -> tuple[dict, list]:
    """A loss-spike guard's loop: two of every three record()s get no backward(). What
    training leaves, and the planned calls still pending after each step."""
    net = dense_bn()
    net.hybridize()
    model = net if policy is None else PlannedBlock(net, policy)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    rs = np.random.RandomState(0)
    pending = []
    for step in range(9):
        x, y = mx.nd.array(rs.rand(8, 10)), mx.nd.array(rs.rand(8, 1))
        with autograd.record():
            loss = ((model(x) - y) ** 2).mean()
        if step % 3 == 0:
            loss.backward()
            trainer.step(8)
        del loss
        pending.append(len(calls.pending()))
    assert_planned(model)
    return {f"value{j}": p.data().asnumpy()
            for j, p in enumerate(net.collect_params().values())}, pending


def test_record_without_backward_is_let_go():
    """The calls of a record() never followed by backward() are let go once a backward()
    has passed them by and nothing holds their outputs (they were kept for ever: the
    process grew with every skipped batch); training equals plain Gluon's."""
    from tests.test_gluon import assert_same

    planned, pending = skipped_updates("sqrt")
    assert max(pending) <= 3 and pending[-1] == 2, pending  # the two since the backward
    assert_same(planned, skipped_updates(None)[0])


def test_backward_reaching_a_call_let_go_is_refused():
    """A record()'s loss kept and backwarded after a later record()'s backward and another
    call: that call was let go as abandoned (nothing held its outputs), so its backward is
    refused rather than run without its gradients. Without the call between, it runs."""
    net = dense_bn()
    net.hybridize()
    planned = PlannedBlock(net, "none")
    x = mx.nd.ones((8, 10))
    for call_between in (False, True):
        with autograd.record():
            first = planned(x).sum()
        with autograd.record():
            second = planned(x * 2).sum()
        second.backward()
        if call_between:
            with autograd.record():
                planned(x * 3)
            with pytest.raises(PlanError, match="let go since"):
                first.backward()
        else:
            first.backward()


def static_alloc_statistics(policy: str | None, ctxs: list) -> dict:
    """Two steps of a convolutional BatchNorm block hybridized with static_alloc on
    `ctxs`: every Parameter and statistic on every context, and (planned) the executors
    bound."""
    mx.random.seed(7)
    net = gluon.nn.HybridSequential()
    for _ in range(3):  # shapes inferred at the first call, as users leave them
        net.add(gluon.nn.Conv2D(16, 3, padding=1), gluon.nn.BatchNorm(),
                gluon.nn.Activation("relu"))
    net.add(gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    net.hybridize(static_alloc=True, static_shape=True)
    model = net if policy is None else PlannedBlock(net, policy)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rs = np.random.RandomState(7)
    for _ in range(2):
        xs = gluon.utils.split_and_load(mx.nd.array(rs.uniform(size=(32, 3, 24, 24))), ctxs)
        ys = gluon.utils.split_and_load(mx.nd.array(rs.randint(0, 10, 32)), ctxs)
        with autograd.record():
            losses = [loss_fn(model(x), y) for x, y in zip(xs, ys)]
        autograd.backward(losses)
        trainer.step(32)
    seen = {f"{k}@{c}" + ("/statistic" if "running" in p.name else ""): p.data(c).asnumpy()
            for k, p in enumerate(net.collect_params().values()) for c in ctxs}
    if policy is not None:
        seen["executors"] = np.array(len(model.executors))
    return seen


def check_static_alloc_like_plain() -> None:
    from tests.test_gluon import assert_same

    for ctxs in ([mx.cpu(0)], [mx.cpu(0), mx.cpu(1)]):
        planned = static_alloc_statistics("sqrt", ctxs)
        assert planned.pop("executors") == 0
        plain = static_alloc_statistics(None, ctxs)
        if len(ctxs) > 1:  # plain Gluon's own statistics vary there (the test's doc)
            planned, plain = ({k: v for k, v in d.items() if not k.endswith("/statistic")}
                              for d in (planned, plain))
        assert_same(planned, plain)


def test_static_alloc_with_statistics_trains_unplanned():
    """MXNet's CachedOp with static_alloc updates BatchNorm statistics otherwise than an
    executor on two contexts: such a block trains itself, and every Parameter equals plain
    Gluon's, every statistic too on one context. On two, plain Gluon's own statistics vary
    from run to run of the same two steps in one process (measured: the first BatchNorm's
    running mean after one update in some runs, two in others), so only the Parameters are
    compared there (before, the statistics were too, and the test failed in most runs)."""
    _child(CHILD.format(name="check_static_alloc_like_plain"), timeout=300)


def test_executors_go_when_hybridized_again_with_static_alloc():
    """Trained planned, then hybridized with static_alloc (for deployment) and trained on:
    the block trains unplanned from then (above), and the executors bound before are let
    go at that call (they stayed bound: a user's script peaked at 337 MB against plain's
    304, 287 MB now); every array equals plain Gluon's."""
    from tests.test_gluon import assert_same

    def run(policy):
        net = dense_bn()
        net.hybridize()
        model = net if policy is None else PlannedBlock(net, policy)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
        rs = np.random.RandomState(0)
        seen, bound = {}, []
        with bound_regardless():
            for step in range(4):
                if step == 2:
                    net.hybridize(static_alloc=True, static_shape=True)
                x, y = mx.nd.array(rs.rand(64, 10)), mx.nd.array(rs.rand(64, 1))
                read_step(seen, step, net.collect_params().values(),
                          loss=_step(model, x, y, trainer))
                bound.append(len(getattr(model, "executors", [])))
        return read_values(seen, net.collect_params().values()), bound

    planned, bound = run("sqrt")
    assert bound == [1, 1, 0, 0], bound
    assert_same(planned, run(None)[0])


def test_hybridize_again_after_a_planned_call_says_nothing():
    """A script that calls hybridize() again (each epoch, or to change its flags) after a
    planned call: no warning (mxmirror watched the block through a forward pre-hook, and
    MXNet warned at every hybridize() of a block with hooks), and a call of the block
    itself beside a planned one is still seen (test_gluon_calls: beside)."""
    import warnings

    net = dense_bn()
    net.hybridize()
    planned = PlannedBlock(net, "none")
    for _ in range(2):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            net.hybridize()
        assert not seen, [str(w.message) for w in seen]
        _step(planned, mx.nd.ones((8, 10)), mx.nd.ones((8, 1)))
    assert_planned(planned)


def test_a_call_that_fails_its_shape_inference_prints_it_once():
    """Under the hook, a block whose own first call fails (an input of the wrong width):
    MXNet's printed shape-inference arguments appear once (mxmirror's own inference printed
    them too), its error ends the script as plainly, and mxmirror says nothing."""
    import subprocess
    import sys
    import textwrap

    from tests.helpers import child_env
    from tests.mkldnn_off import ROOT

    code = textwrap.dedent("""
        import mxnet as mx
        from mxnet import autograd, gluon
        import mxmirror
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(10, in_units=5), gluon.nn.Dense(3))
        net.initialize()
        net.hybridize()
        with mxmirror.enabled("sqrt"), autograd.record():
            net(mx.nd.ones((4, 7)))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=child_env(), timeout=300)
    assert proc.returncode != 0 and "Shape inconsistent" in proc.stderr
    assert proc.stdout.count("infer_shape error") == 1, proc.stdout
    assert "mxmirror:" not in proc.stderr, proc.stderr


class HeadFirst(gluon.HybridBlock):
    """Layers registered in another order than the graph reads them, shapes deferred."""

    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.head = gluon.nn.Dense(10)  # registered first, used last
            self.body = gluon.nn.HybridSequential()
            for _ in range(3):
                self.body.add(gluon.nn.Dense(512), gluon.nn.BatchNorm(),
                              gluon.nn.Activation("relu"))

    def hybrid_forward(self, F, x):
        return self.head(self.body(x))


def deferred_first_call(how: str) -> dict:
    """One step of HeadFirst, its shapes inferred at the first call (plain, PlannedBlock or
    the hook): the gradients, the values, and the next random draw."""
    import mxmirror

    mx.random.seed(0)
    net = HeadFirst()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    model = PlannedBlock(net, "sqrt") if how == "planned" else net
    with mxmirror.enabled("sqrt") if how == "hook" else contextlib.nullcontext(), \
            bound_regardless(), autograd.record():
        out = model(mx.nd.ones((256, 32)))
    out.backward()
    if how == "planned":
        assert_planned(model)
    seen = {"draw": mx.nd.random.uniform(shape=(4,)).asnumpy()}
    read_step(seen, 0, net.collect_params().values())
    for k, p in enumerate(net.collect_params().values()):
        seen[f"value.{k}"] = p.data().asnumpy()
    return seen


def test_deferred_shapes_draw_the_initial_values_plain_gluon_draws():
    """Parameters whose shapes the first call infers are initialized in the order of the
    graph's inputs, as the block's own first call does: before, in the order they were
    registered, so the layers drew other initial values than plain Gluon's (every loss
    differed from the first step)."""
    from tests.test_gluon import assert_same

    plain = deferred_first_call("plain")
    for how in ("planned", "hook"):
        assert_same(deferred_first_call(how), plain)


def test_a_failing_deferred_initialization_raises_the_blocks_own_error():
    """An initializer that cannot initialize a Parameter (Xavier on a bias vector) fails at
    the block's first call: the hook and a PlannedBlock raise the same error as plain
    Gluon (the hook raised a misleading 'has not been initialized' from the block's own
    call after its own attempt had left the Parameter half initialized)."""
    import mxmirror

    def first_call(how: str) -> str:
        d = mx.sym.var("data")
        out = mx.sym.FullyConnected(mx.sym.FullyConnected(d, num_hidden=8), num_hidden=2)
        net = gluon.nn.SymbolBlock(out, d)
        net.initialize(mx.init.Xavier())
        net.hybridize()
        model = PlannedBlock(net, "sqrt") if how == "planned" else net
        with mxmirror.enabled("sqrt") if how == "hook" else contextlib.nullcontext(), \
                autograd.record():
            with pytest.raises(Exception) as raised:
                model(mx.nd.ones((4, 3)))
        return f"{type(raised.value).__name__}: {raised.value}"

    plain = first_call("plain")
    assert plain.startswith("ValueError: Xavier initializer cannot be applied to vector")
    assert first_call("hook").split(" vector")[0] == first_call("planned").split(" vector")[0] \
        == plain.split(" vector")[0]


def test_executors_go_when_the_hook_stops_planning_the_block():
    """Planned for two steps, then trained with the hook off (or under another policy):
    the plan's executors are let go at its first call trained otherwise, and their memory
    given back (they stayed bound: peak RSS 362 MB against plain's 302, measured), and
    training equals plain Gluon's throughout."""
    import mxmirror
    from mxmirror.gluon.hook import planned_for

    def run(policies):
        mx.random.seed(0)
        net = dense_bn()
        net.hybridize()
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
        rs = np.random.RandomState(0)
        seen, bound = {}, []
        for step, policy in enumerate(policies):
            x, y = mx.nd.array(rs.rand(64, 10)), mx.nd.array(rs.rand(64, 1))
            with mxmirror.enabled(policy) if policy else contextlib.nullcontext(), \
                    bound_regardless():
                planned = planned_for(net)
                read_step(seen, step, net.collect_params().values(),
                          loss=_step(net, x, y, trainer))
            bound.append(len(planned.executors) if planned is not None else None)
        return read_values(seen, net.collect_params().values()), bound

    from tests.test_gluon import assert_same

    plain, _ = run([None] * 4)
    gap, bound = run(["sqrt", "sqrt", None, None])
    assert bound == [None, 1, 0, None], bound  # the executors of the plan made at step 0
    assert_same(gap, plain)
    switch, bound = run(["sqrt", "sqrt", "search", "search"])
    assert bound == [None, 1, 0, 1], bound  # sqrt's, then search's
    assert_same(switch, plain)


class IntIds(gluon.HybridBlock):
    """int32 token ids and their positions (an integer value inside the graph)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.emb = gluon.nn.Embedding(50, 64)
            self.mlp = gluon.nn.HybridSequential()
            for _ in range(3):
                self.mlp.add(gluon.nn.Dense(128, flatten=False, activation="relu"),
                             gluon.nn.Dense(64, flatten=False))

    def hybrid_forward(self, F, ids):
        pos = F.cast(F.contrib.arange_like(ids, axis=1), "float32").reshape((1, -1, 1))
        return self.mlp(F.broadcast_add(self.emb(ids), pos)).mean(axis=1)


def int_ids(policy: str | None) -> dict:
    mx.random.seed(0)
    net = IntIds()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    model = net if policy is None else PlannedBlock(net, policy)
    ids = mx.nd.array(np.random.RandomState(0).randint(0, 50, (16, 12)), dtype="int32")
    seen = {}
    with bound_regardless():
        for step in range(2):
            with autograd.record():
                loss = (model(ids) ** 2).mean()
            loss.backward()
            read_step(seen, step, net.collect_params().values(), loss=loss)
    assert_planned(model)
    return seen


def test_integer_values_in_the_graph_are_planned():
    """int32 ids and positions (arange_like): the plan is made and trains like plain Gluon
    (the segment model's templates for a value crossing a cut were learned for the integer
    value too, and MXNet has no loss of one: the block trained unplanned with a line naming
    MakeLoss, an op it does not have)."""
    from tests.test_gluon import assert_same

    assert_same(int_ids("sqrt"), int_ids(None))
