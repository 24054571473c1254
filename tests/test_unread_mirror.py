"""Ops whose mirror copy must have its first output read (ir/ops.py MUST_WRITE) in the
patterns users write them in: Conv -> GroupNorm -> relu, Dense -> LayerNorm -> relu, a
transformer block with post-LayerNorm, Dense -> hard_sigmoid and hard swish.

MXNet asks a mirror copy whose first output nothing reads to write nothing (req kNullOp):
LayerNorm and GroupNorm then compute nothing (their backward reads the copy's mean and
deviation: garbage gradients), hard_sigmoid fails a check when the engine runs it
(scripts/unread_mirror_sweep.py has every op kind). Plans of these graphs trained three
steps through PlannedBlock and through the bind hook (Module) must equal plain training
bitwise (every output, input gradient, gradient and parameter; the patterns keep no
BatchNorm statistics), with MKL-DNN on and off (a child), and must really recompute the
pattern's op (a comparison of plain with itself proves nothing). Every one of them failed
before the rule covered these ops (MKL-DNN on and off: measured).
"""

from __future__ import annotations

import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxmirror
from mxmirror.gluon import PlannedBlock
from mxmirror.ir import ops
from tests import mkldnn_off
from tests.helpers import assert_planned, bound_regardless

POLICIES = ("sqrt", "search")
STEPS = 3
BATCH, SIZE, CLASSES = 4, 8, 10
# the patterns' sizes: ones where every plan below pays in MXNet's figure (so that
# PlannedBlock binds it), and recomputed the op unread before the fix (measured)
CHANNELS, HIDDEN, WIDTH = 8, 128, 16
# the op each pattern is about (the test asserts its plans mirror it)
PATTERNS = {"GroupNorm": "GroupNorm", "LayerNorm": "LayerNorm", "transformer": "LayerNorm",
            "hard_sigmoid": "hard_sigmoid"}


# ------------------------------------------------------------------ Gluon
class NormNet(gluon.HybridBlock):
    """One pattern (PATTERNS), then a Dense classifier; the image's rows are the tokens of
    the LayerNorm patterns."""

    def __init__(self, pattern: str, **kw):
        super().__init__(**kw)
        self.pattern = pattern
        with self.name_scope():
            self.body = nn.HybridSequential()
            if pattern == "GroupNorm":  # Conv -> GroupNorm -> relu
                for _ in range(4):
                    self.body.add(nn.Conv2D(CHANNELS, 3, padding=1), nn.GroupNorm(num_groups=2),
                                  nn.Activation("relu"))
            elif pattern == "LayerNorm":  # Dense -> LayerNorm -> relu
                for _ in range(4):
                    self.body.add(nn.Dense(32, flatten=False), nn.LayerNorm(),
                                  nn.Activation("relu"))
            elif pattern == "transformer":  # one block, post-LayerNorm
                self.embed = nn.Dense(WIDTH, flatten=False)
                self.q, self.k, self.v, self.o = (nn.Dense(WIDTH, flatten=False)
                                                  for _ in range(4))
                self.ff1 = nn.Dense(2 * WIDTH, flatten=False)
                self.ff2 = nn.Dense(WIDTH, flatten=False)
                self.ln1, self.ln2 = nn.LayerNorm(), nn.LayerNorm()
            else:  # Dense -> hard_sigmoid and Dense -> hard swish (x * hard_sigmoid(x))
                self.body.add(*(nn.Dense(HIDDEN) for _ in range(5)))
            self.out = nn.Dense(CLASSES)

    def hybrid_forward(self, F, x):
        if self.pattern == "GroupNorm":
            return self.out(self.body(x))
        x = x.reshape((0, -1, SIZE))  # (batch, tokens, SIZE)
        if self.pattern == "LayerNorm":
            return self.out(self.body(x))
        if self.pattern == "hard_sigmoid":
            for i, dense in enumerate(self.body):
                x = dense(x)
                x = x * F.hard_sigmoid(x) if i % 2 else F.hard_sigmoid(x)
            return self.out(x)
        x = self.embed(x)
        att = F.softmax(F.batch_dot(self.q(x), self.k(x), transpose_b=True) / WIDTH ** 0.5)
        x = self.ln1(x + self.o(F.batch_dot(att, self.v(x))))
        x = self.ln2(x + self.ff2(F.relu(self.ff1(x))))
        return self.out(x)


