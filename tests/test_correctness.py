"""A planned symbol must train exactly like the unplanned one.

For every policy and five graphs (two CIFAR ResNets with BatchNorm, the
paper's unrolled LSTM with Dropout, a hand-made Inception/DenseNet-like graph
with Concat and BatchNorm, an exported Gluon model-zoo network) the unplanned
symbol and ``plan.symbol`` are bound with identical argument and auxiliary
values and trained a few steps (forward(is_train=True), backward, and a plain
SGD update done by hand on both, so the parameters evolve).  Outputs,
gradients and auxiliary states (BatchNorm moving mean/var) must be bitwise
equal at every step, with MKL-DNN on and (``test_without_mkldnn``, a child)
off: the mirror path runs MXNet's own kernels on the same values.  The
planned executor must really recompute (``_mirror`` nodes in ``debug_str()``),
Dropout must never be mirrored, and planned memory must not exceed the
baseline.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

import mxmirror
from mxmirror.adapter.children import allocated_mb
from mxmirror.planning.registry import ALIASES
from symbols.lstm import input_shapes, paper_lstm
from symbols.resnet import resnet, resnet_by_depth
from tests import mkldnn_off

POLICIES = ("none", "cheap", "sqrt", "optimal", "budget")
MUST_RECOMPUTE = ("sqrt", "optimal", "budget")
STEPS = 3
LR = 0.05


@dataclass
class Case:
    sym: mx.sym.Symbol
    shapes: dict[str, tuple[int, ...]]
    int_inputs: dict[str, int]  # integer-valued inputs (labels) -> number of classes
    has_dropout: bool = False


# ------------------------------------------------------------------ graphs
def _resnet_case(_tmp: Path) -> Case:
    sym = resnet_by_depth(8, bottleneck=False, num_classes=10, image_shape=(3, 32, 32))
    return Case(sym, {"data": (4, 3, 32, 32), "softmax_label": (4,)}, {"softmax_label": 10})


def _deep_resnet_case(_tmp: Path) -> Case:
    """78 units: stages long enough (24+ candidate cuts) for optimal's taper search, which
    changes this plan (238656 against 246784 bytes without it)."""
    sym = resnet([26, 26, 26], bottleneck=False, num_classes=10, image_shape=(3, 8, 8))
    return Case(sym, {"data": (2, 3, 8, 8), "softmax_label": (2,)}, {"softmax_label": 10})


def _lstm_case(_tmp: Path) -> Case:
    seq_len, layers, hidden, size = 5, 2, 16, 12
    sym = paper_lstm(seq_len, num_layers=layers, num_hidden=hidden, num_embed=16,
                     input_size=size, num_classes=10, dropout=0.5)
    shapes = input_shapes(seq_len, 4, num_layers=layers, num_hidden=hidden, input_size=size)
    labels = {f"t{t}_label": 10 for t in range(seq_len)}
    return Case(sym, shapes, labels, has_dropout=True)


def _conv_bn_relu(x, num_filter, kernel, name):
    pad = (kernel[0] // 2, kernel[1] // 2)
    x = mx.sym.Convolution(x, num_filter=num_filter, kernel=kernel, pad=pad, no_bias=True,
                           name=f"{name}_conv")
    x = mx.sym.BatchNorm(x, fix_gamma=False, name=f"{name}_bn")
    return mx.sym.Activation(x, act_type="relu", name=f"{name}_relu")


def _multibranch_case(_tmp: Path) -> Case:
    """Two Inception blocks (4 branches, Concat) then a dense block (Concat of all)."""
    x = _conv_bn_relu(mx.sym.Variable("data"), 8, (3, 3), "stem")
    for b in range(2):
        p = f"inc{b}"
        b1 = _conv_bn_relu(x, 4, (1, 1), f"{p}_b1")
        b2 = _conv_bn_relu(_conv_bn_relu(x, 4, (1, 1), f"{p}_b2a"), 6, (3, 3), f"{p}_b2b")
        b3 = _conv_bn_relu(_conv_bn_relu(x, 2, (1, 1), f"{p}_b3a"), 4, (5, 5), f"{p}_b3b")
        b4 = mx.sym.Pooling(x, kernel=(3, 3), stride=(1, 1), pad=(1, 1), pool_type="max",
                            name=f"{p}_pool")
        b4 = _conv_bn_relu(b4, 4, (1, 1), f"{p}_b4")
        x = mx.sym.Concat(b1, b2, b3, b4, dim=1, name=f"{p}_concat")
    feats = [x]
    for layer in range(3):
        inp = feats[0] if len(feats) == 1 else mx.sym.Concat(*feats, dim=1,
                                                            name=f"dense{layer}_in")
        feats.append(_conv_bn_relu(inp, 4, (3, 3), f"dense{layer}"))
    x = mx.sym.Concat(*feats, dim=1, name="dense_out")
    x = mx.sym.Pooling(x, global_pool=True, kernel=(1, 1), pool_type="avg", name="gap")
    x = mx.sym.FullyConnected(mx.sym.Flatten(x, name="flat"), num_hidden=10, name="fc")
    sym = mx.sym.SoftmaxOutput(x, name="softmax")
    return Case(sym, {"data": (4, 3, 16, 16), "softmax_label": (4,)}, {"softmax_label": 10})


def _gluon_case(tmp: Path) -> Case:
    """resnet18_v1 from the model zoo, hybridized and exported, plus SoftmaxOutput."""
    net = mx.gluon.model_zoo.vision.get_model("resnet18_v1", pretrained=False, classes=10)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, 3, 32, 32)))
    prefix = str(tmp / "resnet18_v1")
    net.export(prefix, epoch=0)
    body = mx.sym.load(prefix + "-symbol.json")
    sym = mx.sym.SoftmaxOutput(body, name="softmax")
    return Case(sym, {"data": (2, 3, 32, 32), "softmax_label": (2,)}, {"softmax_label": 10})


GRAPHS = {"resnet": _resnet_case, "deep_resnet": _deep_resnet_case, "lstm": _lstm_case,
          "multibranch": _multibranch_case, "gluon": _gluon_case}


# ------------------------------------------------------------------ training
def _init_values(sym: mx.sym.Symbol, case: Case, seed: int = 0) -> tuple[dict, dict]:
    """Seeded numpy values for every argument and auxiliary state."""
    arg_shapes, _, aux_shapes = sym.infer_shape(**case.shapes)
    rng = np.random.RandomState(seed)
    args = {}
    for name, shape in zip(sym.list_arguments(), arg_shapes):
        if name in case.int_inputs:
            args[name] = rng.randint(0, case.int_inputs[name], shape).astype(np.float32)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            scale = 1.0 if name in case.shapes else np.sqrt(3.0 / max(fan_in, 1))
            args[name] = rng.uniform(-scale, scale, shape).astype(np.float32)
    aux = {}
    for name, shape in zip(sym.list_auxiliary_states(), aux_shapes):
        lo, hi = (0.5, 1.5) if "var" in name else (-0.1, 0.1)
        aux[name] = rng.uniform(lo, hi, shape).astype(np.float32)
    return args, aux


def _train(sym: mx.sym.Symbol, case: Case, values: tuple[dict, dict]):
    """Bind, set the values, train STEPS steps; returns (executor, per-step records)."""
    req = {a: ("null" if a in case.shapes else "write") for a in sym.list_arguments()}
    ex = sym.simple_bind(mx.cpu(), grad_req=req, **case.shapes)
    args, aux = values
    for name, arr in ex.arg_dict.items():
        arr[:] = args[name]
    for name, arr in ex.aux_dict.items():
        arr[:] = aux[name]
    records = []
    mx.random.seed(1234)  # the same Dropout masks in both runs
    for _ in range(STEPS):
        ex.forward(is_train=True)
        ex.backward()
        mx.nd.waitall()  # BatchNorm's running-stat update is not engine-tracked as a write
        records.append({
            "outputs": [o.asnumpy() for o in ex.outputs],
            "grads": {k: g.asnumpy() for k, g in ex.grad_dict.items() if g is not None},
            "aux": {k: a.asnumpy() for k, a in ex.aux_dict.items()},
        })
        for name, grad in ex.grad_dict.items():
            if grad is not None:
                ex.arg_dict[name][:] = ex.arg_dict[name] - LR * grad
    records.append({"params": {k: a.asnumpy() for k, a in ex.arg_dict.items()}})
    return ex, records


def _mismatches(base: list[dict], planned: list[dict]) -> list[str]:
    bad = []
    for step, (b, p) in enumerate(zip(base, planned)):
        for kind in ("outputs", "grads", "aux", "params"):
            if kind not in b:
                continue
            items = (enumerate(b[kind]) if isinstance(b[kind], list) else b[kind].items())
            for key, want in items:
                got = p[kind][key]
                if got.shape != want.shape or not np.array_equal(got, want):
                    diff = np.abs(got - want).max() if got.shape == want.shape else "shape"
                    bad.append(f"step {step} {kind} {key}: max |diff| {diff}")
    return bad


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def baselines(tmp_path_factory):
    """Per graph: the case, its initial values and the unplanned run (computed once)."""
    cache = {}

    def get(name: str):
        if name not in cache:
            case = GRAPHS[name](tmp_path_factory.mktemp(name))
            values = _init_values(case.sym, case)
            ex, records = _train(case.sym, case, values)
            sqrt_plan = mxmirror.plan(case.sym, policy="sqrt", **case.shapes)
            cache[name] = (case, values, records, sum(allocated_mb(ex)), sqrt_plan)
        return cache[name]

    return get


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("graph", list(GRAPHS))
def test_planned_training_matches_unplanned(graph: str, policy: str, baselines) -> None:
    case, values, base_records, base_mb, sqrt_plan = baselines(graph)
    budget = None
    if policy == "budget":
        assert sqrt_plan.planned_bytes < sqrt_plan.baseline_bytes, "sqrt plan saves nothing"
        budget = (sqrt_plan.planned_bytes + sqrt_plan.baseline_bytes) // 2
    plan = mxmirror.plan(case.sym, policy=policy, budget=budget, **case.shapes)

    assert plan.policy == ALIASES.get(policy, policy)
    if budget is not None:
        assert plan.planned_bytes <= budget
    if policy == "none":
        assert plan.mirrored == []
    if policy in MUST_RECOMPUTE:
        assert plan.mirrored, f"{policy} mirrored nothing on {graph}"

    # Dropout is never recomputed: neither in the plan nor in the symbol's attributes.
    nodes = json.loads(plan.symbol.tojson())["nodes"]
    dropouts = {n["name"] for n in nodes if n["op"] == "Dropout"}
    assert bool(dropouts) == case.has_dropout
    assert not dropouts & set(plan.mirrored)
    forced = {n["name"] for n in nodes
              if (n.get("attrs") or n.get("attr") or {}).get("__force_mirroring__") == "True"}
    assert forced == set(plan.mirrored)
    assert not forced & dropouts

    ex, records = _train(plan.symbol, case, values)
    debug = ex.debug_str()
    if policy in MUST_RECOMPUTE:
        assert "_mirror" in debug, f"{policy} on {graph}: MXNet recomputes nothing"
    if policy == "none":
        assert "_mirror" not in debug
    assert not re.search(r"Op:Dropout, Name=\S*_mirror", debug)
    assert sum(allocated_mb(ex)) <= base_mb

    bad = _mismatches(base_records, records)
    assert not bad, f"{policy} on {graph}: {len(bad)} mismatches, e.g. {bad[:5]}"


def test_aux_states_really_change(baselines) -> None:
    """Guard against a vacuous aux comparison: BatchNorm moving stats move in training."""
    _, values, records, _, _ = baselines("resnet")
    first, last = records[0]["aux"], records[STEPS - 1]["aux"]
    moved = [k for k in first if not np.allclose(values[1][k], first[k])]
    assert moved and any(not np.allclose(first[k], last[k]) for k in first)


def test_dropout_masks_are_comparable(baselines) -> None:
    """Two unplanned runs with the same seed agree (so planned-vs-unplanned is meaningful),
    and Dropout really drops (outputs change with another seed)."""
    case, values, records, _, _ = baselines("lstm")
    _, again = _train(case.sym, case, values)
    assert not _mismatches(records, again)
    mx.random.seed(99)
    ex = case.sym.simple_bind(mx.cpu(), grad_req="null", **case.shapes)
    for name, arr in ex.arg_dict.items():
        arr[:] = values[0][name]
    ex.forward(is_train=True)
    assert not np.allclose(ex.outputs[0].asnumpy(), records[0]["outputs"][0])


def test_without_mkldnn() -> None:
    """The same comparisons with MKL-DNN off (read at process start: a child)."""
    if not mkldnn_off.MKLDNN:
        pytest.skip("this process already runs without MKL-DNN")
    mkldnn_off.run_pytest(__file__, "not without_mkldnn", passed=len(POLICIES) * len(GRAPHS) + 2)
