"""The segmented executor used the way users train: BucketingModule, fit, score, 2 contexts.

Every case of issue 13's table, small: BucketingModules with buckets in every size order
(a deep CNN bucketed by image size, where the recursive plan wins, and the language model
of MXNet's bucketing example), ``Module.fit`` with eval data and metrics ``["acc", "ce"]``,
``score``, ``predict``, ``get_params``/``set_params``, ``save_checkpoint``, two contexts, the
plain ``Executor`` interface with a gradient for every argument (labels and data included),
and a segmented executor handed to MXNet's own bind as ``shared_exec``.

The reference is plain MXNet. With MKL-DNN on, MXNet's kernels (BatchNorm's reductions)
compute in another order when their input arrives in plain rather than blocked layout, and a
value crossing into a sub-executor always arrives in plain layout; so the reference is the
same graph with every value crossing a cut passed through ``clip(-3e38, 3e38)`` (no MKL-DNN
kernel: its output is plain). Equality is bitwise throughout; ``test_without_mkldnn`` reruns
the file in a child with ``MXNET_MKLDNN_ENABLED=0``, where the reference is the unchanged
graph, so nothing is added there.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from functools import partial
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

import mxmirror
from mxmirror.api import prepare
from mxmirror.ir.graph import resident_bytes
from mxmirror.planning.registry import STRATEGIES
from symbols.chain import conv_chain
from tests import mkldnn_off
from tests.helpers import assert_same, child_env

# the graphs are small: plans are bound whatever they save, to compare what they compute
pytestmark = pytest.mark.usefixtures("plans_bound_regardless")

ROOT = Path(__file__).resolve().parents[1]
MKLDNN = mkldnn_off.MKLDNN
BATCH, CLASSES = 4, 10
VOCAB, HIDDEN = 12, 8


# ------------------------------------------------------------------ networks
def deep_cnn():
    """Deep enough that the recursive plan is below every one-recompute plan."""
    return conv_chain(64, 8, CLASSES)


def lm(seq_len: int):
    """The language model of MXNet's example/rnn/bucketing (one LSTM layer)."""
    embed = mx.sym.Embedding(mx.sym.var("data"), input_dim=VOCAB, output_dim=HIDDEN,
                             name="embed")
    cell = mx.rnn.LSTMCell(num_hidden=HIDDEN, prefix="lstm_l0_")
    outputs, _ = cell.unroll(seq_len, inputs=embed, merge_outputs=True)
    pred = mx.sym.FullyConnected(mx.sym.reshape(outputs, shape=(-1, HIDDEN)),
                                 num_hidden=VOCAB, name="pred")
    label = mx.sym.reshape(mx.sym.var("softmax_label"), shape=(-1,))
    return mx.sym.SoftmaxOutput(pred, label=label, name="softmax")


def plain_at_cuts(sym, segment_plan):
    """`sym` with every value crossing a cut of the segment plan passed through clip: the
    whole graph with the sub-executors' plain layout at the boundaries (see module doc)."""
    sg = segment_plan.segments
    crossing = set().union(*sg.crossing[1:sg.m])
    seg_of = {nid: s.index for s in sg.segments for nid in s.nodes}
    data = json.loads(sym.tojson())
    nodes, new_id, clipped = [], {}, {}
    for i, nd in enumerate(data["nodes"]):
        nd = dict(nd)
        nd["inputs"] = [[*clipped[(s, k)], v] if (s, k) in clipped and
                        seg_of.get(i) != seg_of.get(s) else [new_id[s], k, v]
                        for s, k, v in nd["inputs"]]
        new_id[i] = len(nodes)
        nodes.append(nd)
        for k in sorted(k for s, k in crossing if s == i):
            nodes.append({"op": "clip", "name": f"_plain{i}_{k}", "inputs": [[new_id[i], k, 0]],
                          "attrs": {"a_min": "-3e38", "a_max": "3e38"}})
            clipped[(i, k)] = (len(nodes) - 1, 0)
    data["nodes"] = nodes
    data["arg_nodes"] = [j for j, n in enumerate(nodes) if n["op"] == "null"]
    data["heads"] = [[new_id[s], k, v] for s, k, v in data["heads"]]
    data.pop("node_row_ptr", None)
    return mx.sym.load_json(json.dumps(data))


