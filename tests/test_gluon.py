"""PlannedBlock trains a hybridized Gluon block exactly as plain hybridized training does.

Every comparison is bit-exact: the planned executor runs the same kernels on the same
values as the CachedOp (measured: MKL-DNN on and off, every mirror-kind policy).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import mxmirror
import mxmirror.gluon.block as block_module
import mxmirror.gluon.executor as gluon_executor
from mxmirror.adapter.children import allocated_mb
from mxmirror.errors import PlanError
from mxmirror.gluon import PlannedBlock
from tests.helpers import bound_regardless, log_lines
from tests.mkldnn_off import run_code

ROOT = Path(__file__).resolve().parents[1]
MIRROR_POLICIES = ["none", "cheap", "sqrt", "optimal", "budget"]


def resnet(dtype="float32"):
    mx.random.seed(0)
    net = gluon.model_zoo.vision.resnet18_v1(classes=10, pretrained=False)
    net.initialize(mx.init.Xavier(), ctx=CTXS)
    if dtype != "float32":
        net.cast(dtype)
    return net


class DropoutNet(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.body = gluon.nn.HybridSequential()
            self.body.add(gluon.nn.Conv2D(8, 3, padding=1), gluon.nn.BatchNorm(),
                          gluon.nn.Activation("relu"), gluon.nn.Dropout(0.5),
                          gluon.nn.Conv2D(8, 3, padding=1), gluon.nn.Activation("relu"),
                          gluon.nn.Dropout(0.3), gluon.nn.Dense(10))

    def hybrid_forward(self, F, x):
        return self.body(x)


def dropout_net(dtype="float32"):
    mx.random.seed(0)
    net = DropoutNet()
    net.initialize(mx.init.Xavier(), ctx=CTXS)
    return net


class HalfNet(gluon.HybridBlock):
    """Ops MXNet 1.9.1 runs in float16 on a CPU (no gemm): scale, BatchNorm (its own
    parameters stay float32), ReLU, pooling."""

    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.scale = self.params.get("scale", shape=(1, 3, 1, 1), init=mx.init.Uniform())
            self.bn = gluon.nn.BatchNorm()
            self.bn2 = gluon.nn.BatchNorm()

    def hybrid_forward(self, F, x, scale):
        y = F.relu(self.bn(F.broadcast_mul(x, scale)))
        y = F.relu(self.bn2(F.broadcast_mul(y, scale) + y))
        return F.mean(y, axis=(2, 3))


def half_net(dtype="float32"):
    mx.random.seed(0)
    net = HalfNet()
    net.initialize(mx.init.Xavier(), ctx=CTXS)
    net.cast(dtype)
    return net


CTXS = [mx.cpu(0)]


def budget_for(net, shape):
    """A budget the budget policy can meet: sqrt's own plan for this graph."""
    sym = net(mx.sym.var("data"))
    return mxmirror.plan(sym, "sqrt", data=shape).planned_bytes


def train(make, policy=None, *args, **kw):
    """Every array a user can read after `steps` Trainer steps: gradients (at each step),
    parameters with BatchNorm statistics, outputs, losses and input gradients (parameters
    keyed by position, or by name for blocks that list them in another order). Plans are
    bound whatever they save (tests/test_executor_memory.py has what decides that): this
    compares what they compute."""
    with bound_regardless():
        return _train(make, policy, *args, **kw)


