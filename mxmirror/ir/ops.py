"""Facts per MXNet operator: cost class, randomness, in-place options, FLOPs.

The in-place options (FInplaceOption, FInplaceIdentity) and ignored inputs
(FIgnoreInputs) are C++-only attributes of MXNet 1.9.1's operators (CPU build
with MKLDNN); the table below was read from its source and checked against
MXNet's own memory figure (tests/test_memory_vs_mxnet.py). An op missing here
gets no in-place reuse, which can only over-estimate memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from math import prod

# ---------------------------------------------------------------- cost classes
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
# The input slots of MXNet's ops that take trained parameters (FullyConnected and
# Convolution weight/bias, BatchNorm gamma/beta, RNN parameters): a variable in any other
# slot (data, label, lhs, state, ...) is an input a user gives a shape to.
PARAMETER_SLOTS = {"weight", "bias", "gamma", "beta", "parameters"}
# Dropout, the one op with rules of its own: MXNet's gradient pass never mirrors it
# (InitFullGraph's need_mirror, whatever its attributes), and the segmented executor replays
# it as its input times a mask drawn once per step, the one random op it can replay.
DROPOUT = "Dropout"
# Never recomputed: fresh randomness would change what training computes. The ops of MXNet
# 1.9.1 that ask for a random resource (kRandom, kParallelRandom), read from its source:
# the NumPy samplers (their gradients flow to their parameters: recomputed, they drew anew,
# scripts/unread_mirror_sweep.py), image augmentation, DGL's neighbour sampling; and
# LeakyReLU with act_type rrelu (a random slope per element in training: RANDOM_IF).
RANDOM_PREFIXES = ("_random_", "random_", "_sample_", "sample_", "_npi_random", "_contrib_rand",
                   "_image_random_", "_contrib_dgl_csr_neighbor")
RANDOM = {DROPOUT, "_shuffle", "shuffle", "RNN",  # RNN: dropout inside the fused cell
          "_npi_bernoulli", "_npi_choice", "_npi_exponential", "_npi_gamma", "_npi_gumbel",
          "_npi_logistic", "_npi_multinomial", "_npi_normal", "_npi_normal_n", "_npi_pareto",
          "_npi_powerd", "_npi_rayleigh", "_npi_uniform", "_npi_uniform_n", "_npi_weibull"}
RANDOM_IF = {"LeakyReLU": ("act_type", {"rrelu"})}
# Ops with state or side effects whose recomputation MXNet cannot replay.
STATEFUL = {"_foreach", "_while_loop", "_cond", "Custom", "_CachedOp", "_contrib_SyncBatchNorm"}
# Ops that must be asked to write their first output. MXNet runs a mirror copy even where
# nothing reads it (its node's backward has a control dependency on it), and gives each of
# its outputs that nothing reads req = kNullOp. Where that is the copy's first output, these
# ops compute nothing at all (LayerNorm and GroupNorm return at once, leaving the mean and
# deviation their backward reads from the copy unwritten: wrong gradients) or fail a check
# on some device (req == kWriteTo, req != kNullOp; raised when the engine runs the copy).
# So a node of one is mirrored only where its copy's first output is read: by its own
# backward or by a consumer's copy (planning/analysis.drop_unread). Measured on CPU, MKL-DNN
# on and off, by scripts/unread_mirror_sweep.py (docs/unread_mirror.md), which tries every
# registered operator; the last group is read from MXNet 1.9.1's source.
MUST_WRITE = {
    # wrong values, everywhere
    "LayerNorm", "GroupNorm",
    # a failed check on CPU with MKL-DNN on and off
    "Embedding", "Convolution_v1", "_contrib_DeformableConvolution", "BilinearSampler",
    "GridGenerator", "Crop", "hard_sigmoid", "pick", "diag", "_np_diag", "_np_diagflat",
    "_np_diagonal", "_npi_pad", "_image_to_tensor",
    # a failed check on CPU with MKL-DNN off (its own kernels check nothing)
    "Convolution", "Deconvolution",
    # kept from before: a check on GPU only (ModulatedDeformableConvolution), on sparse
    # inputs (take), in ops with no gradient the sweep cannot bind (Proposal,
    # MultiProposal), or none found (FullyConnected and L2Normalization return on kNullOp;
    # SyncBatchNorm is never mirrored)
    "take", "FullyConnected", "L2Normalization", "_contrib_SyncBatchNorm",
    "_contrib_ModulatedDeformableConvolution", "_contrib_Proposal", "_contrib_MultiProposal",
}
# Plans for a GPU only: cuDNN's BatchNorm checks req[kOut] == kWriteTo
# (src/operator/nn/cudnn/cudnn_batch_norm-inl.h, 1.9.1), so there a copy whose first output
# nothing reads fails when the engine runs it (read from the source; no GPU here to run it).
# On CPU an unread BatchNorm copy computes what it should (MKL-DNN on and off, measured), and
# holding them back would cost CPU plans 7-19% of their memory (sqrt and search on
# resnet18_v1, mobilenet1.0, resnet50_v2: measured).
MUST_WRITE_ON_GPU = {"BatchNorm", "BatchNorm_v1"}
# Ops that must write for some attribute values only: op -> (attribute, values). Bilinear
# UpSampling runs a Deconvolution that checks req == kWriteTo (MKL-DNN on and off); nearest
# UpSampling writes or not as asked.
MUST_WRITE_IF = {"UpSampling": ("sample_type", {"bilinear"})}


def must_write(op: str | None, attrs: dict[str, str], gpu: bool = False) -> bool:
    """Whether a node of `op` with `attrs` is mirrored only where its copy's first output is
    read (MUST_WRITE, MUST_WRITE_IF; MUST_WRITE_ON_GPU in a plan for a GPU)."""
    if op in MUST_WRITE or (gpu and op in MUST_WRITE_ON_GPU):
        return True
    cond = MUST_WRITE_IF.get(op)
    return cond is not None and attrs.get(cond[0]) in cond[1]


# MKL-DNN (MXNet 1.9.1's CPU build): the ops registered with TIsMKLDNN (aliases included),
# read from its source. Its executor runs every other op by storage fallback
# (src/executor/attach_op_execs_pass.cc), which keeps a default-layout copy of each input
# that arrives in MKL-DNN's own blocked layout for the executor's life (a CachedOp makes one
# per call and frees it). Convolution and Deconvolution choose a blocked layout for their
# outputs (their backward for the data gradient); the layout-kept ops give their input's.
MKLDNN_BLOCKED = {"Convolution", "_backward_Convolution", "Deconvolution",
                  "_backward_Deconvolution"}
MKLDNN_LAYOUT_KEPT = {
    "Activation", "_backward_Activation", "LeakyReLU", "_backward_LeakyReLU", "BatchNorm",
    "_backward_BatchNorm", "_contrib_BatchNormWithReLU", "_backward_contrib_BatchNormWithReLU",
    "Concat", "concat", "_backward_Concat", "Pooling", "_backward_Pooling", "LRN",
    "_backward_LRN", "_copy", "identity", "_backward_copy", "elemwise_add", "_add", "_plus",
    "_Plus", "_backward_add", "add_n", "ElementWiseSum",
}
MKLDNN_OPS = MKLDNN_BLOCKED | MKLDNN_LAYOUT_KEPT | {
    "FullyConnected", "_backward_FullyConnected", "softmax", "_backward_softmax",
    "log_softmax", "_backward_log_softmax", "SoftmaxOutput", "_backward_SoftmaxOutput",
    "Reshape", "reshape", "Flatten", "flatten", "transpose", "expand_dims", "slice", "RNN",
    "_backward_RNN", "amp_cast",
}
LOSSES = {"SoftmaxOutput", "LinearRegressionOutput", "LogisticRegressionOutput",
          "MAERegressionOutput", "SVMOutput", "MakeLoss", "make_loss", "softmax_cross_entropy"}


def is_random(op: str, attrs: dict[str, str] | None = None) -> bool:
    """Whether a node of `op` (with `attrs`) draws random numbers."""
    if op in RANDOM or op.startswith(RANDOM_PREFIXES):
        return True
    cond = RANDOM_IF.get(op)
    return cond is not None and (attrs or {}).get(cond[0]) in cond[1]


def is_cheap(op: str) -> bool:
    return op in CHEAP


def never_mirrored(op: str) -> bool:
    """MXNet makes no mirror copy of this op, whatever its attributes."""
    return op == DROPOUT


def replayed_with_mask(op: str) -> bool:
    """The segmented executor replays this op as its input times a mask drawn once per step."""
    return op == DROPOUT


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


# Read from MXNet 1.9.1 (CPU, MKLDNN) by querying the registered attributes of
# libmxnet itself, cross-checked against its source at tag 1.9.1.
FACTS: dict[str, MemoryFacts] = {
    "Activation": _f(((0, 0),), (False,), ()),
    "BlockGrad": _f(((0, 0),), (True,), ()),
    "Cast": _f(((0, 0),), (True,), ()),
    "Dropout": _f(((0, 0),), (False,), ()),
    "ElementWiseSum": _f(((0, 0),), (False,), ()),
    "Flatten": _f(((0, 0),), (True,), ()),
    "LayerNorm": _f(((0, 0),), (False,), ()),
    "LeakyReLU": _f(((0, 0),), (False,), ()),
    "LinearRegressionOutput": _f(((0, 0),), (False,), ()),
    "LogisticRegressionOutput": _f(((0, 0),), (False,), ()),
    "MAERegressionOutput": _f(((0, 0),), (False,), ()),
    "MakeLoss": _f(((0, 0),), (False,), ()),
    "Reshape": _f(((0, 0),), (True,), ()),
    "SequenceMask": _f(((0, 0),), (False,), ()),
    "SoftmaxActivation": _f(((0, 0),), (False,), ()),
    "SoftmaxOutput": _f(((0, 0),), (False,), ()),
    "_Plus": _f(((0, 0), (1, 0)), (False, False), ()),
    "_backward_Activation": _f(((0, 0),), (False,), ()),
    "_backward_Dropout": _f(((0, 0),), (False,), ()),
    "_backward_FullyConnected": _f(((1, 0),), (False,), ()),
    "_backward_L2Normalization": _f(((0, 0),), (False,), ()),
    "_backward_LeakyReLU": _f(((0, 0),), (False,), ()),
    "_backward_Pooling": _f(((1, 0),), (False,), ()),
    "_backward_SequenceMask": _f(((0, 0),), (False,), ()),
    "_backward_SoftmaxActivation": _f(((0, 0),), (False,), ()),
    "_backward_SoftmaxOutput": _f(((0, 0),), (False,), ()),
    "_backward_add": _f(((0, 0), (0, 1)), (False, False), ()),
    "_backward_broadcast_add": _f(((0, 0), (0, 1)), (False, False), ()),
    "_backward_broadcast_mul": _f(((0, 1),), (False,), ()),
    "_backward_cast": _f(((0, 0),), (True,), ()),
    "_backward_copy": _f(((0, 0),), (True,), ()),
    "_backward_div_scalar": _f(((0, 0),), (False,), ()),
    "_backward_linear_reg_out": _f(((1, 0),), (False,), ()),
    "_backward_log": _f(((0, 0), (1, 0)), (False, False), ()),
    "_backward_log_softmax": _f(((0, 0), (1, 0)), (False, False), ()),
    "_backward_logistic_reg_out": _f(((1, 0),), (False,), ()),
    "_backward_mae_reg_out": _f(((1, 0),), (False,), ()),
    "_backward_mul": _f(((0, 1),), (False,), ()),
    "_backward_mul_scalar": _f(((0, 0),), (False,), ()),
    "_backward_rdiv_scalar": _f(((0, 0), (1, 0)), (False, False), ()),
    "_backward_relu": _f(((0, 0), (1, 0)), (False, False), ()),
    "_backward_reshape": _f(((0, 0),), (True,), ()),
    "_backward_sigmoid": _f(((0, 0), (1, 0)), (False, False), ()),
    "_backward_softmax": _f(((0, 0), (1, 0)), (False, False), ()),
    "_backward_sqrt": _f(((0, 0), (1, 0)), (False, False), ()),
    "_backward_square": _f(((0, 0), (1, 0)), (False, False), ()),
    "_backward_sub": _f(((0, 0), (0, 1)), (False, False), ()),
    "_backward_tanh": _f(((0, 0), (1, 0)), (False, False), ()),
    "_copy": _f(((0, 0),), (True,), ()),
    "_div_scalar": _f(((0, 0),), (False,), ()),
    "_grad_add": _f(((0, 0), (1, 0)), (False, False), ()),
    "_identity_with_attr_like_rhs": _f(((0, 0),), (True,), (1,)),
    "_minus_scalar": _f(((0, 0),), (False,), ()),
    "_mul_scalar": _f(((0, 0),), (False,), ()),
    "_plus": _f(((0, 0), (1, 0)), (False, False), ()),
    "_plus_scalar": _f(((0, 0),), (False,), ()),
    "_rdiv_scalar": _f(((0, 0),), (False,), ()),
    "_rminus_scalar": _f(((0, 0),), (False,), ()),
    "add_n": _f(((0, 0),), (False,), ()),
    "broadcast_add": _f(((0, 0), (1, 0)), (False, False), ()),
    "broadcast_mul": _f(((0, 0), (1, 0)), (False, False), ()),
    "elemwise_add": _f(((0, 0), (1, 0)), (False, False), ()),
    "elemwise_mul": _f(((0, 0), (1, 0)), (False, False), ()),
    "elemwise_sub": _f(((0, 0), (1, 0)), (False, False), ()),
    "exp": _f(((0, 0),), (False,), ()),
    "expand_dims": _f(((0, 0),), (True,), ()),
    "identity": _f(((0, 0),), (True,), ()),
    "log": _f(((0, 0),), (False,), ()),
    "log_softmax": _f(((0, 0),), (False,), ()),
    "make_loss": _f(((0, 0),), (True,), ()),
    "negative": _f(((0, 0),), (False,), ()),
    "ones_like": _f((), (), (0,)),
    "relu": _f(((0, 0),), (False,), ()),
    "reshape_like": _f(((0, 0),), (True,), (1,)),
    "sigmoid": _f(((0, 0),), (False,), ()),
    "softmax": _f(((0, 0),), (False,), ()),
    "sqrt": _f(((0, 0),), (False,), ()),
    "square": _f(((0, 0),), (False,), ()),
    "stop_gradient": _f(((0, 0),), (True,), ()),
    "tanh": _f(((0, 0),), (False,), ()),
    "zeros_like": _f((), (), (0,)),
}
# Where the facts depend on the op's arity (an attribute the training node does not carry).
FACTS_BY_ARITY: dict[tuple[str, int], MemoryFacts] = {
    ("_backward_Pooling", 5): _f(((1, 0),), (False,), ()),  # max pooling, MKLDNN workspace
    ("_backward_Pooling", 3): MemoryFacts(),
    ("_backward_SequenceMask", 2): _f(((0, 1),), (False,), ()),
    ("_backward_softmax", 4): _f(((0, 0), (1, 0), (2, 1), (3, 0)), (False,) * 4, ()),
}


@cache
def memory_facts(op: str, num_inputs: int = -1) -> MemoryFacts:
    return FACTS_BY_ARITY.get((op, num_inputs)) or FACTS.get(op, MemoryFacts())


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