def reference(sym, shapes, policy, budget=None, grad_req=None):
    """What plain MXNet must compute for the plan the hook makes (see module doc)."""
    req = grad_req or {a: ("null" if a in shapes else "write") for a in sym.list_arguments()}
    p = mxmirror.plan(sym, policy=policy, budget=budget, grad_req=req, **shapes)
    if p.execution.kind != "segmented" or not MKLDNN:
        return sym
    return plain_at_cuts(sym, p.execution.segment_plan)


def _params(sym, shapes, seed=3):
    rng = np.random.RandomState(seed)
    arg_shapes, _, aux_shapes = sym.infer_shape(**shapes)
    args = {n: mx.nd.array(rng.uniform(-0.3, 0.3, s)) for n, s in
            zip(sym.list_arguments(), arg_shapes) if n not in shapes}
    aux = {n: mx.nd.array(rng.uniform(0.5, 1.5, s) if "var" in n else rng.uniform(-.1, .1, s))
           for n, s in zip(sym.list_auxiliary_states(), aux_shapes)}
    return args, aux


def _same(a: dict, b: dict, what: str, shared_weights: bool = False) -> None:
    """Bitwise equal; with weights shared across segments (an unrolled LSTM), within
    4 ulp of the largest element: where a segment holds several of a weight's uses, the
    segmented executor cannot sum them in MXNet's own order (grad_sums), and float sums
    depend on the order (measured on the LM below: at most 0.25 ulp of the largest
    parameter)."""
    assert_same(a, b, what, partial(_equal, shared_weights=shared_weights))


def _equal(x, y, shared_weights: bool = False) -> bool:
    tol = 4 * np.finfo(np.float32).eps * np.abs(x).max() if shared_weights else 0.0
    return np.array_equal(x, y) or bool(np.abs(x - y).max() <= tol)


def _kinds(mod) -> set[str]:
    """Executor class names a (Bucketing)Module really bound."""
    mods = mod._buckets.values() if hasattr(mod, "_buckets") else [mod]
    return {type(e).__name__ for m in mods for e in m._exec_group.execs}


# ------------------------------------------------------------------ BucketingModule
def _bucket_batches(kind: str, order: list[int], seed: int = 5):
    rng = np.random.RandomState(seed)
    out = []
    for n in order:
        if kind == "cnn":
            dshape, lshape = (BATCH, 3, n, n), (BATCH,)
            x = rng.uniform(-1, 1, dshape)
            y = rng.randint(0, CLASSES, lshape)
        else:
            dshape = lshape = (BATCH, n)
            x, y = rng.randint(0, VOCAB, dshape), rng.randint(0, VOCAB, lshape)
        out.append(mx.io.DataBatch([mx.nd.array(x)], [mx.nd.array(y)], bucket_key=n,
                                   provide_data=[mx.io.DataDesc("data", dshape)],
                                   provide_label=[mx.io.DataDesc("softmax_label", lshape)]))
    return out


def _shapes(kind: str, n: int) -> dict:
    if kind == "cnn":
        return {"data": (BATCH, 3, n, n), "softmax_label": (BATCH,)}
    return {"data": (BATCH, n), "softmax_label": (BATCH, n)}


def _train_bucketing(kind, default, order, gen):
    mod = mx.mod.BucketingModule(lambda n: (gen(n), ("data",), ("softmax_label",)),
                                 default_bucket_key=default, context=mx.cpu())
    shapes = _shapes(kind, default)
    mod.bind(data_shapes=[("data", shapes["data"])],
             label_shapes=[("softmax_label", shapes["softmax_label"])])
    args, aux = _params(gen(default), shapes)
    mod.set_params(args, aux)
    mod.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 0.5})
    outs = []
    for batch in _bucket_batches(kind, order):
        mod.forward(batch, is_train=True)
        outs.append(mod.get_outputs()[0].asnumpy())
        mod.backward()
        mod.update()
    mx.nd.waitall()
    return mod, outs


ORDERS = [("cnn", 8, [8, 6, 7, 8]), ("cnn", 8, [6, 7, 8]), ("cnn", 6, [6, 8, 7]),
          ("lm", 16, [16, 8, 12, 4]), ("lm", 16, [4, 8, 12, 16]), ("lm", 8, [8, 16, 4, 12])]


