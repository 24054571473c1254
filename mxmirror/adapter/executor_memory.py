"""What a bound executor holds outside MXNet's figure, in this process: the MKL-DNN layout
copies of its storage fallback, and its graph's own structures.

With MKL-DNN on, MXNet's executor runs an op without an MKL-DNN kernel by storage fallback
and keeps a default-layout copy of each input arriving in MKL-DNN's blocked layout for the
executor's life (sim/storage_fallback.py counts them on the training graph). A mirror copy of
such an op keeps copies of its own, so a plan can hold more than its figure says; plain
Gluon's CachedOp frees its copies after each op. Without MKL-DNN, or with no Convolution
(the only source of blocked values), there are none.

Every node of a bound executor's graph holds memory of its own besides the arrays (the node
and its backward nodes, their op states and array handles): more than plain Gluon's CachedOp
keeps for the same node, and a mirror copy adds one more node. Measured on chains of one
layer kind repeated on tiny arrays (scripts/node_memory.py, docs/gluon.md): elementwise ops
and Dense + relu up to 12.1 KB per node (forward op node beyond the CachedOp, or mirrored
node beyond an unplanned executor), a Convolution or BatchNorm up to 20.4 KB (their
MKL-DNN kernels keep state of their own), in the runs made. NODE_BYTES counts each node by
its op, above the most measured: HEAVY_OPS are those two and, not measured, Deconvolution
and Pooling, whose MKL-DNN kernels keep state alike. One constant for all (20 KB, before)
kept plans that paid from being bound: an LSTM cell unrolled 60 steps, whose plan lowered
the peak RSS by 40-50 MB, counted 59 MB for its 3003 nodes. A plan saving less than its
nodes (a graph of many small ops on small arrays) is not worth binding.

The other way round, with MKL-DNN on the CachedOp holds more than MXNet's executor for every
Convolution: measured over training steps of chains of Convolutions on tiny inputs (the same
script), 0.45 to 1.2 times their weights' bytes (none for FullyConnected, none with MKL-DNN
off; where it comes from inside MXNet was not found). CONV_WEIGHT_SHARE, the least of them,
is credited to an executor that stands in for the CachedOp.

A plan for a GPU (``plan.gpu``) saves device memory, which neither of these is: the nodes'
structures live in host memory and MKL-DNN runs on the CPU only, so there none is counted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from typing import Any

from mxmirror.adapter.symbol import load_mxnet
from mxmirror.ir import ops
from mxmirror.log import mb_text
from mxmirror.sim import training_graph
from mxmirror.sim.storage_fallback import fallback_bytes

# per forward op node and per mirrored node, by op (the module's docstring)
NODE_BYTES = {"heavy": 22 * 2**10, "light": 14 * 2**10}
HEAVY_OPS = frozenset({"Convolution", "Deconvolution", "BatchNorm", "BatchNorm_v1",
                       "_contrib_BatchNormWithReLU", "Pooling"})
CONV_WEIGHT_SHARE = 0.45  # of a Convolution's weight, what the CachedOp holds beyond it


@dataclass(frozen=True)
class OwnMemory:
    """Bytes a planned executor holds outside MXNet's figure, beyond what it is weighed
    against (plain Gluon's CachedOp, or an unplanned executor)."""

    nodes: int  # how many of its graph's nodes cost more
    structures: int  # those nodes' own memory
    layout: int  # MKL-DNN layout copies
    credit: int = 0  # what the CachedOp it stands in for holds beyond it (Convolution weights)

    @property
    def total(self) -> int:
        """Its own bytes less what the CachedOp it stands in for would hold beyond it (may be
        below 0: the executor holds less)."""
        return self.further - self.credit

    @property
    def further(self) -> int:
        """What one more executor of the graph adds, beside one that stands in for the
        CachedOp already."""
        return self.structures + self.layout

    def text(self, credited: bool = True) -> str:
        """What it is, for a log line: 'the structures of its N nodes (X) and ...' (without
        the credit: what a further executor adds)."""
        out = f"the structures of its {self.nodes} nodes ({mb_text(self.structures / 2**20)})"
        if self.layout:
            out += (f" and the MKL-DNN layout copies it keeps for ops run without MKL-DNN "
                    f"({mb_text(self.layout / 2**20)})")
        if self.credit and credited:
            out += (f", less what plain Gluon's CachedOp holds beyond it for the "
                    f"Convolutions' weights with MKL-DNN ({mb_text(self.credit / 2**20)})")
        return out


@cache
def mkldnn_on() -> bool:
    """MXNet runs MKL-DNN kernels in this process (built with it, not turned off at start)."""
    return load_mxnet().runtime.Features().is_enabled("MKLDNN") and \
        os.environ.get("MXNET_MKLDNN_ENABLED") != "0"


def _has_blocked_values(plan: Any) -> bool:
    return mkldnn_on() and any(op in ops.MKLDNN_BLOCKED for _, op in plan.nodes)


def layout_copies(plan: Any) -> int:
    """The layout copies the plan's bound executors keep: the one, or a segmented plan's
    template executors."""
    if not _has_blocked_values(plan):
        return 0
    return sum(fallback_bytes(tg) for tg in plan.executor_graphs())


def unplanned_layout_copies(plan: Any) -> int:
    """The layout copies an unplanned bound executor of the plan's graph keeps."""
    if not _has_blocked_values(plan):
        return 0
    return fallback_bytes(training_graph.build(plan.graph, set()))


def node_bytes(ops_of_nodes: Any) -> int:
    """What the nodes of these ops hold of their own in a bound executor."""
    return sum(NODE_BYTES["heavy" if op in HEAVY_OPS else "light"] for op in ops_of_nodes)


def _mirrored_ops(plan: Any) -> list[str]:
    return [plan.nodes[i][1] for i in plan.recomputed_ids]


def beyond_cached_op(plan: Any) -> OwnMemory:
    """What the plan's executor holds outside MXNet's figure that plain Gluon's CachedOp of
    the same graph does not: every forward op node and every mirrored node, and its layout
    copies (the CachedOp frees its own after each op); with MKL-DNN on, less a share of the
    Convolutions' weights, which the CachedOp holds beyond the executor."""
    counted = [op for _, op in plan.nodes if op != "null"] + _mirrored_ops(plan)
    nodes = len(counted)
    if plan.gpu:
        return OwnMemory(nodes, 0, 0)
    credit = 0
    if mkldnn_on():
        graph = plan.graph
        weights = {n.inputs[1][0] for n in graph.op_nodes
                   if n.op == "Convolution" and len(n.inputs) > 1}
        credit = int(CONV_WEIGHT_SHARE * sum(graph.nodes[w].out_bytes() for w in weights))
    return OwnMemory(nodes, node_bytes(counted), layout_copies(plan), credit)


def beyond_unplanned(plan: Any) -> OwnMemory:
    """What the plan's executor holds outside MXNet's figure that an unplanned executor of
    the same graph does not: its mirrored nodes, and the layout copies its mirror copies add."""
    nodes = len(plan.recomputed_ids)
    if plan.gpu:
        return OwnMemory(nodes, 0, 0)
    return OwnMemory(nodes, node_bytes(_mirrored_ops(plan)),
                     max(0, layout_copies(plan) - unplanned_layout_copies(plan)))