def _train(make, policy=None, steps=3, ctxs=None, grad_req="write", dtype="float32",
           input_grad=False, batch=2, seed=None, budget=None, read_grads=True, size=32,
           by_name=False):
    ctxs = ctxs or (mx.cpu(0),)
    CTXS[:] = list(ctxs)
    net = make(dtype)
    net.hybridize()
    net(mx.nd.zeros((batch, 3, size, size), ctx=ctxs[0], dtype=dtype))  # finish shapes
    params = list(net.collect_params().values())
    keys = [p.name if by_name else k for k, p in enumerate(params)]
    if grad_req != "write":
        net.collect_params().setattr("grad_req", grad_req)
    if policy == "budget" and budget is None:
        budget = budget_for(net, (batch // len(ctxs), 3, size, size))
    model = net if policy is None else PlannedBlock(net, policy=policy, budget=budget)
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.01, "momentum": 0.9, "wd": 1e-4})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rs = np.random.RandomState(1)
    seen = {}
    if seed is not None:
        mx.random.seed(seed)
    for step in range(steps):
        x = mx.nd.array(rs.rand(batch, 3, size, size), dtype=dtype)
        y = mx.nd.array(rs.randint(0, 10, (batch,)), dtype=dtype)
        xs = gluon.utils.split_and_load(x, list(ctxs))
        ys = gluon.utils.split_and_load(y, list(ctxs))
        if input_grad:
            for xi in xs:
                xi.attach_grad()
        with autograd.record():
            outs = [model(xi) for xi in xs]
            losses = [loss_fn(o, yi) for o, yi in zip(outs, ys)]
        autograd.backward(losses)
        for i, (o, lo) in enumerate(zip(outs, losses)):
            seen[f"out{step}.{i}"] = o  # read after the loop: nothing waits in the loop
            seen[f"loss{step}.{i}"] = lo
            if input_grad:
                seen[f"dx{step}.{i}"] = xs[i].grad.asnumpy()
        for k, p in zip(keys, params):
            if p.grad_req != "null" and read_grads:
                for c in ctxs:
                    seen[f"grad{step}.{k}.{c}"] = p.grad(c).asnumpy()
        if grad_req != "add" or step % 2 == 1:
            trainer.step(batch)
            if grad_req == "add":
                net.collect_params().zero_grad()
    for k, p in zip(keys, params):
        for c in ctxs:
            seen[f"value.{k}.{c}"] = p.data(c).asnumpy()
    if policy is not None:  # what is compared ran on a planned executor
        assert model.decisions and all(used for _, used in model.decisions)
    return {k: v.asnumpy() if isinstance(v, mx.nd.NDArray) else v for k, v in seen.items()}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.fixture(scope="module")
def plain_resnet():
    return train(resnet)


@pytest.mark.parametrize("policy", MIRROR_POLICIES)
def test_resnet_trains_like_plain_hybridized(plain_resnet, policy):
    assert_same(train(resnet, policy), plain_resnet)


def test_plans_recompute_and_save_memory():
    """The plans compared above really recompute, and MXNet allocates less for them."""
    CTXS[:] = [mx.cpu(0)]
    net = resnet()
    net.hybridize()
    figures = {}
    for policy in ("sqrt", "none"):  # sqrt first: beside a live executor of the same
        planned = PlannedBlock(net, policy)  # Parameters its gradient buffers would not pay
        for _ in range(2):  # a plan that would not pay beside a second call: the second
            with autograd.record():  # record() after one that called the block once
                out = planned(mx.nd.ones((32, 3, 32, 32)))
            out.backward()
        (executor,) = planned.executors
        (figures[policy],) = allocated_mb(executor.exec)
        if policy == "sqrt":
            assert executor.plan.mirrored
    assert figures["sqrt"] < figures["none"]


def test_binds_the_parameters_own_arrays():
    """No weight copy and, for one call per record(), no gradient buffer: the executor
    reads the Parameters' data arrays and writes their gradient arrays. A second call
    waiting beside the first writes its gradients into a buffer of its own."""
    CTXS[:] = [mx.cpu(0)]
    net = resnet()
    net.hybridize()
    planned = PlannedBlock(net, "none")  # at this size, sqrt would not plan two calls
    x = mx.nd.ones((2, 3, 32, 32))
    with autograd.record():
        loss = (planned(x) + planned(x + 1)).sum()
    loss.backward()
    one, two = planned.executors
    params = net.collect_params()
    trained = [p for p in params.values() if p.grad_req != "null"]
    assert trained and all(one.exec.arg_dict[p.name] is p.data() for p in trained)
    assert all(one.exec.grad_dict[p.name] is p.grad() for p in trained)
    assert all(two.exec.arg_dict[p.name] is p.data() for p in trained)
    assert not any(two.exec.grad_dict[p.name] is p.grad() for p in trained)
    aux = [p for p in params.values() if "running" in p.name]
    assert aux and all(one.exec.aux_dict[p.name] is p.data() for p in aux)


def test_tight_loop_like_plain_hybridized():
    """backward, step, next forward with nothing read in between: autograd runs the planned
    backward on its own thread, and the Trainer's update must still see its gradients."""
    assert_same(train(resnet, "sqrt", steps=6, read_grads=False),
                train(resnet, None, steps=6, read_grads=False))


