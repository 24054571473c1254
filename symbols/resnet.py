"""Residual networks for the memory experiments of Chen et al. 2016.

The ImageNet variant follows the network of the paper's own ``memonger``
example (post-activation Conv-BN-act modules, no activation after the sum,
unpadded 3x3/2 max pool), so that unplanned and planned memory figures can
be compared with the ones the paper reports.  The CIFAR variant is the usual
3-stage network of He et al. used for the ResNet-20/-110/-1001 rows.
"""

from __future__ import annotations

from typing import Any

import mxnet as mx

_ACTS = ("relu", "leaky")

# ImageNet bottleneck depths -> units per stage (He et al. 2016a/b).
_IMAGENET_BOTTLENECK = {
    50: [3, 4, 6, 3],
    101: [3, 4, 23, 3],
    152: [3, 8, 36, 3],
    200: [3, 24, 36, 3],
    269: [3, 30, 48, 8],
    1001: [3, 120, 207, 3],
}
# ImageNet basic-block depths -> units per stage.
_IMAGENET_BASIC = {
    18: [2, 2, 2, 2],
    34: [3, 4, 6, 3],
}


def _act(data: mx.sym.Symbol, act: str, name: str) -> mx.sym.Symbol:
    if act == "leaky":
        # Same memory as a plain activation and, unlike cuDNN's, can run in place.
        return mx.sym.LeakyReLU(data=data, act_type="leaky", name=name)
    return mx.sym.Activation(data=data, act_type="relu", name=name)


def _conv_bn_act(
    data: mx.sym.Symbol,
    num_filter: int,
    kernel: tuple[int, int],
    stride: tuple[int, int],
    pad: tuple[int, int],
    act: str,
    prefix: str,
    suffix: str,
    workspace: int,
) -> mx.sym.Symbol:
    """One post-activation module: conv -> BatchNorm -> act."""
    conv = mx.sym.Convolution(
        data=data,
        num_filter=num_filter,
        kernel=kernel,
        stride=stride,
        pad=pad,
        no_bias=True,
        workspace=workspace,
        name=f"{prefix}_conv{suffix}",
    )
    bn = mx.sym.BatchNorm(data=conv, fix_gamma=False, name=f"{prefix}_bn{suffix}")
    return _act(bn, act, f"{prefix}_act{suffix}")


def _residual_unit(
    data: mx.sym.Symbol,
    num_filter: int,
    stride: int,
    project: bool,
    bottleneck: bool,
    act: str,
    prefix: str,
    memonger_tags: bool | str,
    workspace: int,
) -> mx.sym.Symbol:
    """One residual unit; ``num_filter`` is the unit's output width."""
    s = (stride, stride)
    if bottleneck:
        inner = num_filter // 4
        b = _conv_bn_act(
            data, inner, (1, 1), (1, 1), (0, 0), act, prefix, "1", workspace
        )
        b = _conv_bn_act(b, inner, (3, 3), s, (1, 1), act, prefix, "2", workspace)
        b = _conv_bn_act(
            b, num_filter, (1, 1), (1, 1), (0, 0), act, prefix, "3", workspace
        )
    else:
        b = _conv_bn_act(
            data, num_filter, (3, 3), s, (1, 1), act, prefix, "1", workspace
        )
        b = _conv_bn_act(
            b, num_filter, (3, 3), (1, 1), (1, 1), act, prefix, "2", workspace
        )
    if project:
        shortcut = _conv_bn_act(
            data, num_filter, (1, 1), s, (0, 0), act, prefix, "_sc", workspace
        )
    else:
        shortcut = data
    if memonger_tags == "example" and project:
        # memonger's example_resnet.py reassigns its ``sym`` to the projection
        # shortcut before tagging, so in a projecting unit the hint lands on
        # the shortcut branch's activation output, not on the unit input.
        shortcut._set_attr(mirror_stage="True")
    elif memonger_tags:
        # memonger's manual hint: the unit input is a candidate checkpoint.
        data._set_attr(mirror_stage="True")
    return mx.sym.elemwise_add(shortcut, b, name=f"{prefix}_sum")