def gluon_train(pattern: str, policy: str | None) -> tuple[dict, list]:
    """Everything a user can read after STEPS steps of plain or planned hybridized training
    (the output, the input gradient and every gradient at each step, then every
    parameter), and the ops of the nodes the planned executor recomputes."""
    mx.random.seed(0)
    net = NormNet(pattern, prefix="net_")
    net.initialize(mx.init.Xavier())
    net.hybridize()
    model = net if policy is None else PlannedBlock(net, policy)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rs = np.random.RandomState(1)
    seen = {}
    for step in range(STEPS):
        x = mx.nd.array(rs.uniform(-1, 1, (BATCH, 3, SIZE, SIZE)))
        y = mx.nd.array(rs.randint(0, CLASSES, (BATCH,)))
        x.attach_grad()
        with autograd.record():
            out = model(x)
            loss = loss_fn(out, y)
        loss.backward()
        seen[f"out{step}"] = out.asnumpy()
        seen[f"dx{step}"] = x.grad.asnumpy()
        for name, p in net.collect_params().items():
            seen[f"grad{step} {name}"] = p.grad().asnumpy()
        trainer.step(BATCH)
    for name, p in net.collect_params().items():
        seen[f"value {name}"] = p.data().asnumpy()
    if policy is None:
        return seen, []
    assert_planned(model)
    (executor,) = model.executors
    return seen, _recomputed(executor.plan, executor.exec)


# ------------------------------------------------------------------ Module
def norm_symbol(pattern: str) -> mx.sym.Symbol:
    """NormNet's pattern as a Module user writes it, with SoftmaxOutput."""
    S = mx.sym
    x = S.var("data")

    def dense(h, name, width=WIDTH):
        return S.FullyConnected(h, num_hidden=width, flatten=False, name=name)

    if pattern == "GroupNorm":
        for i in range(4):
            x = S.Convolution(x, num_filter=CHANNELS, kernel=(3, 3), pad=(1, 1),
                              name=f"conv{i}")
            x = S.Activation(S.GroupNorm(x, num_groups=2, name=f"gn{i}"), act_type="relu")
    elif pattern == "hard_sigmoid":
        for i in range(5):
            x = S.FullyConnected(x, num_hidden=HIDDEN, name=f"fc{i}")
            x = x * S.hard_sigmoid(x) if i % 2 else S.hard_sigmoid(x)
    elif pattern == "LayerNorm":
        x = S.reshape(x, shape=(0, -1, SIZE))
        for i in range(4):
            x = S.relu(S.LayerNorm(dense(x, f"fc{i}", 32), name=f"ln{i}"))
    else:
        x = dense(S.reshape(x, shape=(0, -1, SIZE)), "embed")
        att = S.softmax(S.batch_dot(dense(x, "q"), dense(x, "k"), transpose_b=True)
                        / WIDTH ** 0.5)
        x = S.LayerNorm(x + dense(S.batch_dot(att, dense(x, "v")), "o"), name="ln1")
        x = S.LayerNorm(x + dense(S.relu(dense(x, "ff1", 2 * WIDTH)), "ff2"), name="ln2")
    return S.SoftmaxOutput(S.FullyConnected(x, num_hidden=CLASSES, name="out"),
                           name="softmax")


def module_train(pattern: str, policy: str | None) -> tuple[dict, list]:
    """Everything after STEPS steps of Module training (forward_backward, update), plain or
    bound under the bind hook, and the ops of the nodes its executor recomputes."""
    rs = np.random.RandomState(1)
    x = rs.uniform(-1, 1, (STEPS * BATCH, 3, SIZE, SIZE))
    y = rs.randint(0, CLASSES, (STEPS * BATCH,))
    it = mx.io.NDArrayIter(x, y, batch_size=BATCH, label_name="softmax_label")
    mod = mx.mod.Module(norm_symbol(pattern), context=mx.cpu())
    with mxmirror.enabled(policy or "none"):
        mod.bind(data_shapes=it.provide_data, label_shapes=it.provide_label,
                 inputs_need_grad=True)
    mx.random.seed(0)
    mod.init_params(mx.init.Xavier())
    mod.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 0.1})
    seen = {}
    ex = mod._exec_group.execs[0]
    for step, batch in enumerate(it):
        mod.forward_backward(batch)
        seen[f"out{step}"] = mod.get_outputs()[0].asnumpy()
        seen[f"dx{step}"] = mod.get_input_grads()[0].asnumpy()
        for name, g in ex.grad_dict.items():
            if g is not None:
                seen[f"grad{step} {name}"] = g.asnumpy()
        mod.update()
    args, aux = mod.get_params()
    seen.update({f"value {k}": v.asnumpy() for k, v in {**args, **aux}.items()})
    if policy is None:
        return seen, []
    from mxmirror.frontends import hook

    (plan,) = [p for p, _ in hook._plans.values() if p.recomputed_ids]
    return seen, _recomputed(plan, ex)