@pytest.mark.parametrize("kind,default,order,policy,budget",
                         [(*o, "recursive", None) for o in ORDERS] +
                         [(*o, "multilevel", "150KB") for o in ORDERS if o[1:] != (8, [6, 7, 8])
                          and o[1:] != (6, [6, 8, 7])])
def test_bucketing_every_size_order(kind, default, order, policy, budget) -> None:
    net = deep_cnn if kind == "cnn" else lm
    base, base_outs = _train_bucketing(
        kind, default, order, lambda n: reference(net(n) if kind == "lm" else net(),
                                                  _shapes(kind, n), policy, budget))
    with mxmirror.enabled(policy, budget):
        planned, outs = _train_bucketing(kind, default, order,
                                         lambda n: net(n) if kind == "lm" else net())
    if kind == "cnn":  # the recursive plan wins on every bucket of the deep CNN
        assert "SegmentedExecutor" in _kinds(planned)
        assert policy != "recursive" or _kinds(planned) == {"SegmentedExecutor"}
    # the LM's recursive plans sum its shared weights in MXNet's order (grad_sums); the
    # budget's coarser segments hold several steps' uses, summed in another order
    shared = kind == "lm" and policy == "multilevel"
    for a, b in zip(base_outs, outs):
        assert _equal(a, b, shared_weights=shared)
    _same(base.get_params()[0], planned.get_params()[0], "parameters", shared_weights=shared)
    _same(base.get_params()[1], planned.get_params()[1], "BatchNorm statistics")


# ------------------------------------------------------------------ Module fit / score
def _data(n, seed):
    rng = np.random.RandomState(seed)
    return (rng.uniform(-1, 1, (n, 3, 8, 8)).astype(np.float32),
            rng.randint(0, CLASSES, n).astype(np.float32))


def _fit(sym, ctx, tmp_path=None):
    b = BATCH * len(ctx)
    it = mx.io.NDArrayIter(*_data(4 * b, 1), batch_size=b, label_name="softmax_label")
    val = mx.io.NDArrayIter(*_data(2 * b, 2), batch_size=b, label_name="softmax_label")
    mod = mx.mod.Module(sym, context=ctx)
    args, aux = _params(sym, {"data": (b, 3, 8, 8), "softmax_label": (b,)})
    mod.fit(it, eval_data=val, eval_metric=["acc", "ce"], num_epoch=2, arg_params=args,
            aux_params=aux, optimizer_params={"learning_rate": 0.1})
    score = dict(mod.score(val, ["acc", "ce"]))
    pred = mod.predict(val).asnumpy()
    if tmp_path is not None:
        mod.save_checkpoint(str(tmp_path / "ck"), 2)
    mx.nd.waitall()
    return mod, score, pred


@pytest.mark.parametrize("nctx", [1, 2])
@pytest.mark.parametrize("policy,budget", [("recursive", None), ("multilevel", "150KB")])
def test_fit_score_predict_checkpoint(policy, budget, nctx, tmp_path) -> None:
    ctx = [mx.cpu(i) for i in range(nctx)]
    shapes = {"data": (BATCH, 3, 8, 8), "softmax_label": (BATCH,)}  # per context
    with mxmirror.enabled("none"):  # plain MXNet's BatchNorm race (docs/long_run.md) would
        # leave the reference's statistics stale now and then; "none" binds it unplanned, ordered
        base, base_score, base_pred = _fit(reference(deep_cnn(), shapes, policy, budget), ctx)
    with mxmirror.enabled(policy, budget):
        mod, score, pred = _fit(deep_cnn(), ctx, tmp_path)
    assert _kinds(mod) == {"SegmentedExecutor"}
    assert np.array_equal(base_pred, pred)
    assert base_score == score
    args, aux = mod.get_params()
    _same(base.get_params()[0], args, "parameters after fit")
    _same(base.get_params()[1], aux, "BatchNorm statistics after fit")
    _, args2, aux2 = mx.model.load_checkpoint(str(tmp_path / "ck"), 2)
    _same(args, args2, "saved parameters")
    _same(aux, aux2, "saved statistics")
    # set_params reaches the executors: predicting again gives the reference's prediction
    base.set_params(*_params(deep_cnn(), shapes, seed=8), force_init=True)
    mod.set_params(*_params(deep_cnn(), shapes, seed=8), force_init=True)
    val = mx.io.NDArrayIter(*_data(2 * BATCH * nctx, 2), batch_size=BATCH * nctx)
    assert np.array_equal(base.predict(val).asnumpy(), mod.predict(val).asnumpy())


