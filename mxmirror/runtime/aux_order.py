"""Order BatchNorm's running-statistics update before every later use of them.

MXNet 1.9.1's BatchNorm updates its running statistics (the auxiliary states
moving_mean / moving_var) inside its *backward* op, in place (batch_norm.cc
BatchNormBackwardImpl; mkldnn_batch_norm-inl.h MKLDNNBatchNormBackwardImpl;
the native CUDA kernel too; cuDNN does it in the forward). Both ops list them
in FMutateInputs, but the graph executor hands every op input to the engine as
a read (GraphExecutor::InitCachedOps: in_array -> use_vars, only out_array ->
mutate_vars). So the engine does not order a later read of the statistics
after the update: Module.get_params at the end of an epoch (then set_params),
save_checkpoint or a copy can read them stale, and set_params writes the stale
copy back. Plain MXNet has this race; a longer backward (recomputation) loses
it more often.

The fix, per executor: right after backward is pushed, push one engine op that
*writes* every auxiliary state and leaves each bit-identical: amp_multicast
with ``out=`` its own inputs. MXNet's imperative call then passes
kWriteInplace for every output (imperative_utils.h SetWriteInplaceReq), and for
kWriteInplace with equal dtypes amp_multicast's kernels touch no memory
(amp_cast.h AMPMultiCastCompute, amp_cast.cc AMPMultiCastExCPU). An engine
write starts only after every earlier read of its array has finished
(threaded_engine.cc ThreadedVar::AppendWriteDependency waits for
num_pending_reads_ == 0), the backward op's read included; every later read or
write of the array queues behind it. One op per dtype and executor, no wait
in Python.
"""

from __future__ import annotations

import weakref
from typing import Any


def settle(arrays: list) -> None:
    """Push one no-op write per dtype on `arrays` (distinct NDArrays of one context): every
    later engine access to them runs after every op that read them before."""
    import mxnet as mx

    by_dtype: dict[Any, list] = {}
    for a in arrays:
        by_dtype.setdefault(a.dtype, []).append(a)
    for group in by_dtype.values():
        mx.nd.amp_multicast(*group, num_outputs=len(group), out=group)


def order_aux_updates(executor: Any) -> Any:
    """`executor` (an MXNet Executor), its backward (and the executors its reshape returns)
    followed by `settle` on its auxiliary states; other executors are returned unchanged."""
    import mxnet as mx

    if not isinstance(executor, mx.executor.Executor) or not executor.aux_arrays:
        return executor
    if "backward" in vars(executor):  # already ordered
        return executor
    aux = list(executor.aux_arrays)
    ref = weakref.ref(executor)  # no cycle executor -> its own wrapper -> executor
    cls = type(executor)

    def backward(*args: Any, **kwargs: Any) -> None:
        cls.backward(ref(), *args, **kwargs)
        settle(aux)

    def reshape(*args: Any, **kwargs: Any) -> Any:
        return order_aux_updates(cls.reshape(ref(), *args, **kwargs))

    executor.backward = backward
    executor.reshape = reshape
    return executor
