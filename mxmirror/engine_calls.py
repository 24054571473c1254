"""The segmented executor's per-segment MXNet calls, made straight through MXNet's C API.

A step of the segmented executor pushes thousands of small engine ops (copies into and
out of template slots, gradient sums, forwards of small executors). Through
``NDArray.copyto`` / ``+=`` / ``Executor.forward`` each costs 20-30 us of Python
(argument checks, handle arrays built per call, new output NDArrays); the engine op
itself is the same. These functions push the ops those methods push (``_copyto``,
``MXExecutorForward``; for ``+=`` elemwise_add, which computes the same sums as
NDArray.__iadd__'s broadcast_add but is much faster on equal shapes), with the argument
arrays built by ctypes on the arrays' own handles.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any


@cache
def _lib() -> tuple:
    from mxnet.base import _LIB, NDArrayHandle, c_str, check_call

    def handle(name: str) -> ctypes.c_void_p:
        h = ctypes.c_void_p()
        check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(h)))
        return h

    return _LIB, check_call, NDArrayHandle, handle("_copyto"), handle("elemwise_add")


def _invoke(op: Any, inputs: list, out: Any) -> None:
    lib, check_call, handle_type, _, _ = _lib()
    ins = (handle_type * len(inputs))(*[a.handle for a in inputs])
    outs = ctypes.pointer(out.handle)
    stypes = ctypes.POINTER(ctypes.c_int)()
    check_call(lib.MXImperativeInvokeEx(op, len(inputs), ins, ctypes.byref(ctypes.c_int(1)),
                                        ctypes.byref(outs), 0, None, None,
                                        ctypes.byref(stypes)))


def copy(src: Any, dst: Any) -> None:
    """``src.copyto(dst)`` for two NDArrays."""
    if src.handle.value != dst.handle.value:
        _invoke(_lib()[3], [src], dst)


def add_to(dst: Any, src: Any) -> None:
    """``dst += src`` for two NDArrays of one shape (elemwise_add into dst)."""
    _invoke(_lib()[4], [dst, src], dst)


def forward(ex: Any, is_train: bool) -> None:
    """``ex.forward(is_train)`` for an MXNet executor, without re-reading its outputs
    (its output arrays are the same NDArrays from bind on)."""
    lib, check_call = _lib()[:2]
    check_call(lib.MXExecutorForward(ex.handle, ctypes.c_int(int(is_train))))


def alloc_spec(shape: tuple, dtype: Any, ctx: Any) -> tuple:
    """What ``copy_new`` allocates (shape, dtype, context), as MXNDArrayCreate arguments,
    built once per segment output rather than per run."""
    import numpy as np
    from mxnet.base import mx_int64, mx_uint
    from mxnet.ndarray.ndarray import _DTYPE_NP_TO_MX, _int64_enabled

    wide = _int64_enabled()
    dims = ((mx_int64 if wide else ctypes.c_uint) * len(shape))(*shape)
    ndim = (ctypes.c_int if wide else mx_uint)(len(shape))
    return (wide, dims, ndim, ctypes.c_int(ctx.device_typeid), ctypes.c_int(ctx.device_id),
            ctypes.c_int(1),
            ctypes.c_int(_DTYPE_NP_TO_MX[np.dtype(dtype).type]))


def copy_new(src: Any, spec: tuple) -> Any:
    """``src.copy()`` for an NDArray, into a new array allocated per ``alloc_spec``."""
    from mxnet.ndarray.ndarray import NDArray

    lib, check_call, handle_type = _lib()[:3]
    hdl = handle_type()
    create = lib.MXNDArrayCreateEx64 if spec[0] else lib.MXNDArrayCreateEx
    check_call(create(*spec[1:], ctypes.byref(hdl)))
    out = NDArray(hdl)
    _invoke(_lib()[3], [src], out)
    return out