# ------------------------------------------------------------------ Executor interface
def _exec_steps(ex, args, aux, data, steps=2):
    for k, v in args.items():
        ex.arg_dict[k][:] = v
    for k, v in aux.items():
        ex.aux_dict[k][:] = v
    seen = []
    for _ in range(steps):
        for k, v in data.items():
            ex.arg_dict[k][:] = v
        ex.forward(is_train=True)
        ex.backward()
        mx.nd.waitall()
        seen.append(({k: g.copy() for k, g in ex.grad_dict.items()},
                     [o.copy() for o in ex.outputs],
                     {k: a.copy() for k, a in ex.aux_dict.items()}))
        for k in args:
            ex.arg_dict[k][:] -= 0.1 * ex.grad_dict[k]
    return seen


def _zoo(name):
    from mxnet.gluon.model_zoo import vision

    block = vision.get_model(name, classes=CLASSES)
    block.initialize()
    block.hybridize()
    return mx.sym.SoftmaxOutput(block(mx.sym.var("data")), name="softmax")


@pytest.mark.parametrize("net", ["cnn", "resnet18_v2"])
def test_executor_every_gradient(net) -> None:
    """grad_req write for every argument (labels and data too): all of grad_dict, outputs
    and aux_dict equal over two steps; the label's gradient stays what MXNet leaves it."""
    from mxmirror.runtime.segmented.executor import SegmentedExecutor

    if net == "cnn":
        sym, shapes = deep_cnn(), {"data": (BATCH, 3, 8, 8), "softmax_label": (BATCH,)}
    else:
        sym, shapes = _zoo(net), {"data": (2, 3, 32, 32), "softmax_label": (2,)}
    prep = prepare(sym, grad_req={a: "write" for a in sym.list_arguments()}, **shapes)
    sp = STRATEGIES["recursive"](prep.analysis, None).segments  # whatever the hook would bind
    args, aux = _params(sym, shapes)
    rng = np.random.RandomState(9)
    data = {"data": rng.uniform(-1, 1, shapes["data"]),
            "softmax_label": rng.randint(0, CLASSES, shapes["softmax_label"])}
    ref_sym = plain_at_cuts(sym, sp) if MKLDNN else sym
    ref = ref_sym.simple_bind(mx.cpu(), grad_req="write", **shapes)
    ex = SegmentedExecutor(sym, mx.cpu(), sp)
    for step, (a, b) in enumerate(zip(_exec_steps(ref, args, aux, data),
                                      _exec_steps(ex, args, aux, data))):
        _same(a[0], b[0], f"gradients at step {step}")
        assert all(np.array_equal(x.asnumpy(), y.asnumpy()) for x, y in zip(a[1], b[1]))
        _same(a[2], b[2], f"aux states at step {step}")


def test_segmented_executor_as_shared_exec() -> None:
    """A SegmentedExecutor handed to an unplanned bind as shared_exec (a BucketingModule
    whose default bucket was planned): MXNet's own executor, sharing its parameters."""
    sym = deep_cnn()
    shapes = {"data": (BATCH, 3, 8, 8), "softmax_label": (BATCH,)}
    seg = mxmirror.simple_bind(sym, mx.cpu(), policy="recursive", **shapes)
    assert type(seg).__name__ == "SegmentedExecutor"
    params = [n for n in sym.list_arguments() if n not in shapes]
    small = {"data": (BATCH, 3, 4, 4), "softmax_label": (BATCH,)}
    ex = sym.simple_bind(mx.cpu(), shared_exec=seg, shared_arg_names=params,
                         shared_buffer={}, **small)
    assert isinstance(ex, mx.executor.Executor)
    assert all(ex.arg_dict[n] is seg.arg_dict[n] or
               ex.arg_dict[n].handle.value == seg.arg_dict[n].handle.value for n in params)
    seg.arg_dict["fc_bias"][:] = 7
    assert (ex.arg_dict["fc_bias"].asnumpy() == 7).all()


