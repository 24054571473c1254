"""What MXNet 1.9.1 computes when a mirror copy's first output is read by nothing, op kind
by op kind: the facts behind ``mxmirror/ir/ops.py``'s MUST_WRITE.

MXNet's gradient pass (src/nnvm/gradient.cc) makes one mirror copy of every node marked
``__force_mirroring__``; the node's backward reads the copy's inputs and outputs instead of
the original's and has a control dependency on the copy (``MakeGradNode``), so the copy runs
even where nothing reads its outputs. The memory planner (src/nnvm/plan_memory.cc) marks an
output no node reads, and the executor (src/executor/graph_executor.cc) then asks the op to
write nothing there: ``req = kNullOp``. Where that is the copy's first output, some ops
compute nothing at all (LayerNorm and GroupNorm return at once, so the mean and deviation
their backward reads from the copy are whatever the buffer held) and others fail a check
(``req[0] == kWriteTo``, ``req[0] != kNullOp``), raised when the engine runs the copy.

No mxmirror here: each case is plain MXNet. A case is one op node (named ``op``) on small
inputs, each of its visible outputs cast to float32, squared and weighed into a loss, and
is trained one step five ways, every gradient, aux state and the loss compared bitwise
with the first plain run:

- ``unread``: the op node alone mirrored (its copy's outputs are read by nothing but the
  node's own backward);
- ``read``: the op node and its first output's cast and square mirrored (the square's
  backward reads the copy's first output);
- ``others``, for an op of several outputs: the op node and the other outputs' cast and
  square mirrored (every output of the copy read but the first);
- ``plain`` twice (the second shows whether the case is deterministic at all).

An op that fails ``unread`` or ``others`` but not ``read`` belongs in MUST_WRITE. Each
MKL-DNN setting runs in child processes (``MXNET_MKLDNN_ENABLED`` is read at process start)
with glibc's ``MALLOC_PERTURB_`` set, so that a buffer an op leaves unwritten holds a
pattern, not what an earlier executor left there; a configuration that kills its child (a
segfault in MXNet) is recorded and the next child starts after it. Besides the
hand-written cases (the ops a network is made of, with the attributes that choose their
code paths, and ATTR_CASES), every other registered operator is tried with default
attributes on 1 to 5 inputs of a few shapes (``--no-auto`` skips that; MXNet's NumPy
operators with NumPy shape semantics), with its outputs' gradient blocked where MXNet has
none for it. The table lists every hand-written case, every automatic one that is not
fine, the cases with no plain run to compare with, and the operators not tried.

    python scripts/unread_mirror_sweep.py [--mkldnn both|on|off] [--no-auto]
        [--only CASE ...] [--out FILE]

Not run in CI (about 30 s on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings

import _bootstrap  # noqa: F401 (this checkout importable)
from provenance import generated_by

SHAPES = [(2, 3, 4, 5), (3, 4), (4, 4), (2, 4, 4)]
# never tried: not ops of a trained network (optimizers, I/O, quantized inference, the
# executor's own) or ops no symbol can carry on its own (a subgraph, a Python callback)
SKIP_PREFIXES = ("_backward", "_contrib_backward", "_contrib_quantize", "_contrib_quantized",
                 "_contrib_dequantize", "_contrib_requantize", "_contrib_calibrate",
                 "_contrib_dgl", "_cv", "_sg_", "_split_v2_backward")
SKIP = {"Custom", "_CachedOp", "_CachedOpThreadSafe", "_CustomFunction", "_NDArray", "_Native",
        "_foreach", "_while_loop", "_cond", "_CrossDeviceCopy", "_imdecode", "_copyto",
        "_set_value", "_NoGradient", "reset_arrays", "all_finite", "multi_all_finite",
        "multi_sum_sq", "multi_lars", "_contrib_group_adagrad_update", "_histogram"}
# Operators with required attributes, in the form of the automatic cases: op -> (attributes,
# input shapes); the other arguments' shapes are inferred.
ATTR_CASES = {
    "_npi_mean": ({"axis": "1"}, [(3, 4)]),
    "_npi_std": ({"axis": "1"}, [(3, 4)]),
    "_npi_var": ({"axis": "1"}, [(3, 4)]),
    "_npi_average": ({"axis": "1", "weighted": "False"}, [(3, 4)]),
    "_npi_broadcast_to": ({"shape": "(2, 3, 4)"}, [(3, 4)]),
    "_npi_flip": ({"axis": "1"}, [(3, 4)]),
    "_npi_pad": ({"pad_width": "((1, 1), (2, 2))", "mode": "constant"}, [(3, 4)]),
    "_npi_rot90": ({"k": "1", "axes": "(0, 1)"}, [(3, 4)]),
    "_npi_tensordot": ({"a_axes_summed": "(1,)", "b_axes_summed": "(0,)"}, [(3, 4), (4, 5)]),
    "_npi_tensordot_int_axes": ({"axes": "1"}, [(3, 4), (4, 5)]),
    "_npi_einsum": ({"subscripts": "ij,jk->ik", "num_args": "2"}, [(3, 4), (4, 5)]),
    "_npi_hstack": ({"num_args": "2"}, [(3, 4), (3, 4)]),
    "_npi_dstack": ({"num_args": "2"}, [(3, 4), (3, 4)]),
    "_npi_hsplit": ({"indices": "(0, 2)", "axis": "1", "sections": "0"}, [(3, 4)]),
    "_npi_dsplit": ({"indices": "(0, 2)", "axis": "2", "sections": "0"}, [(2, 3, 4)]),
    "_npi_argmax": ({"axis": "1"}, [(3, 4)]),
    "_npi_argmin": ({"axis": "1"}, [(3, 4)]),
    "_npx_reshape": ({"newshape": "(-1,)"}, [(3, 4)]),
    "_npi_full_like": ({"fill_value": "2"}, [(3, 4)]),
    "_npi_polyval": ({}, [(3,), (4,)]),
    "_npi_percentile": ({"q_scalar": "50", "interpolation": "linear"}, [(3, 4)]),
    "_npi_delete": ({"int_ind": "1", "axis": "1"}, [(3, 4)]),
    "_split_v2": ({"indices": "(0, 2)", "axis": "1"}, [(3, 4)]),
    "_linalg_maketrian": ({}, [(2, 6)]),
    "_slice_assign": ({"begin": "(0, 1)", "end": "(2, 3)"}, [(3, 4), (2, 2)]),
    "_slice_assign_scalar": ({"begin": "(0, 1)", "end": "(2, 3)", "scalar": "1"}, [(3, 4)]),
    "_contrib_PSROIPooling": ({"spatial_scale": "1", "output_dim": "2", "pooled_size": "2"},
                              [(2, 8, 5, 5), (3, 5)]),
    "_contrib_DeformablePSROIPooling": ({"spatial_scale": "1", "output_dim": "2",
                                         "group_size": "2", "pooled_size": "2",
                                         "no_trans": "True"}, [(2, 8, 5, 5), (3, 5)]),
    "_contrib_RROIAlign": ({"pooled_size": "(2, 2)", "spatial_scale": "1"},
                           [(2, 4, 5, 5), (3, 6)]),
}


def _skipped(op: str) -> bool:
    return (op in SKIP or op.startswith(SKIP_PREFIXES) or op.endswith("_update")
            or "_update_phase" in op)


# ------------------------------------------------------------------ the cases
def hand_cases():
    """name -> (build(S, x) -> symbol whose first output's node is `op`, input shapes,
    integer inputs (no gradient): name -> exclusive bound of their values, input dtypes
    other than float32)."""
    import mxnet as mx

    S = mx.sym
    v = S.var

    def c(build, shapes=None, ints=None, dtypes=None):
        return build, shapes or {"x": (4, 8)}, ints or {}, dtypes or {}

    img = {"x": (2, 4, 5, 5)}
    seq = {"x": (5, 2, 4)}
    cases = {
        # the norms: MKL (axis -1, float32), LayerNormCPU and the general path
        "LayerNorm": c(lambda S, x: S.LayerNorm(x, name="op")),
        "LayerNorm_axis1": c(lambda S, x: S.LayerNorm(x, axis=1, name="op"), {"x": (4, 8, 3)}),
        **{f"LayerNorm_{t}": c(lambda S, x, t=t: S.LayerNorm(
            S.cast(x, t), v("g", dtype=t), v("b", dtype=t), name="op"))
           for t in ("float64", "float16")},
        "GroupNorm": c(lambda S, x: S.GroupNorm(x, num_groups=2, name="op"), img),
        "GroupNorm_3d": c(lambda S, x: S.GroupNorm(x, num_groups=4, name="op"), {"x": (4, 4, 3)}),
        "InstanceNorm": c(lambda S, x: S.InstanceNorm(x, name="op"), img),
        "BatchNorm": c(lambda S, x: S.BatchNorm(x, name="op"), img),
        "BatchNorm_fix_gamma_false": c(lambda S, x: S.BatchNorm(x, fix_gamma=False, name="op"),
                                       img),
        "BatchNorm_global_stats": c(lambda S, x: S.BatchNorm(x, use_global_stats=True,
                                                             name="op"), img),
        "BatchNorm_mean_var": c(lambda S, x: S.BatchNorm(x, output_mean_var=True, name="op"),
                                img),
        "BatchNorm_axis_last": c(lambda S, x: S.BatchNorm(x, axis=-1, name="op"), img),
        "BatchNorm_2d": c(lambda S, x: S.BatchNorm(x, name="op")),
        "BatchNormWithReLU": c(lambda S, x: S.contrib.BatchNormWithReLU(x, name="op"), img),
        "BatchNorm_v1": c(lambda S, x: S.BatchNorm_v1(x, name="op"), img),
        "SyncBatchNorm": c(lambda S, x: S.contrib.SyncBatchNorm(x, name="op", key="k"), img),
        "L2Normalization": c(lambda S, x: S.L2Normalization(x, name="op")),
        "L2Normalization_channel": c(lambda S, x: S.L2Normalization(x, mode="channel",
                                                                    name="op"), img),
        "L2Normalization_spatial": c(lambda S, x: S.L2Normalization(x, mode="spatial",
                                                                    name="op"), img),
        "LRN": c(lambda S, x: S.LRN(x, nsize=3, name="op"), img),
        "moments": c(lambda S, x: S.moments(x, axes=(1,), name="op")),
        # activations
        **{f"Activation_{t}": c(lambda S, x, t=t: S.Activation(x, act_type=t, name="op"))
           for t in ("relu", "sigmoid", "tanh", "softrelu", "softsign")},
        "Activation_relu_4d": c(lambda S, x: S.Activation(x, act_type="relu", name="op"), img),
        **{f"LeakyReLU_{t}": c(lambda S, x, t=t: S.LeakyReLU(x, act_type=t, slope=0.2,
                                                               name="op"))
           for t in ("leaky", "elu", "selu", "gelu", "rrelu")},
        "LeakyReLU_prelu": c(lambda S, x: S.LeakyReLU(x, act_type="prelu", name="op",
                                                      gamma=v("g", shape=(8,)))),
        "hard_sigmoid": c(lambda S, x: S.hard_sigmoid(x, name="op")),
        "softmax": c(lambda S, x: S.softmax(x, name="op")),
        "softmax_axis0": c(lambda S, x: S.softmax(x, axis=0, name="op")),
        "softmax_temperature": c(lambda S, x: S.softmax(x, temperature=2.0, name="op")),
        "softmax_length": c(lambda S, x: S.softmax(x, v("len"), use_length=True, axis=-1,
                                                   name="op"), {"x": (4, 8), "len": (4,)},
                            {"len": 9}, {"len": "int32"}),
        "softmax_float64": c(lambda S, x: S.softmax(x, dtype="float64", name="op")),
        "log_softmax": c(lambda S, x: S.log_softmax(x, name="op")),
        "softmin": c(lambda S, x: S.softmin(x, name="op")),
        "SoftmaxActivation": c(lambda S, x: S.SoftmaxActivation(x, name="op")),
        "SoftmaxActivation_channel": c(lambda S, x: S.SoftmaxActivation(x, mode="channel",
                                                                        name="op"), img),
        # layers with weights
        "FullyConnected": c(lambda S, x: S.FullyConnected(x, num_hidden=6, name="op")),
        "FullyConnected_nobias_noflatten": c(
            lambda S, x: S.FullyConnected(x, num_hidden=6, no_bias=True, flatten=False,
                                          name="op"), {"x": (2, 3, 8)}),
        "Convolution": c(lambda S, x: S.Convolution(x, num_filter=4, kernel=(3, 3), pad=(1, 1),
                                                    name="op"), img),
        "Convolution_1d": c(lambda S, x: S.Convolution(x, num_filter=4, kernel=(3,), name="op"),
                            {"x": (2, 4, 7)}),
        "Convolution_3d": c(lambda S, x: S.Convolution(x, num_filter=2, kernel=(2, 2, 2),
                                                       name="op"), {"x": (2, 2, 3, 3, 3)}),
        "Convolution_depthwise": c(lambda S, x: S.Convolution(x, num_filter=4, num_group=4,
                                                              kernel=(3, 3), name="op"), img),
        "Convolution_v1": c(lambda S, x: S.Convolution_v1(x, num_filter=4, kernel=(3, 3),
                                                          name="op"), img),
        "Deconvolution": c(lambda S, x: S.Deconvolution(x, num_filter=4, kernel=(3, 3),
                                                        name="op"), img),
        "DeformableConvolution": c(
            lambda S, x: S.contrib.DeformableConvolution(x, v("off"), num_filter=4,
                                                         kernel=(3, 3), pad=(1, 1), name="op"),
            {"x": (2, 4, 5, 5), "off": (2, 18, 5, 5)}),
        "Embedding": c(lambda S, x: S.Embedding(v("idx"), input_dim=10, output_dim=4,
                                                name="op"), {"idx": (4, 3)}, {"idx": 10}),
        "take": c(lambda S, x: S.take(x, v("idx"), name="op"), {"x": (6, 4), "idx": (3,)},
                  {"idx": 6}),
        "take_axis1_wrap": c(lambda S, x: S.take(x, v("idx"), axis=1, mode="wrap", name="op"),
                             {"x": (4, 8), "idx": (5,)}, {"idx": 8}),
        "batch_take": c(lambda S, x: S.batch_take(x, v("idx"), name="op"),
                        {"x": (4, 8), "idx": (4,)}, {"idx": 8}, {"idx": "int32"}),
        "pick": c(lambda S, x: S.pick(x, v("idx"), axis=1, name="op"),
                  {"x": (4, 8), "idx": (4,)}, {"idx": 8}),
        "gather_nd": c(lambda S, x: S.gather_nd(x, v("idx"), name="op"),
                       {"x": (4, 8), "idx": (2, 5)}, {"idx": 4}),
        "scatter_nd": c(lambda S, x: S.scatter_nd(x, v("idx"), shape=(4, 4), name="op"),
                        {"x": (3,), "idx": (2, 3)}, {"idx": 4}),
        "one_hot": c(lambda S, x: S.one_hot(v("idx"), depth=5, name="op"), {"idx": (4,)},
                     {"idx": 5}),
        "RNN_lstm": c(lambda S, x: S.RNN(x, v("p"), v("h"), v("c"), state_size=3, num_layers=1,
                                         mode="lstm", state_outputs=True, name="op"),
                      {"x": (5, 2, 4), "p": (4 * 3 * (4 + 3 + 2),), "h": (1, 2, 3),
                       "c": (1, 2, 3)}),
        "RNN_gru": c(lambda S, x: S.RNN(x, v("p"), v("h"), state_size=3, num_layers=1,
                                        mode="gru", name="op"),
                     {"x": (5, 2, 4), "p": (3 * 3 * (4 + 3 + 2),), "h": (1, 2, 3)}),
        # pooling and resampling
        **{f"Pooling_{t}": c(lambda S, x, t=t: S.Pooling(x, kernel=(2, 2), stride=(1, 1),
                                                         pool_type=t, p_value=2, name="op"),
                             img)
           for t in ("max", "avg", "sum", "lp")},
        "Pooling_global_avg": c(lambda S, x: S.Pooling(x, global_pool=True, kernel=(1, 1),
                                                       pool_type="avg", name="op"), img),
        "Pooling_max_1d": c(lambda S, x: S.Pooling(x, kernel=(3,), pool_type="max", name="op"),
                            {"x": (2, 4, 7)}),
        "Pooling_max_3d": c(lambda S, x: S.Pooling(x, kernel=(2, 2, 2), pool_type="max",
                                                   name="op"), {"x": (2, 2, 3, 3, 3)}),
        "Pooling_v1": c(lambda S, x: S.Pooling_v1(x, kernel=(2, 2), pool_type="max",
                                                  name="op"), img),
        "AdaptiveAvgPooling2D": c(lambda S, x: S.contrib.AdaptiveAvgPooling2D(
            x, output_size=(2, 2), name="op"), img),
        "UpSampling_nearest": c(lambda S, x: S.UpSampling(x, scale=2, sample_type="nearest",
                                                          name="op"), img),
        "UpSampling_bilinear": c(lambda S, x: S.UpSampling(
            x, v("w"), scale=2, num_filter=4, num_args=2, sample_type="bilinear", name="op"),
            {"x": (2, 4, 5, 5), "w": (4, 1, 4, 4)}),
        "BilinearResize2D": c(lambda S, x: S.contrib.BilinearResize2D(x, height=7, width=7,
                                                                      name="op"), img),
        "BilinearSampler": c(lambda S, x: S.BilinearSampler(x, v("grid") * 2 - 1.1, name="op"),
                             {"x": (2, 4, 5, 5), "grid": (2, 2, 5, 5)}),
        "GridGenerator_affine": c(lambda S, x: S.GridGenerator(x, transform_type="affine",
                                                               target_shape=(4, 4), name="op"),
                                  {"x": (2, 6)}),
        "GridGenerator_warp": c(lambda S, x: S.GridGenerator(x, transform_type="warp",
                                                             name="op"), {"x": (2, 2, 4, 4)}),
        "SpatialTransformer": c(lambda S, x: S.SpatialTransformer(
            x, v("loc"), target_shape=(4, 4), transform_type="affine", sampler_type="bilinear",
            name="op"), {"x": (2, 4, 5, 5), "loc": (2, 6)}),
        "ROIPooling": c(lambda S, x: S.ROIPooling(x, v("rois"), pooled_size=(2, 2),
                                                  spatial_scale=1.0, name="op"),
                        {"x": (2, 4, 5, 5), "rois": (3, 5)}, {"rois": 2}),
        "ROIAlign": c(lambda S, x: S.contrib.ROIAlign(x, v("rois"), pooled_size=(2, 2),
                                                      spatial_scale=1.0, name="op"),
                      {"x": (2, 4, 5, 5), "rois": (3, 5)}, {"rois": 2}),
        "Correlation": c(lambda S, x: S.Correlation(x, v("y"), kernel_size=1,
                                                    max_displacement=1, name="op"),
                         {"x": (2, 4, 5, 5), "y": (2, 4, 5, 5)}),
        "Crop": c(lambda S, x: S.Crop(x, h_w=(3, 3), num_args=1, name="op"), img),
        "Pad_edge": c(lambda S, x: S.Pad(x, mode="edge", pad_width=(0, 0, 0, 0, 1, 1, 1, 1),
                                         name="op"), img),
        "Pad_reflect": c(lambda S, x: S.Pad(x, mode="reflect",
                                            pad_width=(0, 0, 0, 0, 1, 1, 1, 1), name="op"), img),
        "Pad_constant": c(lambda S, x: S.Pad(x, mode="constant",
                                             pad_width=(0, 0, 0, 0, 1, 1, 1, 1), name="op"),
                          img),
        "im2col": c(lambda S, x: S.im2col(x, kernel=(2, 2), name="op"), img),
        "col2im": c(lambda S, x: S.col2im(x, output_size=(5, 5), kernel=(2, 2), name="op"),
                    {"x": (2, 16, 16)}),
        "depth_to_space": c(lambda S, x: S.depth_to_space(x, block_size=2, name="op"), img),
        "space_to_depth": c(lambda S, x: S.space_to_depth(x, block_size=2, name="op"),
                            {"x": (2, 4, 4, 4)}),
        # sequences
        "SequenceMask": c(lambda S, x: S.SequenceMask(x, v("len"), use_sequence_length=True,
                                                      name="op"), {**seq, "len": (2,)},
                          {"len": 6}),
        "SequenceLast": c(lambda S, x: S.SequenceLast(x, v("len"), use_sequence_length=True,
                                                      name="op"), {**seq, "len": (2,)},
                          {"len": 6}),
        "SequenceReverse": c(lambda S, x: S.SequenceReverse(x, name="op"), seq),
        # attention
        "interleaved_matmul_selfatt_qk": c(
            lambda S, x: S.contrib.interleaved_matmul_selfatt_qk(x, heads=2, name="op"),
            {"x": (3, 2, 12)}),
        "interleaved_matmul_selfatt_valatt": c(
            lambda S, x: S.contrib.interleaved_matmul_selfatt_valatt(x, v("att"), heads=2,
                                                                     name="op"),
            {"x": (3, 2, 12), "att": (4, 3, 3)}),
        "interleaved_matmul_encdec_qk": c(
            lambda S, x: S.contrib.interleaved_matmul_encdec_qk(x, v("kv"), heads=2, name="op"),
            {"x": (3, 2, 4), "kv": (5, 2, 8)}),
        "interleaved_matmul_encdec_valatt": c(
            lambda S, x: S.contrib.interleaved_matmul_encdec_valatt(v("kv"), x, heads=2,
                                                                    name="op"),
            {"x": (4, 3, 5), "kv": (5, 2, 8)}),
        "div_sqrt_dim": c(lambda S, x: S.contrib.div_sqrt_dim(x, name="op")),
        "batch_dot": c(lambda S, x: S.batch_dot(x, x, transpose_b=True, name="op"),
                       {"x": (2, 3, 4)}),
        "dot": c(lambda S, x: S.dot(x, v("w"), name="op"), {"x": (4, 8), "w": (8, 3)}),
        "dot_transpose": c(lambda S, x: S.dot(x, v("w"), transpose_b=True, name="op"),
                           {"x": (4, 8), "w": (3, 8)}),
        "linalg_gemm2": c(lambda S, x: S.linalg.gemm2(x, x, transpose_b=True, name="op"),
                          {"x": (2, 3, 4)}),
        # shape, selection and sorting
        "topk_value": c(lambda S, x: S.topk(x, k=3, ret_typ="value", name="op")),
        "topk_both": c(lambda S, x: S.topk(x, k=3, ret_typ="both", name="op")),
        "topk_indices": c(lambda S, x: S.topk(x, k=3, name="op")),
        "topk_mask": c(lambda S, x: S.topk(x, k=3, ret_typ="mask", name="op")),
        "sort": c(lambda S, x: S.sort(x, name="op")),
        "argsort": c(lambda S, x: S.argsort(x, name="op")),
        "argmax": c(lambda S, x: S.argmax(x, axis=1, name="op")),
        "split": c(lambda S, x: S.split(x, num_outputs=2, axis=1, name="op")),
        "split_squeeze": c(lambda S, x: S.split(x, num_outputs=8, axis=1, squeeze_axis=True,
                                                name="op")),
        "Concat": c(lambda S, x: S.concat(x, x * 2, dim=1, name="op")),
        "Concat_4d": c(lambda S, x: S.concat(x, x * 2, dim=1, name="op"), img),
        "stack": c(lambda S, x: S.stack(x, x * 2, axis=1, name="op")),
        "add_n": c(lambda S, x: S.add_n(x, x * 2, x * 3, name="op")),
        "ElementWiseSum_4d": c(lambda S, x: S.add_n(x, x * 2, name="op"), img),
        "elemwise_add_4d": c(lambda S, x: S.elemwise_add(x, x * 2, name="op"), img),
        "Reshape": c(lambda S, x: S.reshape(x, shape=(0, 2, -1), name="op")),
        "Flatten": c(lambda S, x: S.flatten(x, name="op"), img),
        "transpose": c(lambda S, x: S.transpose(x, axes=(0, 2, 3, 1), name="op"), img),
        "expand_dims": c(lambda S, x: S.expand_dims(x, axis=1, name="op")),
        "slice": c(lambda S, x: S.slice(x, begin=(1, 2), end=(3, 7), name="op")),
        "slice_axis": c(lambda S, x: S.slice_axis(x, axis=1, begin=1, end=5, name="op")),
        "slice_like": c(lambda S, x: S.slice_like(x, v("y"), name="op"),
                        {"x": (4, 8), "y": (3, 5)}),
        "broadcast_like": c(lambda S, x: S.broadcast_like(S.mean(x, axis=1, keepdims=True), x,
                                                          name="op")),
        "broadcast_to": c(lambda S, x: S.broadcast_to(x, shape=(3, 4, 8), name="op"),
                          {"x": (1, 4, 8)}),
        "tile": c(lambda S, x: S.tile(x, reps=(2, 1), name="op")),
        "repeat": c(lambda S, x: S.repeat(x, repeats=2, axis=1, name="op")),
        "reverse": c(lambda S, x: S.flip(x, axis=1, name="op")),
        "where": c(lambda S, x: S.where(v("cond"), x, x * 3, name="op"),
                   {"x": (4, 8), "cond": (4, 8)}, {"cond": 2}),
        "clip": c(lambda S, x: S.clip(x, 0.3, 0.6, name="op")),
        "Cast_float16": c(lambda S, x: S.cast(x, "float16", name="op")),
        "Cast_float64": c(lambda S, x: S.cast(x, "float64", name="op")),
        "amp_cast": c(lambda S, x: S.amp_cast(x, dtype="float16", name="op")),
        "amp_cast_back": c(lambda S, x: S.amp_cast(S.cast(x, "float16"), dtype="float32",
                                                   name="op")),
        "amp_multicast": c(lambda S, x: S.amp_multicast(x, S.cast(x, "float16"), num_outputs=2,
                                                        name="op")),
        "norm": c(lambda S, x: S.norm(x, axis=1, name="op")),
        "sum_axis": c(lambda S, x: S.sum(x, axis=1, name="op")),
        "mean_keepdims": c(lambda S, x: S.mean(x, axis=1, keepdims=True, name="op")),
        "max_axis": c(lambda S, x: S.max(x, axis=1, name="op")),
        "prod": c(lambda S, x: S.prod(x, axis=1, name="op")),
        "cumsum": c(lambda S, x: S.cumsum(x, axis=1, name="op")),
        "diag": c(lambda S, x: S.diag(x, name="op"), {"x": (4, 4)}),
        "khatri_rao": c(lambda S, x: S.khatri_rao(x, v("y"), name="op"),
                        {"x": (3, 4), "y": (2, 4)}),
        "smooth_l1": c(lambda S, x: S.smooth_l1(x, scalar=1.0, name="op")),
        "quadratic": c(lambda S, x: S.contrib.quadratic(x, a=1, b=2, c=3, name="op")),
        "gradientmultiplier": c(lambda S, x: S.contrib.gradientmultiplier(x, scalar=0.5,
                                                                          name="op")),
        "arange_like": c(lambda S, x: S.contrib.arange_like(x, axis=1, name="op")),
        "index_copy": c(lambda S, x: S.contrib.index_copy(x, v("idx"), v("t"), name="op"),
                        {"x": (5, 3), "idx": (2,), "t": (2, 3)}, {"idx": 5}),
        "BlockGrad": c(lambda S, x: S.BlockGrad(x, name="op")),
        "stop_gradient_path": c(lambda S, x: S.stop_gradient(x, name="op")),
        "identity": c(lambda S, x: S.identity(x, name="op")),
        "_copy": c(lambda S, x: S._internal._copy(x, name="op")),
        "shape_array": c(lambda S, x: S.shape_array(x, name="op")),
        "size_array": c(lambda S, x: S.size_array(x, name="op")),
        "zeros_like": c(lambda S, x: S.zeros_like(x, name="op")),
        "ones_like": c(lambda S, x: S.ones_like(x, name="op")),
        "IdentityAttachKLSparseReg": c(lambda S, x: S.IdentityAttachKLSparseReg(x, name="op"),
                                       {"x": (4, 8)}),
        # losses (the heads of a Module's symbol)
        "SoftmaxOutput": c(lambda S, x: S.SoftmaxOutput(x, v("label"), name="op"),
                           {"x": (4, 8), "label": (4,)}, {"label": 8}),
        "SoftmaxOutput_multi": c(lambda S, x: S.SoftmaxOutput(x, v("label"), multi_output=True,
                                                              name="op"),
                                 {"x": (2, 4, 3), "label": (2, 3)}, {"label": 4}),
        "LinearRegressionOutput": c(lambda S, x: S.LinearRegressionOutput(x, v("label"),
                                                                          name="op"),
                                    {"x": (4, 8), "label": (4, 8)}),
        "LogisticRegressionOutput": c(lambda S, x: S.LogisticRegressionOutput(x, v("label"),
                                                                              name="op"),
                                      {"x": (4, 8), "label": (4, 8)}),
        "MAERegressionOutput": c(lambda S, x: S.MAERegressionOutput(x, v("label"), name="op"),
                                 {"x": (4, 8), "label": (4, 8)}),
        "SVMOutput": c(lambda S, x: S.SVMOutput(x, v("label"), name="op"),
                       {"x": (4, 8), "label": (4,)}, {"label": 8}),
        "MakeLoss": c(lambda S, x: S.MakeLoss(x, name="op")),
        "make_loss": c(lambda S, x: S.make_loss(x, name="op")),
        "softmax_cross_entropy": c(lambda S, x: S.softmax_cross_entropy(x, v("label"),
                                                                        name="op"),
                                   {"x": (4, 8), "label": (4,)}, {"label": 8}),
        "CTCLoss": c(lambda S, x: S.CTCLoss(x, v("label"), name="op"),
                     {"x": (6, 2, 5), "label": (2, 3)}, {"label": 5}),
        "Dropout": c(lambda S, x: S.Dropout(x, p=0.5, name="op")),
        "Dropout_p0": c(lambda S, x: S.Dropout(x, p=0.0, name="op")),
    }
    return cases


CONFIGS = ("plain2", "read", "others", "unread")  # in this order after the first plain run


def _op_node(op_sym) -> tuple[str, str]:
    """(name, op) of the node whose first output `op_sym` starts with."""
    js = json.loads(op_sym.tojson())
    node = js["nodes"][js["heads"][0][0]]
    return node["name"], node["op"]


def _loss(mx, op_sym, blocked: bool):
    """The case's graph: every visible output of the case's node cast to float32, squared
    and weighed into one loss (the `read` configuration mirrors the node and its first
    output's cast and square, `others` those of its other outputs); with `blocked`, no
    gradient flows back into it."""
    S = mx.sym
    name, _ = _op_node(op_sym)
    internals = op_sym.get_internals()
    js = json.loads(internals.tojson())
    at = next(i for i, n in enumerate(js["nodes"]) if n["name"] == name and n["op"] != "null")
    outs = [internals[i] for i, h in enumerate(js["heads"]) if h[0] == at]
    terms = []
    for k, o in enumerate(outs):
        h = S.square(S.Cast(o, dtype="float32", name=f"loss_cast{k}"), name=f"loss_read{k}")
        if blocked:
            h = S.BlockGrad(h, name=f"loss_block{k}")
        terms.append(S.sum(h * S.var(f"loss_w{k}"), name=f"loss_sum{k}"))
    total = S.add_n(*terms, name="loss_add") if len(terms) > 1 else terms[0]
    return S.MakeLoss(total, name="loss")


def _train_step(mx, np, sym, case, mirrored: set[str]) -> dict:
    """Bind `sym` with the nodes named in `mirrored` marked for mirroring and train one step
    on fixed values; the loss, every gradient and aux state."""
    _, shapes, ints, dtypes = case
    js = json.loads(sym.tojson())
    for n in js["nodes"]:
        if n["name"] in mirrored:
            n.setdefault("attrs", {})["__force_mirroring__"] = "True"
    sym = mx.sym.load_json(json.dumps(js))
    req = {a: "null" if a in ints else "write" for a in sym.list_arguments()}
    types = {a: dtypes.get(a, "float32") for a in shapes} if dtypes else None
    ex = sym.simple_bind(mx.cpu(), grad_req=req, type_dict=types, **shapes)
    rng = np.random.RandomState(0)
    for name, a in sorted(ex.arg_dict.items()):
        if name in ints:
            a[:] = rng.randint(0, ints[name], a.shape)
        elif name.startswith("loss_w"):
            a[:] = rng.normal(0, 1, a.shape)
        else:
            a[:] = rng.uniform(0.2, 0.9, a.shape)
    for _, a in sorted(ex.aux_dict.items()):
        a[:] = rng.uniform(0.2, 0.9, a.shape)
    mx.random.seed(1)
    ex.forward(is_train=True)
    ex.backward()
    mx.nd.waitall()
    out = {"loss": ex.outputs[0].asnumpy()}
    out.update({f"grad {k}": g.asnumpy() for k, g in ex.grad_dict.items() if g is not None})
    out.update({f"aux {k}": a.asnumpy() for k, a in ex.aux_dict.items()})
    return out


def _error(e: BaseException) -> str:
    """The line of an error that says what failed, without MXNet's time and source file."""
    lines = [re.sub(r"\[\d\d:\d\d:\d\d\] \S+: ", "", ln).strip()
             for ln in str(e).splitlines() if ln.strip()]
    pick = [ln for ln in lines if "Check failed" in ln] or [ln for ln in lines if "Error" in ln]
    return ((pick or lines or [type(e).__name__])[-1])[:160]


def run_case(mx, np, name: str, case, first: str, emit) -> None:
    """One case: the plain run, then the configurations from `first` on, each result given
    to `emit` as it comes (a configuration that kills the process leaves the others)."""
    build = case[0]
    try:
        op_name, op = _op_node(build())
        for blocked in (False, True):
            graph = _loss(mx, build(), blocked)
            try:
                plain = _train_step(mx, np, graph, case, set())
                break
            except Exception:  # noqa: BLE001 - no gradient: try with the outputs blocked
                if blocked:
                    raise
    except Exception as e:  # noqa: BLE001 - an invalid case is reported, not fatal
        emit({"case": name, "plain": "fails: " + _error(e)})
        return
    emit({"case": name, "op": op, "blocked": blocked})
    outputs = sum(n["name"].startswith("loss_read") for n in json.loads(graph.tojson())["nodes"])
    mirrors = {"plain2": set(), "read": {op_name, "loss_cast0", "loss_read0"},
               "others": {op_name, *(f"loss_{w}{k}" for k in range(1, outputs)
                                     for w in ("cast", "read"))},
               "unread": {op_name}}
    for cfg in CONFIGS[CONFIGS.index(first):]:
        if cfg == "others" and outputs == 1:
            continue
        emit({"start": name, "cfg": cfg})
        try:
            got = _train_step(mx, np, graph, case, mirrors[cfg])
        except Exception as e:  # noqa: BLE001
            emit({"case": name, cfg: "error: " + _error(e)})
            continue
        bad = [k for k in plain if not np.array_equal(plain[k], got[k], equal_nan=True)]
        emit({"case": name, cfg: "same" if not bad else "DIFF " + ", ".join(sorted(bad))})


# ------------------------------------------------------------- the automatic cases
def registered_ops(mx) -> list[str]:
    """Every operator MXNet registers, by its own name (aliases are not listed)."""
    import ctypes

    from mxnet.base import _LIB, check_call, py_str

    handles = ctypes.POINTER(ctypes.c_void_p)()
    size = ctypes.c_uint()
    check_call(_LIB.MXSymbolListAtomicSymbolCreators(ctypes.byref(size), ctypes.byref(handles)))
    ops = []
    for i in range(size.value):
        name = ctypes.c_char_p()
        check_call(_LIB.MXSymbolGetAtomicSymbolName(ctypes.c_void_p(handles[i]),
                                                    ctypes.byref(name)))
        ops.append(py_str(name.value))
    return sorted(ops)


def _auto_graph(mx, op: str, k: int, attrs: dict):
    """The node `op` on inputs x0..x{k-1}, x0 through `x0 * 1` (an op's output, as data is
    in a network; the others stay variables: an aux state must be one)."""
    nodes = [{"op": "null", "name": f"x{i}", "inputs": []} for i in range(k)]
    nodes.append({"op": "_mul_scalar", "name": "pre", "attrs": {"scalar": "1.0"},
                  "inputs": [[0, 0, 0]]})
    ins = [[k, 0, 0]] + [[i, 0, 0] for i in range(1, k)]
    nodes.append({"op": op, "name": "op", "attrs": attrs, "inputs": ins})
    js = {"nodes": nodes, "arg_nodes": list(range(k)), "node_row_ptr": list(range(k + 3)),
          "heads": [[k + 1, 0, 0]], "attrs": {"mxnet_version": ["int", 10901]}}
    return mx.sym.load_json(json.dumps(js))


def _known(shape) -> bool:
    """A shape inferred whole: no unknown dimension (0 in MXNet's legacy shapes, -1 in its
    NumPy ones, where () is a scalar's shape, not an unknown one)."""
    from mxnet.util import is_np_shape

    if shape is None or -1 in shape:
        return False
    return is_np_shape() or (len(shape) > 0 and 0 not in shape)


def auto_spec(mx, op: str) -> list | None:
    """[arity, attributes, shapes] of `op` with default attributes on the first arity (1 to
    5 inputs, all of one shape unless MXNet infers the others from the first) and shape of
    SHAPES it infers shapes for; None if none does."""
    for k in range(1, 6):
        for attrs in ({}, {"num_args": str(k)}):
            try:
                sym = _auto_graph(mx, op, k, attrs)
            except Exception:  # noqa: BLE001 - not this arity or these attributes
                continue
            for shape in SHAPES:
                for given in ({"x0": shape}, {f"x{i}": shape for i in range(k)}):
                    try:
                        args, outs, _ = sym.infer_shape(**given)
                    except Exception:  # noqa: BLE001
                        continue
                    if args is not None and all(_known(s) for s in args + outs):
                        return [k, attrs, dict(zip(sym.list_arguments(), args))]
    return None


def attr_spec(mx, op: str) -> list | None:
    """[arity, attributes, shapes] of ATTR_CASES' `op`, its other arguments' shapes
    inferred; None where they are not."""
    attrs, given = ATTR_CASES[op]
    k = len(given)
    shapes = {f"x{i}": s for i, s in enumerate(given)}
    try:
        sym = _auto_graph(mx, op, k, attrs)
        args, _, _ = sym.infer_shape(**shapes)
    except Exception:  # noqa: BLE001 - reported as a case with no plain run
        return [k, attrs, shapes]
    return [k, attrs, dict(zip(sym.list_arguments(), args)) if args else shapes]


def _shape_mode(mx, op: str):
    """NumPy shape semantics for MXNet's NumPy operators (as ``npx.set_np()`` has it for a
    model written with ``mx.np``), MXNet's legacy ones for the others."""
    return mx.util.np_shape(op.startswith(("_np_", "_npi_", "_npx_")))


def discover(ops: list[str]) -> None:
    """The child that finds the automatic cases' specs (some operators' shape inference
    kills the process): one line per op. MXNet prints what each failed shape inference was
    given: kept from stdout."""
    import mxnet as mx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op in ops:
            print(json.dumps({"start": op, "cfg": "discover"}), flush=True)
            with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
                with _shape_mode(mx, op):
                    found = attr_spec(mx, op) if op in ATTR_CASES else auto_spec(mx, op)
            print(json.dumps({"case": op, "spec": found}), flush=True)


def auto_specs(mx, only: list[str]) -> tuple[dict[str, list], list[str]]:
    """op -> [arity, attributes, shapes] for every registered operator no hand case covers
    and nothing skips (`only`: of those, just these): ATTR_CASES' own, else auto_spec's where
    it finds one (found in children); and the operators with none."""
    taken = set()
    for b, *_ in hand_cases().values():
        try:
            taken.add(_op_node(b(mx.sym, mx.sym.var("x") * 1))[1])
        except Exception:  # noqa: BLE001 - a case with no plain run says so itself
            pass
    todo = [op for op in registered_ops(mx) if op not in taken and not _skipped(op)
            and (not only or op in only)]
    found = in_children(["--discover"], todo, dict(os.environ, MXNET_SUBGRAPH_VERBOSE="0"))
    unbound = [op + (" (its shape inference killed the process)" if "discover" in rec else "")
               for op, rec in found.items() if not rec.get("spec")]
    return {op: rec["spec"] for op, rec in found.items() if rec.get("spec")}, unbound


def build_cases(mx, specs: dict[str, list]) -> dict:
    """name -> case (build, shapes, integer inputs, dtypes): the hand-written cases (their
    build given `x * 1` as data), then one per automatic spec."""
    cases = {name: (lambda b=b: b(mx.sym, mx.sym.var("x") * 1), *rest)
             for name, (b, *rest) in hand_cases().items()}
    for op, (k, attrs, shapes) in specs.items():
        cases[op] = (lambda op=op, k=k, attrs=attrs: _auto_graph(mx, op, k, attrs),
                     {n: tuple(s) for n, s in shapes.items()}, {}, {})
    return cases


# ------------------------------------------------------------ children and table
def child(todo: list[str], specs_file: str) -> None:
    """Run the cases named (`NAME` or `NAME@CONFIG` to start at that configuration), the
    automatic ones from the specs in `specs_file`."""
    import mxnet as mx
    import numpy as np

    with open(specs_file) as f:
        cases = build_cases(mx, json.load(f))

    def emit(rec):
        print(json.dumps(rec), flush=True)

    for item in todo:
        name, _, first = item.partition("@")
        emit({"start": name, "cfg": first or "plain"})
        with _shape_mode(mx, name):
            run_case(mx, np, name, cases[name], first or CONFIGS[0], emit)


def in_children(args: list[str], todo: list[str], env: dict) -> dict[str, dict]:
    """Run `todo` in children of this script given `args` (a child prints a JSON line
    ``{"start": NAME, "cfg": C}`` before each step and ``{"case": NAME, ...}`` results);
    a step that kills its child is recorded as such (``record[C]``) and the next child
    starts at the step after it: ``NAME@NEXT`` for a sweep's configurations, else the next
    name."""
    results: dict[str, dict] = {t: {"case": t} for t in todo}
    while todo:
        proc = subprocess.Popen([sys.executable, __file__, *args, *todo],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
        out, err = proc.communicate()
        started = None
        for line in out.splitlines():
            if line.startswith("{"):
                rec = json.loads(line)
                if "start" in rec:
                    started = (rec["start"], rec["cfg"])
                else:
                    results[rec["case"]].update(rec)
        if proc.returncode == 0 or started is None:
            break
        name, cfg = started
        tail = [ln for ln in err.splitlines() if ln.strip()][-1:] or [""]
        results[name][cfg] = f"process died ({proc.returncode}): {tail[0][:100]}"
        rest = todo[[t.split("@")[0] for t in todo].index(name) + 1:]
        nxt = CONFIGS[CONFIGS.index(cfg) + 1:] if cfg in CONFIGS else []
        todo = ([f"{name}@{nxt[0]}"] if nxt else []) + rest
    return results


def sweep(names: list[str], mkldnn: bool, specs_file: str) -> dict[str, dict]:
    """Every case in children with MKL-DNN on or off (and glibc's MALLOC_PERTURB_)."""
    env = dict(os.environ, MXNET_MKLDNN_ENABLED="1" if mkldnn else "0", MALLOC_PERTURB_="165",
               MXNET_SUBGRAPH_VERBOSE="0", MXNET_STORAGE_FALLBACK_LOG_VERBOSE="0")
    return in_children(["--specs", specs_file, "--child"], names, env)


def _rule(ops, op: str) -> str:
    """Where ir/ops.py states that `op` must write, if it does."""
    if op in ops.MUST_WRITE:
        return "in MUST_WRITE"
    if op in ops.MUST_WRITE_ON_GPU:
        return "NOT in MUST_WRITE: MUST_WRITE_ON_GPU, not applied"
    if op in ops.MUST_WRITE_IF:
        attr, values = ops.MUST_WRITE_IF[op]
        return f"in MUST_WRITE_IF where {attr} is {' or '.join(sorted(values))}"
    return "NOT in MUST_WRITE"


def _never(ops, op: str) -> bool:
    """Whether mxmirror never mirrors a node of this op (ir/ops.py's blockers)."""
    return ops.is_random(op) or op in ops.STATEFUL or ops.never_mirrored(op)


def verdict(rec: dict) -> str:
    """What one case shows for one MKL-DNN setting."""
    if "plain" in rec:
        return "no plain run"
    u, r, p = rec.get("unread", "?"), rec.get("read", "?"), rec.get("plain2", "?")
    o = rec.get("others", "same")  # only where the op has more than one output
    if p != "same":
        return "not deterministic"
    if r != "same":
        return "differs even when read" if u != "same" else "differs only when read"
    if u == "same" and o == "same":
        return "fine"
    return "UNREAD COPY: " + ("wrong values" if "DIFF" in u + o else "fails")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mkldnn", choices=["both", "on", "off"], default="both")
    ap.add_argument("--no-auto", action="store_true", help="the hand-written cases only")
    ap.add_argument("--only", nargs="*", default=[], help="these cases (or operators)")
    ap.add_argument("--out", help="also write the table to this file")
    ap.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--specs", help=argparse.SUPPRESS)
    ap.add_argument("--discover", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.specs)
        return
    if args.discover is not None:
        discover(args.discover)
        return
    import mxnet as mx

    from mxmirror.ir import ops

    start = time.time()
    hand = hand_cases()
    specs, unbound = ({}, []) if args.no_auto else auto_specs(mx, args.only)
    skipped = [op for op in registered_ops(mx) if _skipped(op)]
    names = [n for n in build_cases(mx, specs) if not args.only or n in args.only]
    settings = {"on": [True], "off": [False], "both": [True, False]}[args.mkldnn]
    with tempfile.TemporaryDirectory() as tmp:
        specs_file = os.path.join(tmp, "specs.json")
        with open(specs_file, "w") as f:
            json.dump(specs, f)
        runs = {m: sweep(names, m, specs_file) for m in settings}
    found: dict[str, set[str]] = {}
    other: dict[str, set[str]] = {}
    rows, fine_auto, no_run = [], 0, []
    for name in names:
        recs = [runs[m][name] for m in settings]
        op = next((r["op"] for r in recs if "op" in r), name)
        verdicts = [verdict(r) for r in recs]
        for v, m in zip(verdicts, settings):
            where = f"{name}, MKL-DNN {'on' if m else 'off'}"
            if v.startswith("UNREAD"):
                found.setdefault(op, set()).add(where)
            elif v not in ("fine", "no plain run"):
                other.setdefault(op, set()).add(f"{where}: {v}")
        if all(v == "no plain run" for v in verdicts):
            why = recs[0].get("plain", "?")
            no_run.append(f"{name} ({why.removeprefix('fails: ')[:70]})")
            continue
        if all(v == "fine" for v in verdicts) and name not in hand:
            fine_auto += 1
            continue
        cells = [v if v in ("fine", "no plain run") else
                 f"{v}: unread {r.get('unread')}; read {r.get('read')}"
                 + (f"; others read {r['others']}" if "others" in r else "")
                 for v, r in zip(verdicts, recs)]
        blocked = " (gradient blocked)" if any(r.get("blocked") for r in recs) else ""
        rows.append(f"| {name}{blocked} | {op} | " + " | ".join(cells) + " |")
    mode = ["MKL-DNN on", "MKL-DNN off"] if len(settings) == 2 else [
        f"MKL-DNN {args.mkldnn}"]
    lines = [
        "# Mirror copies whose first output nobody reads, op by op (MXNet 1.9.1)", "",
        generated_by("scripts/unread_mirror_sweep.py", sys.argv[1:]) + " Do not edit by hand.",
        "",
        f"{len(names)} cases: {sum(n in hand for n in names)} written by hand (every row "
        f"below shows one), the rest every other registered operator with default "
        f"attributes ({fine_auto} of them fine under every setting and not listed). "
        f"{len(no_run)} cases have no plain run to compare with. {time.time() - start:.0f} s.",
        "",
        "| case | op | " + " | ".join(mode) + " |", "|---|---|" + "---|" * len(settings),
        *rows, "",
        "## Op kinds whose unread mirror copy computes wrong values or fails", "",
        *[f"- `{op}` ({_rule(ops, op)}): {'; '.join(sorted(c))}"
          for op, c in sorted(found.items())], "",
        "## Other differences (not the unread-copy rule)", "",
        *[f"- `{op}` ({'never' if _never(ops, op) else 'may be'} mirrored by mxmirror): "
          f"{'; '.join(sorted(c))}" for op, c in sorted(other.items())], "",
        "## Cases with no plain run", "", *[f"- {n}" for n in no_run], "",
        "## Registered operators not tried", "",
        f"Skipped ({len(skipped)}: backward, optimizer, quantization, I/O and executor-internal "
        f"operators): {', '.join(op for op in skipped if not op.startswith('_backward'))} "
        "and the `_backward_*` operators.", "",
        f"No binding found with default attributes ({len(unbound)}; most need attributes or "
        f"take no input: source ops, never mirrored): {', '.join(unbound) or 'none'}.", "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