def test_dropout_like_plain_every_policy():
    """MXNet's executor and the CachedOp draw the same Dropout masks from one seed
    (measured, so plain hybridized Gluon is the reference), and a recomputation never
    draws a new one: the plans recompute what feeds a Dropout (checked). With MKL-DNN on,
    the executor's copies of the Dropouts' blocked inputs outweigh what these small plans
    save, so they would train unplanned: train() binds them regardless, to compare what
    they compute (whether a plan pays is tests/test_gluon_layout.py's)."""
    reference = train(dropout_net, None, seed=3)
    sym = dropout_net()(mx.sym.var("data"))
    for policy in ("cheap", "sqrt", "optimal"):
        mirrored = mxmirror.plan(sym, policy, data=(2, 3, 32, 32)).mirrored
        assert any("relu0" in m for m in mirrored), (policy, mirrored)
    for policy in MIRROR_POLICIES:
        assert_same(train(dropout_net, policy, seed=3), reference)


def test_grad_req_add_accumulates_like_plain():
    assert_same(train(resnet, "sqrt", steps=4, grad_req="add"),
                train(resnet, None, steps=4, grad_req="add"))


def test_two_contexts_split_and_load():
    ctxs = (mx.cpu(0), mx.cpu(1))
    assert_same(train(resnet, "sqrt", ctxs=ctxs, batch=4), train(resnet, None, ctxs=ctxs, batch=4))


def test_float16():
    assert_same(train(half_net, "sqrt", dtype="float16"), train(half_net, None, dtype="float16"))


def test_input_gradient():
    assert_same(train(resnet, "sqrt", input_grad=True), train(resnet, None, input_grad=True))


def test_new_shapes_plan_once_per_shape(caplog):
    CTXS[:] = [mx.cpu(0)]
    net = resnet()
    net.hybridize()
    planned = PlannedBlock(net, "sqrt")
    log = logging.getLogger("mxmirror")
    log.addHandler(caplog.handler)
    try:
        for n in (2, 3, 2, 3):
            with autograd.record():
                out = planned(mx.nd.ones((n, 3, 32, 32)))
            out.backward()
            assert out.shape == (n, 10)
    finally:
        log.removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records if "gluon" in r.getMessage()]
    assert len(lines) == 2 and "data=2x3x32x32" in lines[0] and "data=3x3x32x32" in lines[1]
    assert len(planned.executors) == 2


def by_record(records: list, policy=None, make=resnet) -> tuple[dict, object]:
    """Trainer steps of records() that call the block on ones(batch, 3, 32, 32) * scale for
    each (batch, scale) listed: losses, gradients (each step), parameters with BatchNorm
    statistics; for a plan the executors and gradient buffers after each step. And the
    model."""
    CTXS[:] = [mx.cpu(0)]
    net = make()
    net.hybridize()
    model = net if policy is None else PlannedBlock(net, policy)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    params = list(net.collect_params().values())
    seen = {}
    for step, record in enumerate(records):
        with autograd.record():
            loss = sum(model(mx.nd.ones((n, 3, 32, 32)) * scale).mean() for n, scale in record)
        loss.backward()
        seen[f"loss{step}"] = loss.asnumpy()
        seen.update({f"grad{step}.{k}": p.grad().asnumpy() for k, p in enumerate(params)
                     if p.grad_req != "null"})
        trainer.step(1)
        if policy is not None:
            seen[f"executors{step}"] = len(model.executors)
            seen[f"buffers{step}"] = sum(len(buffers) for p in params for buffers in
                                         gluon_executor._grad_targets.get(p, {}).values())
    seen.update({f"param{k}": p.data().asnumpy() for k, p in enumerate(params)})
    return seen, model


def test_shapes_write_the_gradient_itself_unless_they_wait_together():
    """An executor writes the Parameters' own gradient arrays where no other executor
    waiting for its backward writes them: the executors of batch 2 and of batch 3, in
    records of their own, both do; in one record() the second called gets buffers: a
    third executor (batch 3 after 2), and a fourth (batch 2 after 3). Bitwise as plain."""
    records = [[(2, 1)], [(3, 2)], [(2, 3), (3, 3)], [(3, 4), (2, 4)]]
    planned, model = by_record(records, "sqrt")
    assert [planned.pop(f"executors{i}") for i in range(4)] == [1, 2, 3, 4]
    assert [planned.pop(f"buffers{i}") for i in range(4)] == [0, 0, 62, 62]  # 62 trained
    writes = [all(ex.writes(n) for n, _ in ex.trained) for ex in model.executors]
    assert writes == [True, False, True, False]  # by shape: 2, 2 after 3, 3, 3 after 2
    assert_same(planned, by_record(records)[0])