# ------------------------------------------------------------------ never worse
def test_never_worse_than_one_recompute_or_none(caplog) -> None:
    """Where the segmented plan saves nothing over a one-recompute plan (a shallow net) the
    hook binds that plan instead, and where nothing is worth recomputing, plainly; the log
    line says which and why."""
    shallow = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4,
                                                         name="fc"), name="softmax")
    shapes = {"data": (BATCH, 6), "softmax_label": (BATCH,)}
    log = logging.getLogger("mxmirror")
    log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="mxmirror"):
            ex = mxmirror.simple_bind(shallow, mx.cpu(), policy="recursive", **shapes)
    finally:
        log.removeHandler(caplog.handler)
    assert isinstance(ex, mx.executor.Executor)
    assert "recursive" in caplog.text and "no plan is used" in caplog.text
    # 8 steps: the segmented plan is not below the one-recompute plan (at 16 steps, with
    # each step's h = o * tanh(c) joined to its step, it is: chains.MIN_OPS)
    p = mxmirror.plan(lm(8), policy="recursive", **_shapes("lm", 8))
    assert p.execution.kind == "mirror" and p.recomputed_ids
    # what is used first, then why; nothing on the plan not used
    assert p.notes[0].startswith("the one-recompute plan is used: the segmented plan ("), p.notes
    assert not [n for n in p.notes if "runs at most" in n], p.notes


# ------------------------------------------------------------------ measured as a whole
@pytest.mark.parametrize("policy,budget", [("recursive", None), ("multilevel", "150KB")])
def test_memory_reports_the_whole_plan(policy, budget, tmp_path) -> None:
    """`mxmirror memory --json` reports, as MXNet's planned figure of a segmented plan,
    every array the bound executor holds (measured in a child), within 5% of the
    prediction; a real step's kept values equal the dry run's."""
    sym = deep_cnn()
    sym.save(str(tmp_path / "net.json"))
    cmd = [sys.executable, "-m", "mxmirror", "memory", str(tmp_path / "net.json"),
           "--shape", "data=4,3,8,8", "--shape", "softmax_label=4", "--policy", policy,
           "--json"] + (["--budget", budget] if budget else [])
    # twice on a cache of its own: planned, then the kept plan read back (rebuilt from its
    # cuts and tree) and measured in its child the same
    env = child_env(MXMIRROR_CACHE=str(tmp_path / "cache"))
    runs = [subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
            for _ in range(2)]
    for proc in runs:
        assert proc.returncode == 0, proc.stderr[-2000:]
    first, out = (json.loads(proc.stdout.strip().splitlines()[-1]) for proc in runs)
    assert out == first, (first, out)
    measured, predicted = out["mxnet_mb"]["planned"], out["simulated_mb"]["planned"]
    assert measured > 0 and abs(predicted - measured) <= 0.05 * measured
    assert out["segmented_mb"]["measured_mb"]["total"] == measured
    p = mxmirror.plan(sym, policy=policy, budget=budget, **_shapes("cnn", 8))
    stepped = p.execution.measure(p, steps=1)
    assert stepped["measured_mb"] == out["segmented_mb"]["measured_mb"]
    # the user's arrays (what `mxmirror fit` adds to the plan's figure) as predicted
    user_mb = sum(resident_bytes(p.analysis.graph)) / 2**20
    assert user_mb > 0 and abs(stepped["user_mb"] - user_mb) < 1e-3
    pool_mb = stepped["measured_mb"]["pool"]
    assert max(stepped["template_mxnet_mb"]) <= pool_mb + 1  # each drawn from the pool


# ------------------------------------------------------------------ without MKL-DNN
# the cases where MKL-DNN or its absence matters (in-place weight reorders, layouts), the
# label's gradient, and a bucket of every kind (the planning is the same in both)
CHILD = "executor or (fit and recursive) or (bucketing and recursive and order0)"


def test_without_mkldnn() -> None:
    """The cases above in a child with MXNET_MKLDNN_ENABLED=0 (read at process start)."""
    if not MKLDNN:
        pytest.skip("already the child")
    mkldnn_off.run_pytest(__file__, CHILD)
