"""Shape, structure and tiny forward/backward checks for symbols/."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# symbols/ is a top-level directory, not an installed package.
_lstm = importlib.import_module("symbols.lstm")
_resnet = importlib.import_module("symbols.resnet")
input_shapes, paper_lstm, ptb_lm = _lstm.input_shapes, _lstm.paper_lstm, _lstm.ptb_lm
resnet, resnet_by_depth = _resnet.resnet, _resnet.resnet_by_depth
units_for_depth = _resnet.units_for_depth

CIFAR = (3, 32, 32)


def _ops(sym: mx.sym.Symbol, op: str) -> list[str]:
    return [n["name"] for n in json.loads(sym.tojson())["nodes"] if n["op"] == op]


def _tagged(sym: mx.sym.Symbol) -> list[str]:
    return [s.name for s in sym.get_internals() if s.attr("mirror_stage") is not None]


def _train_step(
    sym: mx.sym.Symbol, shapes: dict, int_inputs: dict[str, int]
) -> mx.executor.Executor:
    """Bind with gradients for all but integer inputs, run forward and backward."""
    req = {k: ("null" if k in int_inputs else "write") for k in sym.list_arguments()}
    exe = sym.simple_bind(mx.cpu(), grad_req=req, **shapes)
    rng = np.random.RandomState(0)
    for name, arr in exe.arg_dict.items():
        if name in int_inputs:
            arr[:] = rng.randint(0, int_inputs[name], arr.shape)
        else:
            arr[:] = rng.uniform(-0.1, 0.1, arr.shape)
    exe.forward(is_train=True)
    exe.backward()
    return exe


@pytest.mark.parametrize(
    ("depth", "units"),
    [
        (50, [3, 4, 6, 3]),
        (101, [3, 4, 23, 3]),
        (152, [3, 8, 36, 3]),
        (200, [3, 24, 36, 3]),
        (269, [3, 30, 48, 8]),
        (1001, [3, 120, 207, 3]),
    ],
)
def test_imagenet_depth_table(depth: int, units: list[int]) -> None:
    assert units_for_depth(depth) == units
    assert 3 * sum(units) + 2 == depth


def test_deeper_imagenet_depth_keeps_layer_count() -> None:
    units = units_for_depth(401)
    assert len(units) == 4 and min(units) >= 1
    assert 3 * sum(units) + 2 == 401
    assert units[2] > units_for_depth(200)[2]


@pytest.mark.parametrize(
    ("depth", "bottleneck", "n"),
    [(20, False, 3), (110, False, 18), (164, True, 18), (1001, True, 111)],
)
def test_cifar_depth_table(depth: int, bottleneck: bool, n: int) -> None:
    assert units_for_depth(depth, bottleneck=bottleneck, imagenet=False) == [n, n, n]


@pytest.mark.parametrize(
    ("depth", "bottleneck", "image_shape"),
    [
        (21, False, CIFAR),
        (2, False, CIFAR),
        (21, True, CIFAR),
        (51, True, (3, 224, 224)),
        (20, False, (3, 224, 224)),
    ],
)
def test_impossible_depth_raises(
    depth: int, bottleneck: bool, image_shape: tuple
) -> None:
    with pytest.raises(ValueError, match="depth"):
        resnet_by_depth(depth, bottleneck=bottleneck, image_shape=image_shape)


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="act"):
        resnet([1, 1, 1], image_shape=CIFAR, act="elu")
    with pytest.raises(ValueError, match="stages"):
        resnet([1, 1, 1])


def test_imagenet_bottleneck_structure_and_shape() -> None:
    units = [3, 4, 6, 3]
    sym = resnet(units)
    convs = _ops(sym, "Convolution")
    # 3 per unit, one projection shortcut per stage, one stem conv.
    assert len(convs) == 3 * sum(units) + 4 + 1
    assert len(set(convs)) == len(convs)
    assert "stage2_unit3_conv1" in convs and "stage4_unit1_conv_sc" in convs
    assert len(_ops(sym, "BatchNorm")) == len(convs)
    assert len(_ops(sym, "elemwise_add")) == sum(units)
    assert _ops(sym, "LeakyReLU") == [] and len(_ops(sym, "Activation")) == len(convs)
    assert sym.list_outputs() == ["softmax_output"]
    _, out, _ = sym.infer_shape(data=(2, 3, 224, 224))
    assert out == [(2, 1000)]
    internals = sym.get_internals()
    _, shapes, _ = internals.infer_shape(data=(2, 3, 224, 224))
    assert len(internals.list_outputs()) == len(shapes)
    sizes = dict(zip(internals.list_outputs(), shapes))
    assert sizes["stage1_unit3_sum_output"] == (2, 256, 55, 55)
    assert sizes["stage4_unit3_sum_output"] == (2, 2048, 7, 7)


def test_leaky_act() -> None:
    sym = resnet([1, 1, 1], image_shape=CIFAR, act="leaky", num_classes=10)
    assert len(_ops(sym, "LeakyReLU")) == len(_ops(sym, "Convolution"))
    assert _ops(sym, "Activation") == []


@pytest.mark.parametrize(("depth", "units"), [(20, 3), (110, 18)])
def test_cifar_resnet_shapes(depth: int, units: int) -> None:
    sym = resnet_by_depth(depth, bottleneck=False, num_classes=10, image_shape=CIFAR)
    # Stem + 2 per unit + projections at the start of stages 2 and 3.
    assert len(_ops(sym, "Convolution")) == 1 + 2 * 3 * units + 2
    _, out, _ = sym.infer_shape(data=(2, *CIFAR))
    assert out == [(2, 10)]
    internals = sym.get_internals()
    _, shapes, _ = internals.infer_shape(data=(2, *CIFAR))
    assert len(internals.list_outputs()) == len(shapes)
    sizes = dict(zip(internals.list_outputs(), shapes))
    assert sizes[f"stage3_unit{units}_sum_output"] == (2, 64, 8, 8)


def test_cifar_bottleneck_shape() -> None:
    sym = resnet_by_depth(164, bottleneck=True, num_classes=10, image_shape=CIFAR)
    _, out, _ = sym.infer_shape(data=(2, *CIFAR))
    assert out == [(2, 10)]


def test_cifar_resnet_train_step() -> None:
    sym = resnet([1, 1, 1], bottleneck=False, num_classes=10, image_shape=CIFAR)
    exe = _train_step(
        sym, {"data": (2, *CIFAR), "softmax_label": (2,)}, {"softmax_label": 10}
    )
    assert exe.outputs[0].shape == (2, 10)
    assert np.isfinite(exe.grad_dict["stage1_unit1_conv1_weight"].asnumpy()).all()


@pytest.mark.parametrize(
    ("units", "image_shape"), [([3, 4, 6, 3], (3, 224, 224)), ([3, 3, 3], CIFAR)]
)
def test_memonger_tags(units: list[int], image_shape: tuple) -> None:
    assert _tagged(resnet(units, image_shape=image_shape)) == []
    sym = resnet(units, image_shape=image_shape, memonger_tags=True)
    tagged = _tagged(sym)
    assert len(tagged) == sum(units)
    internals = sym.get_internals()
    assert all(internals[f"{n}_output"].attr("mirror_stage") == "True" for n in tagged)
    # The tag sits on each unit's input: the stem output, then every earlier sum.
    assert tagged[0] in ("stem_pool0", "stem_act0")
    assert all(n.endswith("_sum") for n in tagged[1:])


def _small_lstm(**kwargs: object) -> mx.sym.Symbol:
    return paper_lstm(
        3, num_hidden=16, num_embed=16, input_size=5, num_classes=7, **kwargs
    )


def test_paper_lstm_shapes() -> None:
    sym = _small_lstm()
    shapes = input_shapes(3, 2, num_hidden=16, input_size=5)
    inputs = {n for n in sym.list_arguments() if "weight" not in n and "bias" not in n}
    assert set(shapes) == inputs
    arg_shapes, out_shapes, _ = sym.infer_shape(**shapes)
    assert len(sym.list_arguments()) == len(arg_shapes)
    args = dict(zip(sym.list_arguments(), arg_shapes))
    assert args["embed_weight"] == (16, 5)
    assert args["l0_i2h_weight"] == (64, 16) and args["l3_h2h_weight"] == (64, 16)
    assert args["cls_weight"] == (7, 16)
    assert out_shapes == [(1,)] * 3 + [(2, 16)] * 8
    assert len(_ops(sym, "FullyConnected")) == 3 * (1 + 2 * 4 + 1)


@pytest.mark.parametrize("loss", ["softmax_cross_entropy", "SoftmaxOutput"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_paper_lstm_train_step(loss: str, dropout: float) -> None:
    sym = _small_lstm(loss=loss, dropout=dropout)
    shapes = input_shapes(3, 2, num_hidden=16, input_size=5)
    # softmax_cross_entropy cannot differentiate w.r.t. its label.
    exe = _train_step(sym, shapes, {f"t{t}_label": 7 for t in range(3)})
    expected = (1,) if loss == "softmax_cross_entropy" else (2, 7)
    assert exe.outputs[0].shape == expected
    grads = {k: g.asnumpy() for k, g in exe.grad_dict.items() if g is not None}
    assert all(np.isfinite(g).all() for g in grads.values())
    for name in (
        "embed_weight",
        "l0_i2h_weight",
        "l3_h2h_weight",
        "cls_weight",
        "l0_init_c",
    ):
        assert np.abs(grads[name]).sum() > 0, name


def test_paper_lstm_memonger_tags() -> None:
    assert _tagged(_small_lstm()) == []
    sym = _small_lstm(memonger_tags=True)
    internals = sym.get_internals()
    tagged = _tagged(sym)
    assert len(tagged) == 2 * 4 * 3
    for name in tagged:
        t = name.split("_")[0][1:]
        assert internals[f"{name}_output"].attr("mirror_stage") == t


def test_paper_lstm_bad_loss() -> None:
    with pytest.raises(ValueError, match="loss"):
        _small_lstm(loss="hinge")


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_ptb_lm_train_step(dropout: float) -> None:
    sym = ptb_lm(4, 30, num_layers=2, num_hidden=8, num_embed=8, dropout=dropout)
    assert sym.list_outputs() == ["softmax_output"]
    shapes = {"data": (2, 4), "softmax_label": (2, 4)}
    exe = _train_step(sym, shapes, {"data": 30, "softmax_label": 30})
    assert exe.outputs[0].shape == (2 * 4, 30)
    np.testing.assert_allclose(exe.outputs[0].asnumpy().sum(axis=1), 1.0, rtol=1e-5)
    for name in (
        "embed_weight",
        "lstm_l0_i2h_weight",
        "lstm_l1_h2h_weight",
        "pred_weight",
    ):
        grad = exe.grad_dict[name].asnumpy()
        assert np.isfinite(grad).all() and np.abs(grad).sum() > 0, name


def _memonger_compat():
    path = ROOT / "scripts" / "memonger_compat.py"
    spec = importlib.util.spec_from_file_location("memonger_compat", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_memonger_dir_is_read(tmp_path, monkeypatch) -> None:
    """The harness loads memonger.py from MEMONGER_DIR (a stand-in here) and reports a folder
    without it; no machine path is consulted."""
    mc = _memonger_compat()
    monkeypatch.delitem(sys.modules, "memonger", raising=False)
    monkeypatch.delenv("MEMONGER_DIR", raising=False)
    assert mc.load_memonger() is None and "set MEMONGER_DIR" in mc.last_error
    monkeypatch.setenv("MEMONGER_DIR", str(tmp_path))
    assert mc.load_memonger() is None and "has no memonger.py" in mc.last_error
    (tmp_path / "memonger.py").write_text(
        "def get_cost(sym, type_dict=None, **shapes):\n    raise AssertionError('GPU')\n"
        "def search_plan(sym, ntrial=6, type_dict=None, **shapes):\n"
        "    get_cost(sym, type_dict, **shapes)\n    return sym\n")
    assert mc.load_memonger() is not None
    sym = resnet([1, 1, 1], bottleneck=False, num_classes=10, image_shape=CIFAR)
    planned, mb = mc.search_plan_cpu(sym, data=(8, *CIFAR))
    assert planned is sym and mb == mc.get_cost_cpu(sym, data=(8, *CIFAR)) > 0


def test_ptb_lm_state_from_data_matches_zeros() -> None:
    shapes = {"data": (2, 4), "softmax_label": (2, 4)}
    outs = []
    for begin_state in ("zeros", "from_data"):
        sym = ptb_lm(4, 30, num_layers=2, num_hidden=8, num_embed=6, begin_state=begin_state)
        outs.append(_train_step(sym, shapes, {"data": 30, "softmax_label": 30}))
    np.testing.assert_allclose(
        outs[0].outputs[0].asnumpy(), outs[1].outputs[0].asnumpy(), rtol=1e-5
    )
    np.testing.assert_allclose(
        outs[0].grad_dict["lstm_l0_h2h_weight"].asnumpy(),
        outs[1].grad_dict["lstm_l0_h2h_weight"].asnumpy(),
        rtol=1e-4,
        atol=1e-7,
    )
    with pytest.raises(ValueError, match="begin_state"):
        ptb_lm(4, 30, begin_state="learned")


def test_ptb_lm_ignore_label() -> None:
    sym = ptb_lm(3, 10, num_layers=1, num_hidden=4, num_embed=4, ignore_label=0)
    shapes = {"data": (2, 3), "softmax_label": (2, 3)}
    req = {k: ("null" if k in shapes else "write") for k in sym.list_arguments()}
    exe = sym.simple_bind(mx.cpu(), grad_req=req, **shapes)
    for name, arr in exe.arg_dict.items():
        arr[:] = 1 if name in shapes else 0.1
    exe.arg_dict["softmax_label"][:] = 0  # every position padding: no gradient
    exe.forward(is_train=True)
    exe.backward()
    assert np.abs(exe.grad_dict["pred_weight"].asnumpy()).sum() == 0
