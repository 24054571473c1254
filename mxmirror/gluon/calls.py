"""The planned calls recorded since the last backward() that reached them, per block and
context, and what must not happen beside them.

Every other module reads the same registry: a call takes its position from it, backward()
writes the Parameters' gradients of the calls it lists, and the hook's pre-call check
asks whether a call of the block is pending. So the registry, its lock, the live
PlannedBlocks and the flag that tells mxmirror's own calls of a block from the user's
are kept here, with the rule that refuses a recorded call of the block itself beside a
pending planned call.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any

from mxmirror.adapter.symbol import load_mxnet
from mxmirror.errors import PlanError

MIXED = ("their backwards would update its BatchNorm statistics in an order that changes "
         "from run to run (measured).")

chain_lock = threading.RLock()  # around every read or change of the chains

_chains: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # block -> {ctx: CallChain}
_planned_blocks: weakref.WeakSet = weakref.WeakSet()  # every live PlannedBlock
_watched: weakref.WeakSet = weakref.WeakSet()  # blocks with refuse_mixed_calls as pre-hook
_calling = threading.local()  # .itself: mxmirror is calling the block (tracing, inference)


class Call:
    """One recorded call of a planned executor."""

    def __init__(self, bound: Any, token: Any) -> None:
        self.bound = bound
        self.token = token  # its extra output, the next call's extra input
        self.ran = threading.Event()  # its backward callback has queued its work, or its
        # tape is gone without one
        self.written = False  # backward() has written its Parameters' gradients
        self.outputs_reached = False  # a backward() reached its outputs (not only its token)

    def reached(self) -> bool:
        """A backward() reached it since its Parameters' gradients were last written."""
        return self.bound.probe._fresh_grad

    def free(self) -> bool:
        """No backward of this call is still to come. When backward() has reached it,
        wait until autograd's thread has queued that backward."""
        if self.ran.is_set():
            return True
        if not self.bound.probe._fresh_grad:
            return self.written  # recorded, no backward yet: another call in the record()
        self.wait()
        return True

    def wait(self) -> None:
        """Until the callback of a call backward() has reached has queued its work."""
        if not self.ran.wait(timeout=5):
            load_mxnet().nd.waitall()  # raises what failed upstream, if anything did
            if not self.ran.is_set():
                raise PlanError("the backward of a PlannedBlock call never ran (MXNet "
                                "skipped it); the next call cannot reuse its executor")


class CallChain:
    """The recorded calls of one block on one context since the last one backward() has
    reached, in call order."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.plain = False  # a recorded call of the block itself, not yet backward()ed

    def pending(self) -> bool:
        """A recorded call that no backward() has reached (nor its tape dropped)."""
        return not all(call.free() for call in self.calls)

    def next_position(self) -> int:
        """The next call's position: after the pending ones, or 0 once all are done."""
        if not self.pending():
            self.calls.clear()
        return len(self.calls)


def chain_of(block: Any, ctx: Any) -> CallChain:
    """The chain of `block` on `ctx` (under chain_lock)."""
    return _chains.setdefault(block, {}).setdefault(str(ctx), CallChain())


def chains() -> list[tuple[Any, str, CallChain]]:
    """(block, context, chain) for every block that was called planned (under chain_lock)."""
    return [(block, ctx, chain) for block, by_ctx in list(_chains.items())
            for ctx, chain in by_ctx.items()]


def all_calls() -> list[Call]:
    """Every recorded planned call, of every block and context (under chain_lock)."""
    return [call for _, _, chain in chains() for call in chain.calls]


def register(planned: Any) -> None:
    """A new PlannedBlock: counted for shared Parameters, its block watched for calls of
    the block itself beside a planned one."""
    _planned_blocks.add(planned)
    if planned.block not in _watched:
        _watched.add(planned.block)
        planned.block.register_forward_pre_hook(refuse_mixed_calls)


def shared_with_others(owner: Any) -> set[int]:
    """ids of the Parameters other live PlannedBlocks train (tied weights)."""
    return {id(q) for other in list(_planned_blocks) if other is not owner
            for q in other.block.collect_params().values()}


@contextlib.contextmanager
def calling_block_itself() -> Iterator[None]:
    """mxmirror calling a planned block itself (inference, or tracing its graph): not a
    call of the user's beside a planned one."""
    was = getattr(_calling, "itself", False)
    _calling.itself = True
    try:
        yield
    finally:
        _calling.itself = was


def refuse_mixed_calls(block: Any, inputs: tuple, inside: bool = False) -> None:
    """A forward pre-hook of every planned block: a recorded call of the block itself
    beside a pending planned call of it. Their gradients would add up right, but not
    their BatchNorm statistics: the block's backward runs on the caller's thread, the
    planned call's on autograd's callback thread, in no fixed order."""
    mx = load_mxnet()
    if (getattr(_calling, "itself", False) and not inside) or not mx.autograd.is_recording():
        return
    if not mx.autograd.is_training():
        return  # record(train_mode=False), a validation pass: BatchNorm updates nothing
    arrays = [x for x in inputs if isinstance(x, mx.nd.NDArray)]
    if not arrays or len(arrays) < len(inputs):
        return  # a graph being traced, or inputs a planned call would refuse anyway
    with chain_lock:
        chain = chain_of(block, arrays[0].context)
        if chain.pending():
            raise PlanError(
                f"{block.name} is called unplanned inside autograd.record() while a planned "
                f"call of it (PlannedBlock, or mxmirror run / enabled()) waits for "
                f"backward(): {MIXED} Call it through the PlannedBlock every time in a "
                f"record() (every call is planned), or call backward() between the two")
        chain.plain = True
