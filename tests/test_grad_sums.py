"""A shared weight's gradient summed as MXNet sums it (grad_sums.py).

Checked against MXNet itself: the modelled expression of MXNet's gradient aggregation for
1-9 uses of one weight, evaluated in float32, equals MXNet's whole-graph gradient bit for
bit (MKL-DNN off, where ElementWiseSum is MXNet's own kernel); a variable per use, all
bound to one weight and one gradient array (grad_req add), sums as the model says, in
the write order it reads off the training graph; the segmented executor, on every chain
the multi-level DP runs on, gives every weight the model calls exact the unplanned run's
gradient bit for bit (MKL-DNN off and on), adds in place wherever that stays exact (with
a slot per use where a segment holds several), and the weights the model calls inexact
do differ: the slot path stays there, and the planner runs no such chain (dp.chains).
In-place weights hold no gradient slot (measured).
"""

from __future__ import annotations

import ctypes

import mxnet as mx
import numpy as np
from test_onelevel import _fill, _nets

from mxmirror.api import prepare
from mxmirror.planning import dp
from mxmirror.runtime.segmented.executor import SegmentedExecutor
from mxmirror.segments.cost import make_segment_plan
from mxmirror.segments.grad_sums import _contributions, _into
from mxmirror.segments.schedule import store_all_tree
from tests import mkldnn_off

MKLDNN = mkldnn_off.MKLDNN


def _uses(k: int, shared: bool):
    """k FullyConnected layers on k inputs, all on weight `w` (or w0..w{k-1}), summed."""
    out, one = None, mx.sym.Variable("w")
    for i in range(k):
        w = one if shared else mx.sym.Variable(f"w{i}")
        y = mx.sym.FullyConnected(mx.sym.Variable(f"x{i}"), w, no_bias=True, num_hidden=8,
                                  name=f"fc{i}")
        out = y if out is None else out + y
    return out


def check_model_is_mxnets_sum() -> None:
    """MXNet's gradient of a weight used k = 1..9 times equals the modelled expression over
    the k contributions (each bound on its own variable), evaluated in float32. With MKL-DNN
    off only (MKL-DNN sums with its own kernel): test_without_mkldnn runs it in a child."""
    for k in range(1, 10):
        _check_sum(k)


def _check_sum(k: int) -> None:
    shapes = {f"x{i}": (5, 7) for i in range(k)}
    sym, apart = _uses(k, True), _uses(k, False)
    rng = np.random.RandomState(k)
    x = {n: rng.uniform(-1, 1, s) for n, s in shapes.items()}
    w = rng.uniform(-1, 1, (8, 7))
    head = mx.nd.array(rng.uniform(-1, 1, (5, 8)))
    grads = []
    for s, names in ((sym, ["w"]), (apart, [f"w{i}" for i in range(k)])):
        ex = s.simple_bind(mx.cpu(), grad_req={n: "write" if n in names else "null"
                                               for n in s.list_arguments()}, **shapes)
        for n, v in x.items():
            ex.arg_dict[n][:] = v
        for n in names:
            ex.arg_dict[n][:] = w
        ex.forward(is_train=True)
        ex.backward(head)
        grads.append({n: ex.grad_dict[n].asnumpy() for n in names})
    graph = prepare(sym, **shapes).analysis.graph
    var = graph.by_name()["w"].id
    leaf = {(graph.by_name()[f"fc{i}"].id, 1): grads[1][f"w{i}"] for i in range(k)}
    expr = _into(None, _contributions(graph, graph.forward_order)[var], graph, 8)
    assert np.array_equal(_evaluate(expr, leaf), grads[0]["w"])


def _evaluate(expr, leaf: dict) -> np.ndarray:
    if expr[0] == "+":
        return (_evaluate(expr[1], leaf) + _evaluate(expr[2], leaf)).astype(np.float32)
    return leaf[expr]


def _net(k: int, split: bool, chain: bool):
    """k FullyConnected uses of one weight and bias (`split`: a variable per use, w0.. and
    b0..): a recurrence h = tanh(FC(h)) (`chain`), or k inputs each through FC, summed (no
    use's backward waits for another's)."""
    w, b, x, out = mx.sym.Variable("w"), mx.sym.Variable("b"), mx.sym.Variable("x"), None
    for i in range(k):
        wi, bi = (mx.sym.Variable(f"w{i}"), mx.sym.Variable(f"b{i}")) if split else (w, b)
        y = mx.sym.tanh(mx.sym.FullyConnected(x if chain else mx.sym.Variable(f"x{i}"), wi, bi,
                                              num_hidden=8, name=f"fc{i}"))
        x, out = y, (y if out is None else out + y)
    return mx.sym.MakeLoss(mx.sym.sum((x if chain else out) ** 2))


