"""The segmented executor (several recomputations per node) trains exactly like MXNet.

A CIFAR ResNet with BatchNorm and the paper's unrolled LSTM with Dropout are
trained a few steps by plain MXNet and by the segmented executor under the
recursive schedule and a multi-level DP schedule: outputs, parameter
gradients and BatchNorm running statistics must agree (rtol 1e-5) at every
step, so statistics are updated exactly once per step and Dropout masks are
replayed identically. Then the entry points: ``mxmirror.simple_bind``,
``mxmirror.enabled`` with Module, ``mxmirror run``, the budget fallback, and
the memory prediction against MXNet's own figures.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from mxmirror.adapter.children import allocated_mb
from mxmirror.adapter.reader import load_graph
from mxmirror.api import prepare
from mxmirror.errors import PlanError
from mxmirror.planning import dp
from mxmirror.planning.chains import segment_chain
from mxmirror.runtime.segmented.executor import SegmentedExecutor
from mxmirror.segments import schedule
from mxmirror.segments.cost import dry_run, make_segment_plan, pool_blocks
from mxmirror.segments.schedule import binary_tree, spine, store_all_tree
from symbols.lstm import input_shapes, paper_lstm
from symbols.resnet import resnet_by_depth
from tests import mkldnn_off
from tests.helpers import assert_same

ROOT = Path(__file__).resolve().parents[1]
# With MKLDNN a boundary value arrives in plain layout where the unplanned executor had a
# blocked one, so a few sums run in another order (differences of a few 1e-6); without
# MKLDNN (the child in test_bitwise_without_mkldnn) every value is bit-identical.
EXACT = not mkldnn_off.MKLDNN
RTOL, ATOL = (0.0, 0.0) if EXACT else (1e-5, 1e-5)
STEPS, LR = 2, 0.05


def _resnet():
    sym = resnet_by_depth(14, bottleneck=False, num_classes=10, image_shape=(3, 32, 32))
    return sym, {"data": (4, 3, 32, 32), "softmax_label": (4,)}


def _lstm():
    t, layers = 6, 3  # layers 2 and 3 have one structure and their own weights
    sym = paper_lstm(t, num_layers=layers, num_hidden=16, num_embed=16, input_size=12,
                     num_classes=10, dropout=0.5)
    return sym, input_shapes(t, 4, num_layers=layers, num_hidden=16, input_size=12)


@pytest.fixture(scope="module")
def resnet():
    sym, shapes = _resnet()
    return sym, shapes, prepare(sym, **shapes)


@pytest.fixture(scope="module")
def lstm():
    sym, shapes = _lstm()
    return sym, shapes, prepare(sym, **shapes)


def _fill(ref, ex, seed=0):
    rng = np.random.RandomState(seed)
    for k, v in ref.arg_dict.items():
        if k.endswith("label"):
            val = rng.randint(0, 10, v.shape)
        else:
            val = rng.uniform(-0.5, 0.5, v.shape)
        v[:] = val
        ex.arg_dict[k][:] = val
    for k, v in ref.aux_dict.items():
        val = rng.uniform(0.5, 1.5, v.shape) if "var" in k else rng.uniform(-0.1, 0.1, v.shape)
        v[:] = val
        ex.aux_dict[k][:] = val


def _close(a, b):
    return np.array_equal(a, b) if EXACT else np.allclose(a, b, rtol=RTOL, atol=ATOL)


def _train_and_compare(sym, shapes, sp):
    req = {a: ("null" if a in shapes else "write") for a in sym.list_arguments()}
    ref = sym.simple_bind(mx.cpu(), grad_req=req, **shapes)
    ex = SegmentedExecutor(sym, mx.cpu(), sp)
    _fill(ref, ex)
    for step in range(STEPS):
        for e in (ref, ex):
            mx.random.seed(11 + step)  # the same Dropout masks in both
            e.forward(is_train=True)
            e.backward()
        mx.nd.waitall()  # BatchNorm's running-stat update is not engine-tracked
        for a, b in zip(ref.outputs, ex.outputs):
            assert _close(a.asnumpy(), b.asnumpy())
        assert_same(ref.grad_dict, ex.grad_dict, f"gradients at step {step}", _close)
        assert_same(ref.aux_dict, ex.aux_dict, f"aux states at step {step}", _close)
        for k, g in ref.grad_dict.items():  # move the parameters so steps differ
            if g is not None:
                ref.arg_dict[k][:] -= LR * g
                ex.arg_dict[k][:] -= LR * ex.grad_dict[k]
    return ex


# ------------------------------------------------------------ equality with MXNet
def test_resnet_recursive_equals_unplanned(resnet) -> None:
    sym, shapes, prep = resnet
    p = prep.own_plan("recursive")
    assert p.execution.kind == "segmented"
    sp = p.execution.segment_plan
    assert max(sp.dry.runs) >= 3  # several reruns
    ex = _train_and_compare(sym, shapes, sp)
    assert ex.aux_dict  # BatchNorm statistics were compared
    # the dry run is what happens: both replay sp.operations
    assert ex.runner.peak_kept_bytes == sp.dry.peak_bytes
    # the arrays holding them, alive or waiting for reuse, never more; reused
    recycler = ex.runner.recycler
    assert recycler.peak_bytes == sp.dry.peak_bytes
    assert recycler.made < recycler.handed
    assert ex.runner.forward_flops_run == STEPS * sp.dry.forward_flops


def test_lstm_dropout_recursive_equals_unplanned(lstm) -> None:
    sym, shapes, prep = lstm
    p = prep.own_plan("recursive")
    sp = p.execution.segment_plan
    sg = sp.segments
    assert sg.dropouts and len(sp.template_bytes) < sg.m  # steps share executors
    # one template per weight set: a weight read by several segments is bound, never copied
    reads = Counter(key[1] for seg in sg.segments for _, key in seg.slots if key[0] == "arg")
    repeated = {(seg.key, name) for seg in sg.segments for name, key in seg.slots
                if key[0] == "arg" and reads[key[1]] > 1}
    assert repeated and repeated <= sg.user_slots
    assert len({seg.structure for seg in sg.segments}) < len(sp.template_bytes)
    _train_and_compare(sym, shapes, sp)


def test_lstm_store_all_and_tightest_dp_schedules(lstm) -> None:
    sym, shapes, prep = lstm
    sp = segment_chain(prep.analysis)
    sg, graph = sp.segments, prep.analysis.graph
    mem = (sp.template_bytes, sp.template_blocks)
    table = dp.table_for(sp, sum(sg.state_bytes(i) for i in range(sg.m + 1)))
    tight = make_segment_plan(graph, sg.cuts, table.tree(table.min_level()), sg=sg, mem=mem)
    assert max(tight.dry.runs) > max(sp.dry.runs)  # less memory, more reruns
    _train_and_compare(sym, shapes, tight)
    _train_and_compare(sym, shapes, make_segment_plan(graph, sg.cuts, store_all_tree(sg.m),
                                                      sg=sg, mem=mem))


def test_inference_forward_and_interface(resnet) -> None:
    sym, shapes, prep = resnet
    p = prep.own_plan("recursive")
    ref = sym.simple_bind(mx.cpu(), grad_req="null", **shapes)
    ex = p.bind(mx.cpu(), symbol=sym)  # the segmented plan itself (the hook may not pick it)
    assert isinstance(ex, SegmentedExecutor)
    _fill(ref, ex)
    ref.forward(is_train=False)
    out = ex.forward(is_train=False)
    assert np.allclose(ref.outputs[0].asnumpy(), out[0].asnumpy(), rtol=RTOL, atol=ATOL)
    assert list(ex.output_dict) == sym.list_outputs()
    assert len(ex.arg_arrays) == len(ex.grad_arrays) == len(sym.list_arguments())
    assert len(ex.aux_arrays) == len(sym.list_auxiliary_states())
    ex.copy_params_from({"fc1_bias": mx.nd.ones((10,))}, {})
    assert ex.arg_dict["fc1_bias"].asnumpy().sum() == 10
    with pytest.raises(ValueError):
        ex.copy_params_from({"nope": mx.nd.ones((1,))})
    with pytest.raises(PlanError):
        ex.reshape(data=(8, 3, 32, 32))
    with pytest.raises(PlanError):
        ex.backward()  # no training forward yet
    assert "Total" in ex.debug_str()
    with pytest.raises(PlanError, match="simple_bind"):
        _ = p.symbol


def test_bitwise_without_mkldnn() -> None:
    """Without MKLDNN's layouts the segmented run is bit-identical to MXNet's (child)."""
    if EXACT:
        pytest.skip("already the child")
    mkldnn_off.run_pytest(__file__, "equals_unplanned", passed=2)


# ------------------------------------------------------------ schedules
def test_binary_tree_logarithmic() -> None:
    for k in range(1, 8):
        m = 2**k
        tree = binary_tree(m)
        assert len(spine(tree, m)) == k + 1 - (k == 0)
        depth = _depth(tree, 0, m)
        assert depth == k


def test_binary_tree_operations() -> None:
    """The schedule is a list a user can print: the binary tree over 4 segments runs every
    segment forward keeping cuts 2 and 3, backpropagates segment 4 on its live forward,
    then each range from the state kept before it."""
    Forward, Backward, Release = schedule.Forward, schedule.Backward, schedule.Release
    ops = schedule.operations(binary_tree(4), 4)
    print(*ops, sep="\n")
    assert ops == [Forward(1), Forward(2, keep=True), Forward(3, keep=True), Forward(4),
                   Backward(4, rerun=False), Release(3), Backward(3), Release(2),
                   Forward(1, keep=True), Backward(2), Release(1), Backward(1)]
    assert schedule.backward_start(ops) == 4
    assert schedule.operations(store_all_tree(3), 3) == [
        Forward(1, keep=True), Forward(2, keep=True), Forward(3), Backward(3, rerun=False),
        Release(2), Backward(2), Release(1), Backward(1)]


def _random_tree(m, rng):
    tree, todo = {}, [(0, m)]
    while todo:
        s, e = todo.pop()
        if e - s > 1:
            tree[(s, e)] = mid = int(rng.randint(s + 1, e))
            todo += [(s, mid), (mid, e)]
    return tree


def test_operations_run_from_states_that_exist() -> None:
    """Any tree's operations: every forward runs from the state just made or a kept one,
    every backward from a kept state (cut 0: the inputs), once per segment from the last,
    each kept state dropped once, nothing kept at the end; the training forward is every
    segment once, keeping the spine's states, and only its last segment is not rerun."""
    rng = np.random.RandomState(0)
    for m in range(1, 14):
        for tree in [binary_tree(m), store_all_tree(m)] + [_random_tree(m, rng)
                                                           for _ in range(20)]:
            ops = schedule.operations(tree, m)
            kept, last, backwards, start = {0}, 0, [], schedule.backward_start(ops)
            for j, op in enumerate(ops):
                if type(op) is schedule.Forward:
                    assert op.segment - 1 in kept or op.segment - 1 == last, (tree, op)
                    last = op.segment
                    if op.keep:
                        assert op.segment not in kept
                        kept.add(op.segment)
                elif type(op) is schedule.Backward:
                    assert op.segment - 1 in kept, (tree, op)
                    assert op.rerun == (j != start)
                    backwards.append(op.segment)
                    last = None
                else:
                    kept.remove(op.cut)
            assert kept == {0} and backwards == list(range(m, 0, -1))
            assert start == m and ops[:m] == [schedule.Forward(i, i in spine(tree, m))
                                              for i in range(1, m + 1)]


