"""A segmented plan's predicted memory is, to the byte, what the bound executor holds.

`mxmirror fit` picks the largest batch whose predicted total (the plan's planned bytes
+ the user's arguments, gradients and aux states) fits; scripts/fit_table.py then
measures the bound SegmentedExecutor (mxmirror.runtime.segmented.measure, in a child). The
two must be
the same figure, part by part: any byte left out of the prediction is a batch that is
promised to fit and does not (ResNet-1001 recursive at 8 GB was 0.2 MB over: the
BatchNorm ops on the pool's owner that hold the statistics were not counted).
"""

from __future__ import annotations

import mxnet as mx
import pytest

import mxmirror
from mxmirror.ir.graph import resident_bytes
from symbols import lstm, resnet
from symbols.chain import conv_chain


def _net(name: str):
    if name == "chain":
        return conv_chain(48, 8, 10), {"data": (4, 3, 8, 8), "softmax_label": (4,)}
    if name == "chain-nobn":
        return conv_chain(48, 8, 10, batchnorm=False), {"data": (4, 3, 8, 8),
                                                          "softmax_label": (4,)}
    if name == "cifar-resnet":  # BatchNorm of three widths
        return (resnet.resnet_by_depth(56, num_classes=10, image_shape=(3, 32, 32)),
                {"data": (2, 3, 32, 32)})
    if name == "wide-cnn":  # BatchNorm statistics of several widths within one template
        x = mx.sym.var("data")
        for i in range(24):
            width = 4 * (1 + i % 3)
            x = mx.sym.Convolution(x, num_filter=width, kernel=(3, 3), pad=(1, 1),
                                   name=f"conv{i}")
            x = mx.sym.Activation(mx.sym.BatchNorm(x, name=f"bn{i}"), act_type="relu",
                                  name=f"relu{i}")
        x = mx.sym.FullyConnected(mx.sym.flatten(x), num_hidden=10, name="fc")
        return mx.sym.SoftmaxOutput(x, name="softmax"), {"data": (2, 3, 8, 8),
                                                         "softmax_label": (2,)}
    # with Dropout: its masks are part of the plan
    return (lstm.paper_lstm(8, num_layers=2, num_hidden=16, num_embed=16, input_size=8,
                            num_classes=20, dropout=0.2),
            lstm.input_shapes(8, 2, num_layers=2, num_hidden=16, input_size=8))


@pytest.mark.parametrize("net,policy,budget", [
    ("chain", "recursive", None),
    ("chain", "multilevel", "180KB"),
    ("chain-nobn", "recursive", None),
    ("cifar-resnet", "recursive", None),
    ("cifar-resnet", "multilevel", "1GB"),
    ("wide-cnn", "recursive", None),
    ("lstm", "recursive", None),
])
def test_prediction_is_the_measured_whole_plan(net, policy, budget) -> None:
    """Planned bytes + the user's arrays == every array the bound executor holds + the
    user's arrays, exactly, and part by part (pool, slots, outputs, masks, statistics)."""
    sym, shapes = _net(net)
    p = mxmirror.plan(sym, policy=policy, budget=budget, **shapes)
    assert p.execution.kind == "segmented", p.notes
    out = p.execution.measure(p)
    measured, predicted = out["measured_bytes"], out["predicted_bytes"]
    assert measured == predicted
    assert out["user_bytes"] == sum(resident_bytes(p.analysis.graph))
    assert p.planned_bytes + sum(resident_bytes(p.analysis.graph)) == \
        measured["total"] + out["user_bytes"]
