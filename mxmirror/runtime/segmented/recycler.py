"""The arrays that hold boundary values and gradients out of the templates, reused.

A step of a segmented plan copies a few boundary values out of the templates after
every run and drops them a few runs later: on the paper LSTM's recursive plan, 1152
arrays per step. A new NDArray and its release cost MXNet a handle, an allocation at
first write and an engine op to free it. A dropped array's handle goes instead to a
free list by shape and dtype, and the next array of that shape takes it (its memory and
engine variable: MXNet orders the new writes after the pending reads of the old value).

What the free lists hold counts: the arrays alive plus those waiting stay within the
plan's own figure for its kept values (``SegmentPlan.dry.peak_bytes``, which the tests
measure the live arrays against); a handle that would go beyond it is freed, and a new
array that needs the room frees waiting ones of other shapes first. ``peak_bytes`` is
what was held at most, alive or waiting.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import cache
from math import prod
from typing import Any

import numpy as np

from mxmirror.runtime.segmented.engine_calls import mxnet_lib


class Recycler:
    """Free lists of NDArray handles by (shape, dtype, context), within `cap_bytes`."""

    def __init__(self, cap_bytes: int) -> None:
        self.cap_bytes = cap_bytes
        self.live_bytes = 0  # arrays handed out and not dropped
        self.free_bytes = 0  # handles waiting in the free lists
        self.peak_bytes = 0  # live + free at most
        self.handed = self.made = 0  # arrays handed out; handles created for them
        self._free: dict[tuple, list] = {}  # key -> handles waiting
        self._sizes: dict[tuple, int] = {}  # key -> bytes of one array

    def allocator(self, like: Any) -> Callable[[], Any]:
        """A function returning an NDArray of `like`'s shape, dtype and context: a waiting
        handle of that kind, else a new one (its memory taken when first written)."""
        from mxnet.base import mx_uint
        from mxnet.ndarray.ndarray import _DTYPE_NP_TO_MX

        shape, dtype, ctx = tuple(like.shape), np.dtype(like.dtype), like.context
        key = (shape, dtype.str, ctx.device_typeid, ctx.device_id)
        size = self._sizes[key] = prod(shape) * dtype.itemsize
        waiting = self._free.setdefault(key, [])
        home = (self, key, size)
        lib, check_call, handle_type = mxnet_lib()
        dims = (mx_uint * len(shape))(*shape)
        args = (dims, len(shape), ctx.device_typeid, ctx.device_id, 1,
                _DTYPE_NP_TO_MX[dtype.type])
        create, recycled = lib.MXNDArrayCreateEx, _recycled_class()

        def new() -> Any:
            self.live_bytes += size
            self.handed += 1
            if waiting:
                self.free_bytes -= size
                array = recycled(waiting.pop())
            else:
                if self.live_bytes + self.free_bytes > self.cap_bytes:
                    self._evict(self.cap_bytes - self.live_bytes)
                h = handle_type()
                check_call(create(*args, ctypes.byref(h)))
                self.made += 1
                self.peak_bytes = max(self.peak_bytes, self.live_bytes + self.free_bytes)
                array = recycled(h)
            array.home = home
            return array

        return new

    def _give(self, key: tuple, handle: Any, size: int) -> None:
        """A dropped array's handle: to its free list, or freed (beyond the cap, or the
        recycler already finalized: the collector may free a cycle of a recycler and its
        arrays in any order)."""
        self.live_bytes -= size
        waiting = self._free.get(key)
        if waiting is not None and self.live_bytes + self.free_bytes + size <= self.cap_bytes:
            waiting.append(handle)
            self.free_bytes += size
        else:
            _release(handle)

    def _evict(self, free_at_most: int) -> None:
        """Free waiting handles until at most `free_at_most` bytes wait (none if < 0)."""
        for key, waiting in self._free.items():
            size = self._sizes[key]
            while waiting and self.free_bytes > max(free_at_most, 0):
                _release(waiting.pop())
                self.free_bytes -= size

    def __del__(self) -> None:
        for waiting in self._free.values():
            for handle in waiting:
                _release(handle)
        self._free = {}


@cache
def _recycled_class() -> type:
    """NDArray whose release hands its handle back to the recycler it came from (`home`:
    the recycler, its free list's key, its bytes). One class, no reference cycle: a
    recycler is freed with the last of its arrays and its executor, not by the collector."""
    from mxnet.ndarray.ndarray import NDArray

    class Recycled(NDArray):
        __slots__ = ("home",)

        def __del__(self) -> None:
            recycler, key, size = self.home
            recycler._give(key, self.handle, size)

    return Recycled


def _release(handle: Any) -> None:
    lib, check_call, _ = mxnet_lib()
    check_call(lib.MXNDArrayFree(handle))