def _depth(tree, s, e):
    if e - s < 2:
        return 0
    mid = tree[(s, e)]
    return 1 + max(_depth(tree, s, mid), _depth(tree, mid, e))


def test_dp_matches_known_costs() -> None:
    m = 8
    f = [1.0] * m
    states = [0] + [1] * m
    table = dp.Table(f, states, unit=1.0, levels=m + 2)
    # memory for every state: each segment reruns once, the last one not
    assert table.best(m + 2) == m + (m - 1)
    # no spare memory: the tree must recompute from the start every time
    lo = table.min_level()
    assert lo is not None and table.best(lo) > table.best(m + 2)
    # costs fall as memory grows
    costs = [table.best(level) for level in range(lo, m + 3)]
    assert all(a >= b for a, b in zip(costs, costs[1:]))


def test_dry_run_recursive_vs_store_all(resnet) -> None:
    _, _, prep = resnet
    sp = segment_chain(prep.analysis)
    sg = sp.segments
    everything = dry_run(sg, store_all_tree(sg.m))
    assert max(everything.runs) == 2 and everything.runs[-1] == 1
    assert sp.dry.peak_state_bytes < everything.peak_state_bytes


# ------------------------------------------------------------ memory prediction
def test_template_bytes_match_mxnet(resnet) -> None:
    sym, _, _ = resnet
    shapes = {"data": (16, 3, 32, 32), "softmax_label": (16,)}
    prep = prepare(sym, **shapes)
    p = prep.own_plan("recursive")
    ex = SegmentedExecutor(sym, mx.cpu(), p.execution.segment_plan)
    checked = 0
    for key, e in ex.executors.items():
        mb = allocated_mb(e)[0]
        assert abs(p.execution.segment_plan.template_bytes[key] / 2**20 - mb) <= 1.0
        checked += mb > 0
    assert checked >= 3
    sp = p.execution.segment_plan
    assert max(sp.template_bytes.values()) <= sp.pool_bytes <= sum(sp.template_bytes.values())
    assert sp.pool_bytes == sum(pool_blocks(sp.template_blocks))
    assert p.planned_bytes == sp.planned_bytes < p.baseline_bytes