def test_eight_calls_in_one_record_share_one_executor(monkeypatch):
    """Calls of one signature waiting together share one executor where a further one
    would not pay: each call's backward runs its forward again from the inputs it kept, so
    8 calls per record() hold one executor and no gradient buffer. Bitwise as plain, with
    BatchNorm statistics."""
    released = []
    monkeypatch.setattr(block_module, "release_freed", lambda: released.append(1))
    records = [[(2, i + step) for i in range(8)] for step in range(2)]
    planned, _ = by_record(records, "sqrt")
    assert released == []
    assert (planned.pop("executors0"), planned.pop("executors1")) == (1, 1)
    assert (planned.pop("buffers0"), planned.pop("buffers1")) == (0, 0)
    assert_same(planned, by_record(records)[0])


def test_eight_calls_that_cannot_share_then_unplanned(monkeypatch):
    """A graph that draws random numbers cannot run its forward again, so its calls do not
    share an executor. Plain Gluon holds a gradient term per call while it sums fewer than
    8 with ElementWiseSum, so a call beside a planned one is weighed with it (here a second
    call pays only so); from 8 calls MXNet chains the sum and frees terms early: the first
    record(), which cannot know, plans all 8, and the next trains unplanned, its executors
    and their gradient buffers let go and their memory given back once. Bitwise as plain."""
    released = []
    monkeypatch.setattr(block_module, "release_freed", lambda: released.append(1))
    records = [[(2, i + step) for i in range(8)] for step in range(2)]
    with bound_regardless():  # as above
        planned, _ = by_record(records, "sqrt", dropout_net)
    assert released == [1]
    assert (planned.pop("executors0"), planned.pop("executors1")) == (8, 0)
    assert planned.pop("buffers1") == 0 < planned.pop("buffers0")
    assert_same(planned, by_record(records, make=dropout_net)[0])


def test_inference_outside_record_is_the_block():
    CTXS[:] = [mx.cpu(0)]
    net = resnet()
    net.hybridize()
    x = mx.nd.ones((2, 3, 32, 32))
    planned = PlannedBlock(net, "sqrt")
    np.testing.assert_array_equal(planned(x).asnumpy(), net(x).asnumpy())
    assert not planned.executors  # no executor bound for inference


def test_unchanged_script_under_enabled():
    """mxmirror.enabled() plans the hybridized block of an unchanged loop, exactly."""
    with log_lines() as logged, mxmirror.enabled("sqrt"):
        hooked = train(resnet, None)
    assert_same(hooked, train(resnet, None))
    lines = [line for line in logged if "gluon" in line]
    planned = [line for line in lines if "policy=sqrt" in line]
    assert len(planned) == 1 and "resnet" in planned[0], lines
    # the loss is a HybridBlock too, never hybridized, with no Parameters: not a word
    assert lines == planned


def test_hook_leaves_unhybridized_blocks_alone():
    CTXS[:] = [mx.cpu(0)]
    net = resnet()
    with log_lines() as lines, mxmirror.enabled("sqrt"):
        for _ in range(2):
            with autograd.record():
                out = net(mx.nd.ones((2, 3, 32, 32)))
            out.backward()
    assert len(lines) == 1 and "not hybridized" in lines[0]


class WrongShape(gluon.HybridBlock):
    """A user's bug: a Parameter whose shape the graph cannot take."""

    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.d = gluon.nn.Dense(8)
            self.g = self.params.get("g", shape=(1, 3), init=mx.init.One())

    def hybrid_forward(self, F, x, g):
        return self.d(x) * g


def test_a_block_that_fails_itself_fails_as_plain_without_a_line():
    """Under the hook, a block whose own first call fails (a user's bug) raises its own
    error, as plain Gluon does, and mxmirror says nothing about training it unplanned."""
    net = WrongShape()
    net.initialize()
    net.hybridize()
    with log_lines() as lines, mxmirror.enabled("sqrt"), autograd.record(), \
            pytest.raises(ValueError, match="Deferred"):
        net(mx.nd.ones((4, 5)))
    assert lines == []