def resnet(
    units: list[int],
    bottleneck: bool = True,
    num_classes: int = 1000,
    image_shape: tuple[int, int, int] = (3, 224, 224),
    act: str = "relu",
    base_filter: int | None = None,
    memonger_tags: bool | str = False,
    workspace: int = 512,
) -> mx.sym.Symbol:
    """Build a residual net ending in a SoftmaxOutput named ``softmax``.

    Images taller than 32 pixels give the 4-stage ImageNet layout (``units``
    must have 4 entries, ``base_filter`` defaults to 64); otherwise the 3-stage
    CIFAR layout (3 entries, ``base_filter`` defaults to 16).  With
    ``memonger_tags`` every unit input carries ``mirror_stage='True'``, the
    hint memonger's ``search_plan`` looks for.  ``memonger_tags="example"``
    places the hints exactly as memonger's own ``example_resnet.py`` does:
    on the unit input, except in units with a projection shortcut, where the
    hint sits on the shortcut branch's activation output (the placement
    behind memonger's published ResNet figures).
    """
    if memonger_tags not in (False, True, "example"):
        raise ValueError(
            f"memonger_tags must be False, True or 'example', got {memonger_tags!r}"
        )
    if act not in _ACTS:
        raise ValueError(f"act must be one of {_ACTS}, got {act!r}")
    height = image_shape[1]
    imagenet = height > 32
    num_stages = 4 if imagenet else 3
    if len(units) != num_stages:
        raise ValueError(
            f"{'ImageNet' if imagenet else 'CIFAR'} resnet needs {num_stages} stages, "
            f"got units={units}"
        )
    if any(u < 1 for u in units):
        raise ValueError(f"every stage needs at least one unit, got units={units}")
    if base_filter is None:
        base_filter = 64 if imagenet else 16
    expansion = 4 if bottleneck else 1

    data = mx.sym.Variable("data")
    if imagenet:
        body = _conv_bn_act(
            data, base_filter, (7, 7), (2, 2), (3, 3), act, "stem", "0", workspace
        )
        body = mx.sym.Pooling(
            data=body, kernel=(3, 3), stride=(2, 2), pool_type="max", name="stem_pool0"
        )
    else:
        body = _conv_bn_act(
            data, base_filter, (3, 3), (1, 1), (1, 1), act, "stem", "0", workspace
        )
    in_filter = base_filter

    for stage, num_units in enumerate(units):
        out_filter = base_filter * (2**stage) * expansion
        for unit in range(num_units):
            stride = 2 if (stage > 0 and unit == 0) else 1
            project = unit == 0 and (stride != 1 or in_filter != out_filter)
            body = _residual_unit(
                body,
                out_filter,
                stride,
                project,
                bottleneck,
                act,
                f"stage{stage + 1}_unit{unit + 1}",
                memonger_tags,
                workspace,
            )
            in_filter = out_filter

    pool = mx.sym.Pooling(
        data=body, kernel=(7, 7), global_pool=True, pool_type="avg", name="global_pool"
    )
    flat = mx.sym.Flatten(data=pool, name="flatten")
    fc = mx.sym.FullyConnected(data=flat, num_hidden=num_classes, name="fc1")
    return mx.sym.SoftmaxOutput(data=fc, name="softmax")


def units_for_depth(
    depth: int, bottleneck: bool = True, imagenet: bool = True
) -> list[int]:
    """Map a conventional depth to units per stage, or raise ValueError.

    ImageNet bottleneck depths outside the standard table are built by
    deepening every stage of ResNet-200 proportionally (3 layers per unit).
    """
    if not imagenet:
        per_unit, name = (9, "bottleneck") if bottleneck else (6, "basic")
        if depth < per_unit + 2 or (depth - 2) % per_unit:
            raise ValueError(
                f"CIFAR {name} resnet depth must be {per_unit}n+2 with n >= 1, "
                f"got {depth}"
            )
        n = (depth - 2) // per_unit
        return [n, n, n]
    if not bottleneck:
        if depth not in _IMAGENET_BASIC:
            raise ValueError(
                f"ImageNet basic-block resnet depth must be one of "
                f"{sorted(_IMAGENET_BASIC)}, got {depth}"
            )
        return list(_IMAGENET_BASIC[depth])
    if depth in _IMAGENET_BOTTLENECK:
        return list(_IMAGENET_BOTTLENECK[depth])
    if depth < 50 or (depth - 2) % 3:
        raise ValueError(
            f"ImageNet bottleneck resnet depth must be 3n+2 with n >= 16 "
            f"(e.g. {sorted(_IMAGENET_BOTTLENECK)}), got {depth}"
        )
    total = (depth - 2) // 3
    base = _IMAGENET_BOTTLENECK[200]
    scaled = [max(1, round(u * total / sum(base))) for u in base]
    # Put the rounding remainder into the stage that gets most units.
    scaled[2] += total - sum(scaled)
    if scaled[2] < 1:
        raise ValueError(f"cannot distribute depth {depth} over 4 stages")
    return scaled


def resnet_by_depth(depth: int, bottleneck: bool = True,
                    image_shape: tuple[int, int, int] = (3, 224, 224),
                    **options: Any) -> mx.sym.Symbol:
    """Build the residual net of a conventional depth (see ``units_for_depth``); `options`
    as ``resnet`` takes them (num_classes, act, base_filter, memonger_tags, workspace)."""
    units = units_for_depth(depth, bottleneck=bottleneck, imagenet=image_shape[1] > 32)
    return resnet(units, bottleneck=bottleneck, image_shape=image_shape, **options)
