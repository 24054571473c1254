"""The segmented executor's per-segment MXNet calls, made straight through MXNet's C API.

A step of the segmented executor pushes thousands of small engine ops (copies into and
out of template slots, gradient sums, forwards of small executors). Through
``NDArray.copyto`` / ``+=`` / ``Executor.forward`` each costs 20-30 us of Python
(argument checks, handle arrays built per call, new output NDArrays); the engine op
itself is the same. These functions push the same computations (``_copy``, elemwise_add,
which computes the same sums as NDArray.__iadd__'s broadcast_add but is much faster on
equal shapes, reset_arrays, ``MXExecutorForward``/``Backward``) with the argument arrays
built by ctypes on the arrays' own handles, once per slot where the slot is fixed
(``copier``, ``zeroer``). ``_copy`` rather than ``_copyto``: an FCompute op, so the engine
bulks the copies between two template runs into one op (``BULK``); ``_copyto`` pushes
each copy on its own.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import cache, partial
from typing import Any

# Engine bulk size while the executor pushes a step: the copies, sums and zeroings between
# two template runs (imperative FCompute ops) go to the engine as one op (a template's
# forward or backward flushes the bulk before its own ops)
BULK = 32


@cache
def _lib() -> tuple:
    from mxnet.base import _LIB, NDArrayHandle, check_call

    return _LIB, check_call, NDArrayHandle


@cache
def _op(name: str) -> ctypes.c_void_p:
    from mxnet.base import c_str

    lib, check_call, _ = _lib()
    h = ctypes.c_void_p()
    check_call(lib.NNGetOpHandle(c_str(name), ctypes.byref(h)))
    return h


def _invoke(op: Any, inputs: list, out: Any) -> None:
    lib, check_call, handle_type = _lib()
    ins = (handle_type * len(inputs))(*[a.handle for a in inputs])
    outs = ctypes.pointer(out.handle)
    stypes = ctypes.POINTER(ctypes.c_int)()
    check_call(lib.MXImperativeInvokeEx(op, len(inputs), ins, ctypes.byref(ctypes.c_int(1)),
                                        ctypes.byref(outs), 0, None, None,
                                        ctypes.byref(stypes)))


def copier(dst: Any) -> Callable[[Any], None]:
    """A function ``f(src)`` doing ``src.copyto(dst)`` into this one NDArray, its C
    arguments built once: a segment's slots are filled thousands of times per step."""
    lib, check_call, handle_type = _lib()
    op = _op("_copy")
    ins = (handle_type * 1)()
    outs = ctypes.pointer(dst.handle)
    call = partial(lib.MXImperativeInvokeEx, op, 1, ins, ctypes.byref(ctypes.c_int(1)),
                   ctypes.byref(outs), 0, None, None,
                   ctypes.byref(ctypes.POINTER(ctypes.c_int)()))
    target = dst.handle.value

    def run(src: Any) -> None:
        if src.handle.value != target:
            ins[0] = src.handle
            check_call(call())

    run.dst = dst  # the handle the arguments point into stays alive with the function
    return run


def zeroer(arrays: list) -> Callable[[], None]:
    """A function setting these NDArrays to 0 in one engine op (``reset_arrays``), its C
    arguments built once; none when the list is empty."""
    if not arrays:
        return _nothing
    lib, check_call, handle_type = _lib()
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


def forward(ex: Any, is_train: bool) -> None:
    """``ex.forward(is_train)`` for an MXNet executor, without re-reading its outputs
    (its output arrays are the same NDArrays from bind on)."""
    lib, check_call = _lib()[:2]
    check_call(lib.MXExecutorForward(ex.handle, ctypes.c_int(int(is_train))))


def backward(ex: Any) -> None:
    """``ex.backward()`` for an MXNet executor whose heads are losses (no head gradients)."""
    lib, check_call = _lib()[:2]
    check_call(lib.MXExecutorBackwardEx(ex.handle, 0, None, 1))


def copy_new(src: Any) -> Any:
    """``src.copy()`` for an NDArray: one ``_copy`` call that allocates its output."""
    from mxnet.ndarray.ndarray import NDArray

    lib, check_call, handle_type = _lib()
    ins = (handle_type * 1)(src.handle)
    outs = ctypes.POINTER(handle_type)()
    check_call(lib.MXImperativeInvokeEx(_op("_copy"), 1, ins, ctypes.byref(ctypes.c_int(0)),
                                        ctypes.byref(outs), 0, None, None,
                                        ctypes.byref(ctypes.POINTER(ctypes.c_int)())))
    return NDArray(handle_type(outs[0]))