def test_recursive_on_a_small_resnet_trains_like_plain(plain_resnet):
    """recursive runs on MXNet's own executor when its segmented plan would not be better
    (the never-worse rule), and then trains exactly like plain hybridized Gluon; the
    segmented executor inside PlannedBlock: tests/test_gluon_segmented.py."""
    CTXS[:] = [mx.cpu(0)]
    sym = resnet()(mx.sym.var("data"))
    req = {a: ("null" if a == "data" else "write") for a in sym.list_arguments()}
    assert mxmirror.plan(sym, "recursive", grad_req=req,
                         data=(2, 3, 32, 32)).execution.kind == "mirror"
    assert_same(train(resnet, "recursive"), plain_resnet)


def test_budget_no_plan_reaches_binds_the_smallest_plan():
    """A budget below every plan: the smallest plan, as policy auto binds it (said in the
    log line), never the block unplanned."""
    CTXS[:] = [mx.cpu(0)]
    net = resnet()
    net.hybridize()
    planned = PlannedBlock(net, "budget", budget="100KB")
    with autograd.record():
        planned(mx.nd.ones((4, 3, 32, 32))).sum().backward()
    ((plan, used),) = planned.decisions
    smallest = mxmirror.plan(net(mx.sym.var("data")), "search", data=(4, 3, 32, 32))
    assert used and plan.recomputed_ids and plan.planned_bytes <= smallest.planned_bytes
    assert any("the smallest plan is used" in note for note in plan.notes), plan.notes


def test_bad_input():
    with pytest.raises(PlanError, match="HybridBlock"):
        PlannedBlock(gluon.nn.Sequential())
    with pytest.raises(PlanError, match="unknown policy"):
        PlannedBlock(gluon.nn.Dense(2), policy="fastest")
    with pytest.raises(PlanError, match="budget"):
        PlannedBlock(gluon.nn.Dense(2), policy="budget", budget="lots")


def test_mkldnn_off_bit_identical():
    """MKL-DNN is read at process start: the same comparisons in a child with it off."""
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        from tests import test_gluon as t
        plain = t.train(t.resnet)
        for policy in t.MIRROR_POLICIES:
            t.assert_same(t.train(t.resnet, policy), plain)
        # grad_req 'add': the non-MKL-DNN Convolution adds its batch chunks one by one
        t.test_grad_req_add_accumulates_like_plain()
        ref = t.train(t.dropout_net, None, seed=3)
        t.assert_same(t.train(t.dropout_net, "sqrt", seed=3), ref)
        print("ok")
    """)
    run_code(code)


GLUON_SCRIPT = textwrap.dedent("""
    import mxnet as mx
    from mxnet import autograd, gluon
    mx.random.seed(0)
    net = gluon.model_zoo.vision.resnet18_v1(classes=10, pretrained=False)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01,
                                                          "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x = mx.nd.random.uniform(shape=(2, 3, 32, 32))
    y = mx.nd.array([1, 7])
    for _ in range(3):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(2)
    print("checksum %r" % sum(float(p.data().abs().sum().asscalar())
                             for p in net.collect_params().values()))
""")


@pytest.mark.parametrize("how", ["run", "env"])
def test_unchanged_script_under_mxmirror_run_and_env(tmp_path: Path, how: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(GLUON_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MXMIRROR_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           env=env, timeout=300)
    if how == "run":
        cmd = [sys.executable, "-m", "mxmirror", "run", "--policy", "sqrt", str(script)]
    else:
        cmd = [sys.executable, "-c", "import mxmirror, runpy, sys; "
               "runpy.run_path(sys.argv[1], run_name='__main__')", str(script)]
        env["MXMIRROR_POLICY"] = "sqrt"
    planned = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert plain.returncode == 0 and planned.returncode == 0, planned.stderr[-2000:]
    assert "mxmirror: gluon resnetv10 data=2x3x32x32 policy=sqrt" in planned.stderr
    assert "mxmirror: gluon" not in plain.stderr
    checksum = [line for line in plain.stdout.splitlines() if line.startswith("checksum")]
    assert checksum and checksum == [line for line in planned.stdout.splitlines()
                                     if line.startswith("checksum")]


def test_log_sizes_read_as_written() -> None:
    """A plan of a graph under half a MB says its KB, not '0 MB' (log.mb_text's rule, which
    Gluon's lines follow too: tests/test_cli.py)."""
    x = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=8, name="fc")
    line = mxmirror.plan(mx.sym.Activation(x, act_type="relu"), policy="sqrt",
                         data=(4, 8)).summary()
    assert "baseline=0 MB" not in line and " KB planned=" in line
