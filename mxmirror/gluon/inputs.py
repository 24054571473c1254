"""What a planned call is given and gives back, read from autograd: the inputs a planned
executor can take, whether each needs a gradient, and what computed it.

Kept apart from the executors and the tape because the hook reads the same checks to
decide, before anything is bound, whether a call can be planned at all.
"""

from __future__ import annotations

import json
from typing import Any

from mxmirror.adapter.symbol import load_mxnet
from mxmirror.errors import PlanError


def check_inputs(inputs: tuple, kwargs: dict) -> None:
    """What a recorded call can take: positional NDArrays on one context."""
    mx = load_mxnet()
    supported = "PlannedBlock takes positional NDArray inputs on one context"
    if kwargs:
        raise PlanError(f"{supported}; got keyword argument(s) {', '.join(sorted(kwargs))}")
    if not inputs:
        raise PlanError(f"{supported}; got none")
    for i, x in enumerate(inputs):
        if not isinstance(x, mx.nd.NDArray):
            raise PlanError(f"{supported}; input {i} is {type(x).__name__}")
        if isinstance(x, mx.nd.sparse.BaseSparseNDArray):
            raise PlanError(f"{supported}; input {i} is sparse ({x.stype})")
    contexts = sorted({str(x.context) for x in inputs})
    if len(contexts) > 1:
        raise PlanError(f"{supported}; got {', '.join(contexts)}")


def check_fed_by_planned(inputs: tuple) -> None:
    """Inputs that need a gradient come from planned calls only. An operator recorded
    before a planned call that needs its input gradient in backward() and takes a
    temp-space resource there (Dense's, measured) is queued before the planned backward's
    work and deadlocks MXNet 1.9.1's engine (block.py's docstring)."""
    for i, x in enumerate(inputs):
        recorded = None if x._fresh_grad else history(x)
        if recorded is None:
            continue  # no history; or a planned call's output (run() marks them), whose
            # inputs were checked at that call; or a variable a backward() has reached
        nodes = json.loads(recorded.tojson())["nodes"]
        ops = sorted({n["op"] for n in nodes} - {"null", "_CustomFunction"})
        wanted = any(trained_variable(n) for n in nodes)
        if ops and wanted:
            raise PlanError(f"input {i} is computed by unplanned operators that need its "
                            f"gradient ({', '.join(ops[:5])}); MXNet 1.9.1 can deadlock "
                            f"when they run beside a planned call (hybridize the block that "
                            f"computes it, so it is planned too)")


def trained_variable(node: dict) -> bool:
    """A variable of autograd's recorded graph (JSON) that gets a gradient: autograd names
    those var<N>, other arrays null<N>."""
    return node["op"] == "null" and not node["name"].startswith("null")


def history(x: Any) -> Any:
    """autograd's recorded graph of x (a Symbol), or None when x is not on the tape."""
    mx = load_mxnet()
    try:
        return mx.autograd.get_symbol(x)
    except mx.base.MXNetError:
        return None


def input_req(x: Any) -> str:
    """'write' when x is on autograd's tape (attached or computed while recording)."""
    return "null" if history(x) is None else "write"


def dtype_name(dtype: Any) -> str:
    import numpy as np

    return np.dtype(dtype).name


def shapes_text(shapes: dict) -> str:
    """name=AxBxC ... as the log lines print them."""
    return " ".join(f"{n}={'x'.join(map(str, s))}" for n, s in shapes.items())


def flatten(out: Any) -> tuple[list, Any]:
    """Gluon's own flattening of a block's (nested) outputs, and their format."""
    from mxnet.gluon.block import _flatten

    return _flatten(out, "output")


def regroup(flat: list, fmt: Any) -> Any:
    """Flat outputs back in the block's (nested) format."""
    from mxnet.gluon.block import _regroup

    return _regroup(flat, fmt)