# ------------------------------------------------------------------ checks
def _recomputed(plan, executor) -> list[str]:
    """The ops of the nodes the plan mirrors, checked against MXNet's own graph (its
    ``_mirror`` copies)."""
    by_name = {n["name"]: n["op"] for n in json.loads(plan.symbol.tojson())["nodes"]}
    mirrored = [by_name[name] for name in plan.mirrored]
    copies = executor.debug_str().count("_mirror\n")
    assert mirrored and copies >= len(mirrored), (mirrored, copies)
    return mirrored


def assert_same(got: dict, want: dict, what: str) -> None:
    assert got.keys() == want.keys()
    bad = [k for k in want if not np.array_equal(got[k], want[k])]
    assert not bad, f"{what}: {len(bad)} arrays differ, e.g. {bad[:4]}"


@pytest.fixture(scope="module")
def plain():
    return {(frontend, pattern): train(pattern, None)[0]
            for frontend, train in (("gluon", gluon_train), ("module", module_train))
            for pattern in PATTERNS}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_gluon_trains_like_plain(plain, pattern, policy):
    with bound_regardless():
        seen, mirrored = gluon_train(pattern, policy)
    assert_same(seen, plain["gluon", pattern], f"PlannedBlock({policy!r}), {pattern}")
    assert PATTERNS[pattern] in mirrored, mirrored  # the op itself among the copies


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_module_trains_like_plain(plain, pattern, policy):
    with bound_regardless():
        seen, mirrored = module_train(pattern, policy)
    assert_same(seen, plain["module", pattern], f"Module in enabled({policy!r}), {pattern}")
    assert PATTERNS[pattern] in mirrored, mirrored


def test_planned_figure_is_mxnets():
    """The rule changes which nodes a plan mirrors, not how its memory is simulated: on
    the transformer at a size MXNet's whole-MB figure can see, the plans' simulated bytes
    are MXNet's own figure (``Total X MB allocated``, floored to whole MB) for sqrt and
    search; and the rule keeps an unread LayerNorm copy out of a mirror set."""
    sym = norm_symbol("transformer")
    shapes = {"data": (64, 3, 64, 64), "softmax_label": (64,)}
    for policy in POLICIES:
        plan = mxmirror.plan(sym, policy=policy, **shapes)
        assert plan.mirrored
        figure = plan.mxnet_mb()
        assert 0 <= plan.planned_bytes / 2**20 - figure < 1, (policy, plan.planned_bytes,
                                                              figure)
    a = plan.analysis
    # every op node mirrored but the classifier and the loss
    wanted = frozenset(n.id for n in a.order if n.name not in ("out", "softmax"))
    dropped = {a.graph.nodes[i].name: a.graph.nodes[i].op
               for i in wanted - a.drop_unread(wanted)}
    # the last LayerNorm's copy would be read by nothing; without it the copy of the
    # residual add before it is not built, and the copy of the Dense it adds would be read
    # by nothing either: neither is mirrored
    assert dropped == {"ln2": "LayerNorm", "ff2": "FullyConnected"}


def test_the_norms_must_write():
    """The rule the plans above follow, stated once (ir/ops.py)."""
    assert set(PATTERNS.values()) <= ops.MUST_WRITE


def test_without_mkldnn():
    """The same with MKL-DNN off (read at process start: a child)."""
    if not mkldnn_off.MKLDNN:
        pytest.skip("this process already runs without MKL-DNN")
    mkldnn_off.run_pytest(__file__, "not without_mkldnn and not figure",
                          passed=4 * len(PATTERNS) + 1)
