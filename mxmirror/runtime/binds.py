"""MXNet's own binds, whether or not the bind hook wraps them, and MXNet's rule for lending
an array through ``shared_buffer``."""

from __future__ import annotations

from math import prod
from typing import Any

from mxmirror.adapter.symbol import load_mxnet

# Symbol.simple_bind / Symbol.bind as MXNet defines them, saved by the bind hook before it
# wraps them: mxmirror's own binds (sub-executors, fallbacks) must not be planned again
UNHOOKED: dict[str, Any] = {}


def unhooked(name: str) -> Any:
    """MXNet's own ``Symbol.<name>`` (simple_bind or bind), whether or not the hook is on."""
    return UNHOOKED.get(name) or getattr(load_mxnet().sym.Symbol, name)


def buffer_lends(buffers: dict | None, name: str, shape: tuple, dtype: str) -> bool:
    """Whether MXNet's shared_buffer rule lends `name` here: as large, same dtype."""
    import numpy as np

    buf = (buffers or {}).get(name)
    return buf is not None and buf.size >= prod(shape) and np.dtype(buf.dtype) == np.dtype(dtype)


def leading_view(buf: Any, shape: tuple) -> Any:
    """The first prod(shape) elements of `buf` as an array of `shape` (shared memory), as
    MXNet's shared_buffer does for a smaller bucket (NDArray.reshape wants equal sizes)."""
    if tuple(buf.shape) == tuple(shape):
        return buf
    return buf.reshape((-1,))[:prod(shape)].reshape(shape)
