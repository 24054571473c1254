"""What a planned call is given and gives back, as Gluon passes it: positional and
keyword arguments, nested lists and tuples of NDArrays with None entries, flattened once
into the executor's inputs; and what autograd recorded about each.

Kept apart from the executors and the tape because the hook reads the same checks to
decide, before anything is bound, whether a call can be planned at all.
"""

from __future__ import annotations

import json
from typing import Any

from mxmirror.adapter.symbol import load_mxnet, symbol_json


class CallArgs:
    """A call's arguments flattened in Gluon's own way (positional, then keyword arguments
    by name): the arrays in order (None where Gluon allows None) and the format that puts
    them back."""

    def __init__(self, args: tuple, kwargs: dict) -> None:
        self.keys = tuple(sorted(kwargs))
        self.flat, self.fmt = _flatten(list(args) + [kwargs[k] for k in self.keys])
        self.arrays = [x for x in self.flat if x is not None]
        n = len(self.arrays)
        self.names = ["data"] if n == 1 else [f"data{i}" for i in range(n)]  # as Gluon's

    def rebuilt(self, values: list) -> tuple[tuple, dict]:
        """(args, kwargs) of the same structure with `values` in place of the arrays."""
        from mxnet.gluon.block import _regroup

        it = iter(values)
        flat = [None if x is None else next(it) for x in self.flat]
        grouped = _regroup(flat, self.fmt)
        args = grouped[:len(grouped) - len(self.keys)]
        return tuple(args), dict(zip(self.keys, grouped[len(args):]))

    def structure(self) -> tuple:
        """What must match for an executor to serve the call (the arrays' shapes aside)."""
        return (repr(self.fmt), self.keys)


def _flatten(args: Any) -> tuple[list, Any]:
    """Gluon's flattening (mxnet.gluon.block._flatten, the same format codes: 0 an array,
    -1 None, a list for a list or tuple), keeping anything else in place for
    `unsupported` to name rather than raising."""
    if isinstance(args, (list, tuple)):
        flat, fmt = [], []
        for a in args:
            f, m = _flatten(a)
            flat.extend(f)
            fmt.append(m)
        return flat, fmt
    return [args], (-1 if args is None else 0)


def first_context(args: Any) -> Any:
    """The context of the first NDArray in (nested) arguments, or None: what a call's
    cheapest checks need, without flattening every argument."""
    mx = load_mxnet()
    if isinstance(args, mx.nd.NDArray):
        return args.context
    if isinstance(args, (list, tuple)):
        for a in args:
            ctx = first_context(a)
            if ctx is not None:
                return ctx
    return None


def unsupported(call: CallArgs) -> str | None:
    """Why a recorded call cannot run on a planned executor, or None."""
    mx = load_mxnet()
    what = "PlannedBlock takes NDArrays (nested in lists or tuples, None allowed) on one context"
    if not call.arrays:
        return f"{what}; got none"
    for i, x in enumerate(call.flat):
        if x is not None and not isinstance(x, mx.nd.NDArray):
            return f"{what}; input {i} is {type(x).__name__}"
        if isinstance(x, mx.nd.sparse.BaseSparseNDArray):
            return f"{what}; input {i} is sparse ({x.stype})"
    contexts = sorted({str(x.context) for x in call.arrays})
    if len(contexts) > 1:
        return f"{what}; got {', '.join(contexts)}"
    return None


def recorded(x: Any) -> dict | None:
    """autograd's recorded graph of x (parsed JSON), or None when x is not on the tape."""
    mx = load_mxnet()
    try:
        return json.loads(symbol_json(mx.autograd.get_symbol(x)))
    except mx.base.MXNetError:
        return None


def variable_name(x: Any) -> str:
    """The name autograd gave the variable x (x must be marked)."""
    return load_mxnet().autograd.get_symbol(x).name


def trained_variable(node: dict) -> bool:
    """A variable of autograd's recorded graph (JSON) that gets a gradient: autograd names
    those var<N>, other arrays null<N>."""
    return node["op"] == "null" and not node["name"].startswith("null")


def dtype_name(dtype: Any) -> str:
    import numpy as np

    return np.dtype(dtype).name


def shapes_text(shapes: dict) -> str:
    """name=AxBxC ... as the log lines print them."""
    return " ".join(f"{n}={'x'.join(map(str, s))}" for n, s in shapes.items())


def nbytes(arrays: list) -> int:
    import numpy as np

    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in arrays)