def test_uses_added_in_place() -> None:
    """A variable per use, each bound to the one weight array and, with grad_req add, to
    the one gradient array (what a template with a slot per use does): MXNet accepts it,
    each use's backward adds its term onto the array in the order the template's training
    graph runs them (grad_sums._writers), and the result is MXNet's own sum of the shared
    weight exactly where the modelled expressions agree, bit for bit with MKL-DNN off;
    with it on, wherever the model says exact. Both orders occur: the write order is not
    always the one MXNet's sum needs, and the model sees which."""
    from mxmirror.segments.grad_sums import _writers

    agree = []
    for chain in (True, False):
        for k in range(1, 10):
            whole, apart = _net(k, False, chain), _net(k, True, chain)
            shapes = {"x": (6, 8)} if chain else {f"x{i}": (6, 8) for i in range(k)}
            rng = np.random.RandomState(k)
            feed = {n: mx.nd.array(rng.uniform(-1, 1, s)) for n, s in shapes.items()}
            w, b = mx.nd.array(rng.uniform(-.5, .5, (8, 8))), mx.nd.array(rng.uniform(-1, 1, 8))
            ref = whole.bind(mx.cpu(), dict(feed, w=w, b=b), args_grad={
                "w": mx.nd.zeros((8, 8)), "b": mx.nd.zeros(8)}, grad_req={
                "w": "write", "b": "write", **dict.fromkeys(shapes, "null")})
            gw, gb = mx.nd.zeros((8, 8)), mx.nd.zeros(8)
            ex = apart.bind(mx.cpu(), dict(feed, **{f"w{i}": w for i in range(k)},
                                           **{f"b{i}": b for i in range(k)}),
                            args_grad={**{f"w{i}": gw for i in range(k)},
                                       **{f"b{i}": gb for i in range(k)}},
                            grad_req={**{f"w{i}": "add" for i in range(k)},
                                      **{f"b{i}": "add" for i in range(k)},
                                      **dict.fromkeys(shapes, "null")})
            for e in (ref, ex):
                e.forward(is_train=True)
                e.backward()
            graph = prepare(whole, **shapes).analysis.graph
            sub = prepare(apart, **shapes).analysis.graph
            writers = _writers(sub, f"test {chain} {k}")
            for name, got in (("w", gw), ("b", gb)):
                j = 1 if name == "w" else 2
                v = _contributions(graph, graph.forward_order)[graph.by_name()[name].id]
                ids = {graph.nodes[c].name: c for c, _ in v}
                acc = None
                for i in sorted(range(k), key=lambda i: writers[f"{name}{i}"]):
                    acc = _into(acc, [(ids[f"fc{i}"], j)], graph, 8)
                exact = acc == _into(None, v, graph, 8)
                same = np.array_equal(got.asnumpy(), ref.grad_dict[name].asnumpy())
                assert same or not exact, (chain, k, name)
                if not MKLDNN and name == "w":  # 8 bias sums may round alike by chance
                    assert same == exact, (chain, k, name)
                agree.append((chain, k, name, exact))
    # a chain's backward writes its last use first, as MXNet's sum wants it from 5 uses
    # on; the summed branches are written first use first, which suits 3-4 uses
    # (ElementWiseSum's right-to-left sum), not 5 or more
    assert {(c, k) for c, k, _, e in agree if not e} == \
        {(True, 3), (True, 4)} | {(False, k) for k in range(5, 10)}


def _every_chain(prep):
    """Store-all plans of every chain the DP considers, those the planner then drops for
    their sums (dp.chains keeps the exact ones) included."""
    a = prep.analysis
    for cuts in dp.cut_sets(a):
        sg = make_segment_plan(a.graph, cuts).segments
        yield make_segment_plan(a.graph, sg.cuts, store_all_tree(sg.m), sg=sg)


