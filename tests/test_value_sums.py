"""The gradient of a value read in several segments, summed as MXNet sums it (value_sums.py).

A value with three or more gradient terms in several segments: an unrolled LSTM layer's
output read by the layer's next step, the next layer and a ResidualCell's sum (Gluon,
``rnn.ResidualCell``), or each block's output of a residual dense chain also read by a
long skip to the end. MXNet sums three terms with one ElementWiseSum, ``x + (y + z)``; the
segmented executor added the segments' terms one by one as their backwards came,
``(x + y) + z``, about 1e-7 relative away, on every policy it runs.

Checked with MKL-DNN off (a child: MKL-DNN sums with kernels of its own), every
comparison bit for bit (the bytes of the arrays, so a -0 for a +0 counts): the Gluon
ResidualCell stack trained 3 steps under ``recursive`` and ``multilevel`` (a budget
below one recomputation) on PlannedBlock, whose executor is checked to be a
SegmentedExecutor, against plain hybridized Gluon; and, on the residual chain, every
chain the multi-level DP considers, bound as a SegmentedExecutor: where the model calls
its sums exact the gradients are MXNet's, where it does not they differ, and the planner
runs none of those (dp.chains, and ``recursive`` takes the one-recompute plan).
"""

from __future__ import annotations

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn, rnn

from mxmirror.api import prepare
from mxmirror.gluon import PlannedBlock
from mxmirror.planning import dp
from mxmirror.runtime.segmented.executor import SegmentedExecutor
from mxmirror.segments.cost import make_segment_plan
from mxmirror.segments.value_sums import Program
from tests import mkldnn_off
from tests.helpers import assert_planned, bound_regardless, read_step, read_values

T, H, B = 12, 32, 32  # the smallest stack whose recursive plan binds from the first call


class ResidualStack(gluon.HybridBlock):
    """repro_13's network: Dense, a 2-layer LSTMCell stack whose second layer is a
    ResidualCell, unrolled with merged outputs, Dense."""

    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.inp = nn.Dense(H, flatten=False, in_units=5)
            self.cells = rnn.HybridSequentialRNNCell()
            self.cells.add(rnn.LSTMCell(H, input_size=H))
            self.cells.add(rnn.ResidualCell(rnn.LSTMCell(H, input_size=H)))
            self.out = nn.Dense(3, flatten=False, in_units=H)

    def hybrid_forward(self, F, x):
        outs, _ = self.cells.unroll(T, self.inp(x), layout="NTC", merge_outputs=True)
        return self.out(outs)


def train_stack(policy: str | None = None, budget: int | None = None, steps: int = 3,
                plans: list | None = None) -> dict:
    """Every array a user reads after each of `steps` SGD steps (loss, output, input
    gradient, every Parameter's gradient) and the Parameters after them; `plans` gets
    the bound plans."""
    mx.random.seed(0)
    net = ResidualStack()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    model = net if policy is None else PlannedBlock(net, policy, budget=budget)
    params = list(net.collect_params().values())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    loss_fn = gluon.loss.L1Loss()
    rs = np.random.RandomState(0)
    seen: dict = {}
    with bound_regardless():
        for step in range(steps):
            x = mx.nd.array(rs.uniform(-1, 1, (B, T, 5)))
            y = mx.nd.array(rs.uniform(-1, 1, (B, T, 3)))
            x.attach_grad()
            with autograd.record():
                out = model(x)
                loss = loss_fn(out, y)
            loss.backward()
            read_step(seen, step, params, loss=loss, out=out, dx=x.grad)
            trainer.step(B)
    read_values(seen, params)
    if policy is not None:
        assert_planned(model)
        for bound in model.executors:
            assert isinstance(bound.exec, SegmentedExecutor), bound.plan.execution.kind
            # the partial sums held apart, as the dry run counts them
            sp = bound.plan.execution.segment_plan
            assert bound.exec.runner.peak_kept_bytes == sp.dry.peak_bytes
            if plans is not None:
                plans.append(bound.plan.execution.segment_plan)
    return seen


def assert_bits(a: dict, b: dict) -> None:
    """The same names, dtypes, shapes and bytes."""
    assert a.keys() == b.keys()
    bad = [k for k in a if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape
           or a[k].tobytes() != b[k].tobytes()]
    assert not bad, f"differ: {bad[:8]}"


def check_residual_stack() -> None:
    """recursive and multilevel (a budget below one recomputation: at most the recursive
    plan's bytes) train the stack as plain Gluon does, bit for bit; both run programs
    (value_sums.Program) for the layer outputs the ResidualCell reads."""
    plain = train_stack()
    plans: list = []
    assert_bits(train_stack("recursive", plans=plans), plain)
    (rec,) = plans
    assert rec.segments.value_sums.programs and rec.segments.exact
    assert_bits(train_stack("multilevel", budget=rec.planned_bytes, plans=plans), plain)
    multi = plans[-1]
    assert max(multi.dry.runs) > 2 and multi.tree != rec.tree  # below one recomputation
    assert multi.segments.value_sums.programs


