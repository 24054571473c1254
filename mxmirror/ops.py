"""Facts per MXNet operator: cost class, randomness, in-place options, FLOPs.

The in-place options (FInplaceOption, FInplaceIdentity) and ignored inputs
(FIgnoreInputs) are C++-only attributes of MXNet 1.9.1's operators (CPU build
with MKLDNN); the table below was read from its source and checked against
MXNet's own memory figure (tests/test_memory_vs_mxnet.py). An op missing here
gets no in-place reuse, which can only over-estimate memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod

# ---------------------------------------------------------------- cost classes
EXPENSIVE = {
    "Convolution", "Deconvolution", "FullyConnected", "dot", "batch_dot", "RNN",
    "Embedding", "_contrib_DeformableConvolution", "linalg_gemm", "linalg_gemm2",
}
CHEAP = {
    "BatchNorm", "Activation", "LeakyReLU", "relu", "sigmoid", "tanh", "softsign",
    "elemwise_add", "elemwise_sub", "elemwise_mul", "elemwise_div", "_Plus", "_plus",
    "_Minus", "_minus", "_Mul", "_mul", "_Div", "_div", "add_n", "ElementWiseSum",
    "broadcast_add", "broadcast_sub", "broadcast_mul", "broadcast_div", "broadcast_plus",
    "_plus_scalar", "_minus_scalar", "_rminus_scalar", "_mul_scalar", "_div_scalar",
    "_rdiv_scalar", "_PlusScalar", "_MinusScalar", "_MulScalar", "_DivScalar",
    "Flatten", "flatten", "Reshape", "reshape", "expand_dims", "squeeze", "transpose",
    "SwapAxis", "swapaxes", "SliceChannel", "split", "slice", "slice_axis", "Cast", "cast",
    "identity", "_copy", "clip", "exp", "log", "square", "sqrt", "negative", "abs",
    "Pooling", "LRN", "InstanceNorm", "LayerNorm", "L2Normalization", "Concat", "concat",
    "stack", "UpSampling", "Crop", "Pad", "pad", "softmax", "log_softmax",
    "SoftmaxActivation", "mean", "sum", "max", "min", "tile", "repeat", "where",
}
# Never recomputed: fresh randomness would change what training computes.
RANDOM_PREFIXES = ("_random_", "random_", "_sample_", "sample_", "_npi_random", "_contrib_rand")
RANDOM = {"Dropout", "_shuffle", "shuffle", "RNN"}  # RNN: dropout inside the fused cell
# Ops with state or side effects whose recomputation MXNet cannot replay.
STATEFUL = {"_foreach", "_while_loop", "_cond", "Custom", "_CachedOp", "_contrib_SyncBatchNorm"}
LOSSES = {"SoftmaxOutput", "LinearRegressionOutput", "LogisticRegressionOutput",
          "MAERegressionOutput", "SVMOutput", "MakeLoss", "make_loss", "softmax_cross_entropy"}


def is_random(op: str) -> bool:
    return op in RANDOM or op.startswith(RANDOM_PREFIXES)


def is_cheap(op: str) -> bool:
    return op in CHEAP


def is_expensive(op: str) -> bool:
    return op in EXPENSIVE or op not in CHEAP


# ------------------------------------------------------------ memory planner facts
@dataclass(frozen=True)
class MemoryFacts:
    inplace: tuple[tuple[int, int], ...] = ()
    identity: tuple[bool, ...] = ()
    ignore_inputs: frozenset[int] = frozenset()


def _f(pairs=((0, 0),), identity=None, ignore=()) -> MemoryFacts:
    pairs = tuple(tuple(p) for p in pairs)
    ident = tuple(identity) if identity is not None else (False,) * len(pairs)
    return MemoryFacts(pairs, ident, frozenset(ignore))


_IDENT = _f(((0, 0),), (True,))
_UNARY = _f(((0, 0),))
_BINARY = _f(((0, 0), (1, 0)))

FACTS: dict[str, MemoryFacts] = {
    # element-wise unary (MXNET_OPERATOR_REGISTER_UNARY) and their backward
    **{op: _UNARY for op in (
        "Activation", "_backward_Activation", "relu", "sigmoid", "tanh", "softsign", "exp",
        "log", "square", "sqrt", "negative", "abs", "clip",
        "_plus_scalar", "_minus_scalar", "_rminus_scalar", "_mul_scalar", "_div_scalar",
        "_rdiv_scalar", "_backward_mul_scalar", "_backward_div_scalar",
        "Dropout", "_backward_Dropout", "LeakyReLU", "_backward_LeakyReLU",
        "SoftmaxOutput", "_backward_SoftmaxOutput",
    )},
    **{op: _IDENT for op in (
        "Flatten", "Reshape", "_backward_copy", "_copy", "identity", "_backward_reshape",
        "expand_dims", "_backward_expand_dims", "BlockGrad", "make_loss", "MakeLoss",
        "squeeze", "_backward_squeeze", "Cast", "reshape_like",
    )},
    "_identity_with_attr_like_rhs": _f(((0, 0),), (True,), ignore=(1,)),
    # element-wise binary and sums
    **{op: _BINARY for op in (
        "elemwise_add", "elemwise_sub", "elemwise_mul", "elemwise_div", "_grad_add",
        "_backward_add", "_backward_sub",
    )},
    "add_n": _f(((0, 0),)),
    "ElementWiseSum": _f(((0, 0),)),
    "_backward_relu": _UNARY, "_backward_sigmoid": _UNARY, "_backward_tanh": _UNARY,
    "_backward_FullyConnected": _f(((1, 0),)),
    "_zeros_without_dtype": MemoryFacts(),
    "zeros_like": MemoryFacts(),
}


@lru_cache(maxsize=None)
def memory_facts(op: str) -> MemoryFacts:
    return FACTS.get(op, MemoryFacts())


# ------------------------------------------------------------------- FLOPs
def flops(op: str, attrs: dict[str, str], in_shapes: list[tuple], out_shapes: list[tuple]) -> float:
    """A forward FLOP estimate: multiply-adds x2 for the dense ops, elements otherwise."""
    out = prod(out_shapes[0]) if out_shapes else 0
    if op in ("Convolution", "Deconvolution") and len(in_shapes) > 1:
        w = in_shapes[1]
        per_out = prod(w[1:]) if op == "Convolution" else prod(w[2:]) * w[0]
        base = out if op == "Convolution" else prod(in_shapes[0])
        return 2.0 * base * per_out
    if op == "FullyConnected" and len(in_shapes) > 1:
        return 2.0 * out * in_shapes[1][-1]
    if op in ("dot", "batch_dot") and len(in_shapes) > 1:
        a = in_shapes[0]
        k = a[-1] if attrs.get("transpose_a", "False").lower() not in ("true", "1") else a[-2]
        return 2.0 * out * k
    if op == "RNN" and len(in_shapes) > 1:
        return 2.0 * prod(in_shapes[0]) * in_shapes[1][0] / max(1, in_shapes[0][-1])
    if op == "BatchNorm":
        return 4.0 * out
    if op == "Pooling":
        k = attrs.get("kernel", "(1,1)").strip("()").split(",")
        try:
            return float(out * prod(int(x) for x in k if x.strip()))
        except ValueError:
            return float(out)
    return float(sum(prod(s) for s in out_shapes) or out)