def test_lstm_weights_sum_like_mxnet() -> None:
    """Store-all over every DP chain of a 2-layer LSTM (8 steps, weights shared by every
    step): every weight the model calls exact is bitwise the unplanned gradient (MKL-DNN on
    and off), those with several uses in a segment too, through a slot per use; the
    weights called inexact differ (MKL-DNN off)."""
    from mxmirror.segments.grad_sums import weight_sums

    sym, shapes = _nets()["lstm"]
    prep = prepare(sym, **shapes)
    req = {a: ("null" if a in shapes else "write") for a in sym.list_arguments()}
    kinds, split = set(), set()
    for sp in _every_chain(prep):
        sums = weight_sums(sp.segments)
        ref = sym.simple_bind(mx.cpu(), grad_req=req, **shapes)
        ex = SegmentedExecutor(sym, mx.cpu(), sp)
        _fill(sym, shapes, [ref, ex])
        for e in (ref, ex):
            mx.random.seed(11)
            e.forward(is_train=True)
            e.backward()
        for name, (slots, exact) in sums.items():
            same = np.array_equal(ref.grad_dict[name].asnumpy(), ex.grad_dict[name].asnumpy())
            assert same or not exact, (sp.segments.m, name)
            if not MKLDNN:
                assert same == exact, (sp.segments.m, name)
            kinds.add((bool(slots), exact))
            per_use = {n for seg in sp.segments.segments for n, k in seg.slots
                       if k[1:2] == (name,) and len(k) == 3}
            if per_use and slots:  # a slot per use, all added in place
                split.add(name)
        for name, g in ref.grad_dict.items():  # the rest (inputs without gradient here)
            if g is not None and name not in sums:
                assert np.array_equal(g.asnumpy(), ex.grad_dict[name].asnumpy()), name
    assert kinds == {(True, True), (False, False)}
    assert len(split) == len(sums)  # every weight, on some chain
    # the planner runs none of the chains whose weights are inexact
    kept = dp.chains(prep.analysis)
    assert kept and all(c.segments.exact for c in kept)
    assert len(kept) < len(dp.cut_sets(prep.analysis))


def test_resnet_weights_in_place() -> None:
    """A ResNet's weights each have one use: every weight of a template bound to the user's
    arrays is added in place, and is exact."""
    from mxmirror.segments.grad_sums import weight_sums

    sym, shapes = _nets()["resnet"]
    sp = next(_every_chain(prepare(sym, **shapes)))
    sums = weight_sums(sp.segments)
    assert all(exact for _, exact in sums.values())
    assert any(slots for slots, _ in sums.values())
    bound = {(k, n) for slots, _ in sums.values() for k, n in slots}
    assert bound == set(sp.segments.grad_slots) and bound <= sp.segments.user_slots


def test_without_mkldnn() -> None:
    """The model, and the LSTM's and shared uses' sums, with MKL-DNN off (a child)."""
    mkldnn_off.run_code("import sys; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/tests']\n"
                        "from tests import test_grad_sums as t\n"
                        "t.check_model_is_mxnets_sum()\n"
                        "t.test_uses_added_in_place()\n"
                        "t.test_lstm_weights_sum_like_mxnet()\n"
                        "print('ok')")


def test_in_place_gradients_have_no_slot() -> None:
    """A template that adds a weight's gradient in place binds the user's own gradient
    memory; no gradient slot is predicted or allocated for it, and the whole plan is
    measured as predicted (in a child: every array the executor holds)."""
    from mxmirror.runtime.segmented.measure import measure

    sym, shapes = _nets()["lstm"]
    prep = prepare(sym, **shapes)
    sp = next(_every_chain(prep))
    sg = sp.segments
    assert sg.grad_slots
    r = measure(sp, prep.source_json)
    assert abs(r["measured_mb"]["slots"] - r["predicted_mb"]["slots"]) < 0.01
    ex = SegmentedExecutor(sym, mx.cpu(), sp)
    assert not any("grad of " + n in ex.templates.slot_buffer for _, n in sg.grad_slots)
    for seg in sg.segments:
        for n, key in seg.slots:
            if (seg.key, n) in sg.grad_slots:
                assert _data(ex.executors[seg.key].grad_dict[n]) == _data(ex.grad_dict[key[1]])


def _data(a) -> int:
    p = ctypes.c_void_p()
    mx.base._LIB.MXNDArrayGetData(a.handle, ctypes.byref(p))
    return p.value