def residual_chain(k: int = 6, hidden: int = 16):
    """h = tanh(FC(h)) + h, k times, every h also summed into the output (a long skip): each
    h has three gradient terms (the next FC, the next residual sum, the skip's sum)."""
    h = mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=hidden, name="inp")
    total = None
    for i in range(k):
        f = mx.sym.Activation(mx.sym.FullyConnected(h, num_hidden=hidden, name=f"fc{i}"),
                              act_type="tanh")
        h = f + h
        total = h if total is None else total + h
    out = mx.sym.FullyConnected(total, num_hidden=3, name="out")
    return mx.sym.MakeLoss(mx.sym.sum(mx.sym.abs(out - mx.sym.Variable("label"))))


CHAIN_SHAPES = {"data": (8, 10), "label": (8, 3)}


def _grads(sym, ex) -> dict:
    rng = np.random.RandomState(0)
    for name in sym.list_arguments():
        ex.arg_dict[name][:] = rng.uniform(-1, 1, ex.arg_dict[name].shape)
    ex.forward(is_train=True)
    ex.backward()
    return {n: g.asnumpy() for n, g in ex.grad_dict.items() if g is not None}


def check_residual_chain() -> None:
    """Every chain the DP considers on the residual chain, bound as a SegmentedExecutor:
    exact (Segments.exact) where and only where its gradients are MXNet's, bit for bit;
    some chains are each, and the planner keeps the exact ones only."""
    sym = residual_chain()
    a = prepare(sym, **CHAIN_SHAPES).analysis
    req = {n: ("null" if n in CHAIN_SHAPES else "write") for n in sym.list_arguments()}
    ref = _grads(sym, sym.simple_bind(mx.cpu(), grad_req=req, **CHAIN_SHAPES))
    verdicts = []
    for cuts in dp.cut_sets(a):
        sp = make_segment_plan(a.graph, cuts)
        got = _grads(sym, SegmentedExecutor(sym, mx.cpu(), sp))
        same = all(ref[n].tobytes() == got[n].tobytes() for n in ref)
        assert same == sp.segments.exact, (sp.segments.m, sp.segments.value_sums.inexact)
        verdicts.append(same)
    assert True in verdicts and False in verdicts
    kept = dp.chains(a)
    assert kept and all(c.segments.exact for c in kept) and len(kept) == sum(verdicts)


def test_without_mkldnn() -> None:
    """The checks above in a child with MKL-DNN off."""
    mkldnn_off.run_code("import sys; sys.path[:0] = [sys.argv[1]]\n"
                        "from tests import test_value_sums as t\n"
                        "t.check_residual_stack()\n"
                        "t.check_residual_chain()\n"
                        "print('ok')", timeout=600)


def test_three_segments_sum_as_elementwise_sum() -> None:
    """The ResidualCell stack's recursive chain (no MXNet run): each layer-0 output
    read by three other segments gets a program adding the two latest blocks first,
    x + (y + z) as ElementWiseSum of three, holding two partial sums at most."""
    sym = ResidualStack()(mx.sym.var("data"))
    prep = prepare(mx.sym.MakeLoss(mx.sym.sum(sym)), data=(B, T, 5))
    sg = prep.own_plan("recursive").execution.segment_plan.segments
    graph = sg.graph
    programs = sg.value_sums.programs
    assert not sg.value_sums.inexact
    outs = {e: p for e, p in programs.items() if graph.nodes[e[0]].name.endswith("_out")
            and "lstm0" in graph.nodes[e[0]].name}
    assert len(outs) >= T - 2
    for p in outs.values():
        first, *rest = sorted(p.leaf, reverse=True)  # backwards run the last segment first
        assert p.parent[p.leaf[first]] == p.root  # the first block waits for the others' sum
        assert p.parent[p.leaf[rest[0]]] == p.parent[p.leaf[rest[1]]] != p.root
        assert max(p.held.values()) == 2


def test_program_held_counts() -> None:
    """A program's partial sums held after each backward: ((a + b) + c) holds one; a +
    (b + c) holds two until c comes."""
    left = Program.of(("+", ("+", ("seg", 9), ("seg", 7)), ("seg", 5)), [9, 7, 5])
    right = Program.of(("+", ("seg", 9), ("+", ("seg", 7), ("seg", 5))), [9, 7, 5])
    assert left.held == {9: 1, 7: 1, 5: 1}
    assert right.held == {9: 1, 7: 2, 5: 1}


def test_recursive_where_its_chain_is_inexact() -> None:
    """On the residual chain the finest chain's segments hold several readers of a value
    that MXNet adds to other terms first: `recursive` takes the one-recompute plan and says
    why (the DP keeps the exact chains only: check_residual_chain)."""
    sym = residual_chain()
    prep = prepare(sym, **CHAIN_SHAPES)
    plan = prep.own_plan("recursive")
    assert plan.execution.kind == "mirror"
    assert any(n.startswith("the one-recompute plan is used: the segments would not sum "
                            "the gradient of ") for n in plan.notes), plan.notes
