"""The segmented executor's per-segment MXNet calls, made straight through MXNet's C API.

A step of the segmented executor pushes thousands of small engine ops (copies into and
out of template slots, gradient sums, forwards of small executors). Through
``NDArray.copyto`` / ``+=`` / ``Executor.forward`` each costs 20-30 us of Python
(argument checks, handle arrays built per call, new output NDArrays); the engine op
itself is the same. These functions push the same computations (copies, elemwise_add,
which computes the same sums as NDArray.__iadd__'s broadcast_add but is much faster on
equal shapes, reset_arrays, ``MXExecutorForward``/``Backward``) with the argument arrays
built by ctypes on the arrays' own handles, once where they are fixed (``zeroer``).

Even so, one imperative call costs MXNet about 10 us (shape, type and storage
inference, a closure per op, the engine's bookkeeping), as much as ten copies of an LSTM
step's boundary value. So the copies between two template runs wait in ``Copies`` and go
as one call per dtype: ``_np_atleast_1d``, an identity per input (``IdentityCompute``,
in input order), an FCompute op that the engine bulks with the other small ops between
two template runs (``BULK``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import cache
from typing import Any

# Engine bulk size while the executor pushes a step: the copies, sums and zeroings between
# two template runs (imperative FCompute ops) go to the engine as one op (a template's
# forward or backward flushes the bulk before its own ops)
BULK = 32


@cache
def mxnet_lib() -> tuple:
    """MXNet's C library, its ``check_call`` and its NDArray handle type."""
    from mxnet.base import _LIB, NDArrayHandle, check_call

    return _LIB, check_call, NDArrayHandle


@cache
def _op(name: str) -> ctypes.c_void_p:
    from mxnet.base import c_str

    lib, check_call, _ = mxnet_lib()
    h = ctypes.c_void_p()
    check_call(lib.NNGetOpHandle(c_str(name), ctypes.byref(h)))
    return h


def _invoke(op: Any, inputs: list, out: Any) -> None:
    lib, check_call, handle_type = mxnet_lib()
    ins = (handle_type * len(inputs))(*[a.handle for a in inputs])
    outs = ctypes.pointer(out.handle)
    stypes = ctypes.POINTER(ctypes.c_int)()
    check_call(lib.MXImperativeInvokeEx(op, len(inputs), ins, ctypes.byref(ctypes.c_int(1)),
                                        ctypes.byref(outs), 0, None, None,
                                        ctypes.byref(stypes)))


class Copies:
    """Copies waiting to be pushed: ``add`` in program order, ``push()`` sends them, one
    ``_np_atleast_1d`` per dtype, whose kernel copies in the order given.

    MXNet skips writing an output whose array is also an input of the same call
    (``SetWriteInplaceReq``: kWriteInplace), so no array may be both: a copy that reads an
    array a pending copy writes reads that copy's source instead, and an array that
    other arrays alias (a BatchNorm statistic: the templates' statistic slots of one name
    are one array; the user's statistics) is named by a key (``src_var``, ``dst_var``), and
    a copy that would write one a pending copy reads, or read one it writes, waits for the
    next call. The arrays are held until pushed."""

    def __init__(self) -> None:
        self._groups: dict[Any, tuple[list, list]] = {}
        self._source: dict[int, Any] = {}  # id of a pending destination -> its source
        self._read: set = set()  # keys of the aliased arrays pending copies read
        self._written: set = set()  # ... and write

    def add(self, src: Any, dst: Any, dtype: Any, src_var: Any = None,
            dst_var: Any = None) -> None:
        """``src.copyto(dst)`` (same shape and dtype), pushed at the next ``push``."""
        if (src_var is not None and src_var in self._written) or \
                (dst_var is not None and dst_var in self._read):
            self.push()
        src = self._source.get(id(src), src)
        if src.handle.value == dst.handle.value:
            return
        group = self._groups.get(dtype)
        if group is None:
            group = self._groups[dtype] = ([], [])
        group[0].append(src)
        group[1].append(dst)
        self._source[id(dst)] = src
        if src_var is not None:
            self._read.add(src_var)
        if dst_var is not None:
            self._written.add(dst_var)

    def push(self) -> None:
        """Push every pending copy."""
        if not self._groups:
            return
        invoke, check_call, op, handles, stypes = _copy_call()
        byref, c_int = ctypes.byref, ctypes.c_int
        for srcs, dsts in self._groups.values():
            n = len(srcs)
            kind = handles(n)
            ins, outs = kind(*[a.handle for a in srcs]), kind(*[a.handle for a in dsts])
            # outputs: the address of a pointer to the handles (NDArrayHandle**)
            check_call(invoke(op, n, ins, byref(c_int(n)),
                              byref(ctypes.c_void_p(ctypes.addressof(outs))), 1, _NUM_ARGS,
                              _count(n), byref(stypes)))
        self._groups, self._source, self._read, self._written = {}, {}, set(), set()


_NUM_ARGS = (ctypes.c_char_p * 1)(b"num_args")


@cache
def _copy_call() -> tuple:
    """What a push of copies calls, looked up once: MXImperativeInvokeEx, check_call, the
    op, the array type of n handles, and where MXNet writes the outputs' storage types
    (never read)."""
    lib, check_call, handle_type = mxnet_lib()
    return (lib.MXImperativeInvokeEx, check_call, _op("_np_atleast_1d"),
            cache(lambda n: handle_type * n), ctypes.POINTER(ctypes.c_int)())


@cache
def _count(n: int) -> Any:
    return (ctypes.c_char_p * 1)(str(n).encode())


def zeroer(arrays: list) -> Callable[[], None]:
    """A function setting these NDArrays to 0 in one engine op (``reset_arrays``), its C
    arguments built once; none when the list is empty."""
    if not arrays:
        return _nothing
    lib, check_call, handle_type = mxnet_lib()
    n = len(arrays)
    ins = (handle_type * n)(*[a.handle for a in arrays])
    keys = (ctypes.c_char_p * 1)(b"num_arrays")
    vals = (ctypes.c_char_p * 1)(str(n).encode())
    fn, op, stypes = lib.MXImperativeInvokeEx, _op("reset_arrays"), ctypes.POINTER(ctypes.c_int)()
    null = ctypes.POINTER(handle_type)

    def run() -> None:  # reset_arrays mutates its inputs; it has no outputs
        check_call(fn(op, n, ins, ctypes.byref(ctypes.c_int(0)), ctypes.byref(null()), 1,
                      keys, vals, ctypes.byref(stypes)))

    run.arrays = arrays
    return run


def _nothing() -> None:
    pass


def add_to(dst: Any, src: Any) -> None:
    """``dst += src`` for two NDArrays of one shape (elemwise_add into dst)."""
    _invoke(_op("elemwise_add"), [dst, src], dst)


def negate(a: Any) -> None:
    """``a = -a`` in place (``negative``): -0 where `a` is 0."""
    _invoke(_op("negative"), [a], a)


def forward(ex: Any, is_train: bool) -> None:
    """``ex.forward(is_train)`` for an MXNet executor, without re-reading its outputs
    (its output arrays are the same NDArrays from bind on)."""
    lib, check_call = mxnet_lib()[:2]
    check_call(lib.MXExecutorForward(ex.handle, ctypes.c_int(int(is_train))))


def backward(ex: Any) -> None:
    """``ex.backward()`` for an MXNet executor whose heads are losses (no head gradients)."""
    lib, check_call = mxnet_lib()[:2]
    check_call(lib.MXExecutorBackwardEx(ex.handle, 0, None, 1))
