"""A node on autograd's tape whose backward is a Python callback: MXNet's C API
MXCustomFunctionRecord, called through ctypes.

mx.autograd.Function is not used: its backward stops at the first input whose req is null
and silently skips req 'add' (MXNet 1.9.1), and a block's input often has no gradient
while the probe after it needs one. Kept alone because it is the one place that speaks
MXNet's C calling convention.
"""

from __future__ import annotations

import ctypes
import traceback
from typing import Any

from mxmirror.log import log

_REQ = {0: "null", 1: "write", 2: "write", 3: "add"}  # MXNet's OpReqType codes

_BACKWARD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int,
                             ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int),
                             ctypes.c_int, ctypes.c_void_p)


_DELETE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


_alive: dict[int, Any] = {}  # callbacks autograd still holds, by record id


_counter = [0]


def record_function(inputs: list, outputs: list, backward: Any, release: Any) -> None:
    """Put outputs = f(inputs) on autograd's tape; backward(out_grads, in_grads, reqs)
    fills in_grads honouring each req ('null', 'write', 'add'); release() runs once
    autograd drops the node (its graph freed, or backward done without retain_graph)."""
    from mxnet.base import _LIB, MXCallbackList, NDArrayHandle, c_array, c_handle_array, check_call
    from mxnet.ndarray import NDArray

    _counter[0] += 1
    key = _counter[0]

    def on_backward(num_out, num_in, ptrs, reqs, _is_train, _state):
        try:
            out_grads = [NDArray(ctypes.cast(ptrs[i], NDArrayHandle), writable=False)
                         for i in range(num_out)]
            in_grads = [NDArray(ctypes.cast(ptrs[num_out + i], NDArrayHandle), writable=True)
                        for i in range(num_in)]
            backward(out_grads, in_grads, [_REQ[reqs[i]] for i in range(num_in)])
        except Exception:  # noqa: BLE001 - a C callback must not raise
            log.error("mxmirror: PlannedBlock backward failed:\n" + traceback.format_exc())
            return False
        return True

    def on_delete(_state):
        release()
        _alive.pop(key, None)
        return True

    callbacks = [_BACKWARD(on_backward), _DELETE(on_delete)]
    casted = [ctypes.cast(c, ctypes.CFUNCTYPE(ctypes.c_int)) for c in callbacks]
    context = MXCallbackList(
        ctypes.c_int(len(casted)),
        ctypes.cast(c_array(ctypes.CFUNCTYPE(ctypes.c_int), casted),
                    ctypes.POINTER(ctypes.CFUNCTYPE(ctypes.c_int))),
        ctypes.cast(c_array(ctypes.c_void_p, [None] * len(casted)),
                    ctypes.POINTER(ctypes.c_void_p)))
    _alive[key] = (callbacks, context)
    check_call(_LIB.MXCustomFunctionRecord(
        ctypes.c_int(len(inputs)), c_handle_array(inputs),
        ctypes.c_int(len(outputs)), c_handle_array(outputs), ctypes.byref(context)))