@pytest.mark.parametrize("net", ["resnet", "lstm"])
def test_segment_graphs_equal_what_mxnet_reads_from_their_json(net, request) -> None:
    """Sub-graphs are built as Graph IR in the segment model's own node order; their
    simulated bytes must equal those of the graph MXNet itself reads back from the
    segment's symbol JSON (its shape inference, its node and argument order)."""
    from mxmirror.sim import memory_plan, training_graph

    _, _, prep = request.getfixturevalue(net)
    sg = segment_chain(prep.analysis).segments
    seen = {}
    for seg in sg.segments:
        if seg.structure in seen:  # templates of one structure have one graph
            continue
        mine = memory_plan.simulate(training_graph.build(seg.graph, set()))
        read = load_graph(seg.json, sg.slot_shapes[seg.key],
                                        type_dict=sg.slot_types[seg.key],
                                        grad_req=sg.slot_req[seg.key])
        theirs = memory_plan.simulate(training_graph.build(read, set()))
        seen[seg.structure] = (mine.total_bytes, mine.block_bytes) == (theirs.total_bytes,
                                                                 theirs.block_bytes)
    assert len(seen) >= 3 and all(seen.values())


# ------------------------------------------------------------ entry points
def test_budget_falls_back_to_multilevel(lstm) -> None:
    """The LSTM, whose recursive plan (20 KB) is far under sqrt's (117 KB); on the small
    ResNet fixture recursive is above sqrt and a budget never needs the fallback."""
    sym, shapes, prep = lstm
    rec = prep.own_plan("recursive")
    sq = prep.plan("sqrt")
    with pytest.raises(PlanError, match="any policy reaches"):
        prep.plan("budget", 1024)
    budget = int(rec.planned_bytes * 1.2)
    assert budget < sq.planned_bytes, "the fixture must have recursive well under sqrt"
    p = prep.plan("budget", budget)
    assert p.execution.kind == "segmented" and p.planned_bytes <= budget
    assert p.recompute_ratio <= rec.recompute_ratio + 1e-9
    with pytest.raises(PlanError, match=r"below the smallest planned memory any policy "
                                        r"reaches: \d+\.\d KB \(the multilevel plan"):
        prep.plan("budget", 1024)


def test_mxmirror_run_recursive(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import mxnet as mx, numpy as np, sys
        sys.path.insert(0, %r)
        from symbols.chain import conv_chain
        sym = conv_chain(64, 8)  # deep and narrow: the recursive plan is the smallest
        # (values large enough that it saves more than its recomputed nodes' structures)
        x = np.random.uniform(-1, 1, (64, 3, 16, 16)).astype(np.float32)
        y = np.random.randint(0, 10, 64).astype(np.float32)
        it = mx.io.NDArrayIter(x, y, batch_size=32, label_name="softmax_label")
        mod = mx.mod.Module(sym, context=mx.cpu())
        mod.fit(it, num_epoch=1, optimizer_params={"learning_rate": 0.1})
        print("EXECUTOR", type(mod._exec_group.execs[0]).__name__)
    """ % str(ROOT)))
    env = dict(os.environ, MXNET_SUBGRAPH_VERBOSE="0")
    proc = subprocess.run([sys.executable, "-m", "mxmirror", "run", "--policy", "recursive",
                           str(script)], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "EXECUTOR SegmentedExecutor" in proc.stdout
