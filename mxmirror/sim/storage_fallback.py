"""What MXNet's executor keeps beyond its own memory figure with MKL-DNN on: the inputs its
storage fallback copies.

An op without an MKL-DNN kernel (clip, the scalar and broadcast ops, ...) reads its inputs
in the default layout; where an input arrives in MKL-DNN's blocked layout (a Convolution's
output, or a BatchNorm's of it), the bound executor reorders it into a buffer of that node's
own, kept until the executor is freed (StorageFallbackOpExecutor's pre_temp_buf_ and
FComputeExExecutor's in_array_fallback in src/executor/attach_op_execs_pass.cc, tag 1.9.1).
An output it writes in place of such an input (MXNet's planner gives it the input's
storage, and the executor asks kWriteInplace, which leaves the layout as it was) is not
default either: the node keeps a buffer for it too, and casts it back into the blocked
layout. Plain Gluon's CachedOp makes the same copies per call and frees them. A mirror copy
of such an op is one more node with more buffers. Measured on model-zoo MobileNetV2 (ReLU6 is
``clip``), batch 16, 224x224: the executor's peak RSS less its figure less these buffers is
the same for no plan and for sqrt within 4 MB (docs/gluon.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mxmirror.ir import ops
from mxmirror.sim.memory_plan import ELEMENT_BYTES, simulate
from mxmirror.sim.training_graph import TrainingGraph


def fallback_bytes(tg: TrainingGraph) -> int:
    """Bytes of the default-layout copies a bound executor of `tg` keeps with MKL-DNN on
    (4 bytes an element, as MXNet's figure counts)."""
    if not any(any(arrives) for _, _, arrives, _ in _fallback_reads(tg)):
        return 0  # a ResNet: no simulation needed
    storage = simulate(tg).storage  # where MXNet's planner puts each entry
    total = 0
    for t, inputs, arrives, blocked in _fallback_reads(tg):
        total += sum(src.sizes[i] for (src, i), b in zip(t.inputs, arrives) if b)
        in_place = {storage[e] for e, b in zip(inputs, arrives) if b and storage[e] >= 0}
        for k, e in enumerate(range(t.eid, t.eid + len(t.sizes))):
            if storage[e] in in_place:
                total += t.sizes[k]
                blocked.add(e)
    return total * ELEMENT_BYTES


def _fallback_reads(tg: TrainingGraph) -> Iterator[tuple[Any, list[int], list[bool], set[int]]]:
    """Each op without an MKL-DNN kernel, its input entries, which of them arrive in
    MKL-DNN's blocked layout, and the set of blocked entries so far (the caller adds the
    outputs such an op writes in place of a blocked input)."""
    blocked: set[int] = set()
    for t in tg.nodes:
        if t.op is None:
            continue
        inputs = [tg.entry(e) for e in t.inputs]
        arrives = [e in blocked for e in inputs]
        if t.op in ops.MKLDNN_BLOCKED or (t.op in ops.MKLDNN_LAYOUT_KEPT and any(arrives)):
            blocked.update(range(t.eid, t.eid + len(t.sizes)))
        if t.op not in ops.MKLDNN_OPS:
            yield t, inputs, arrives, blocked
