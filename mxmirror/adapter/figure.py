"""MXNet's own memory figure (``Total X MB allocated``), from binds in child processes.

``python -m mxmirror.adapter.figure`` is the child: it binds the job it reads on stdin and
prints the figure lines of the executor's debug_str.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from mxmirror.adapter.children import ChildFailed, allocated_mb, finish, run_child
from mxmirror.adapter.symbol import load_symbol, symbol_json
from mxmirror.errors import PlanError
from mxmirror.ir.graph import module_default, normalize_grad_req
from mxmirror.progress import task


def mxnet_mb_many(jobs: list[dict]) -> list[int]:
    """MXNet's ``Total X MB allocated`` for several binds, each in its own child process.

    A job: {"symbol": json text, "shapes": {...}, "type_dict": {...} | None,
    "grad_req": {...}, "env": {...}}. Binding happens in a child so that the
    memory it leaves behind (about 0.5 GB for ResNet-1001) and env switches such
    as MXNET_BACKWARD_DO_MIRROR never reach the caller's process.
    """
    out = []
    with task("MXNet's own figures", len(jobs), "binds") as done:
        for job in jobs:
            try:
                mb = allocated_mb(run_child("mxmirror.adapter.figure", stdin=json.dumps(job),
                                            what="binding in MXNet (a child process)",
                                            **job.get("env", {})))
            except ChildFailed as exc:
                raise PlanError(f"MXNet could not bind the symbol: {exc.tail}") from None
            if not mb:
                raise PlanError("MXNet could not bind the symbol: no figure in its output")
            out.append(mb[0])
            done.advance()
    return out


def mxnet_mb(sym, shapes: dict[str, Any], type_dict: dict | None = None, grad_req: Any = None,
             env: dict[str, str] | None = None) -> int:
    """MXNet's own planned-intermediates figure (integer MB) for one bind."""
    sym = load_symbol(sym)
    req = normalize_grad_req(sym.list_arguments(), grad_req, module_default(shapes))
    return mxnet_mb_many([{"symbol": symbol_json(sym), "shapes": {k: list(v) for k, v in
                                                              shapes.items()},
                           "type_dict": type_dict, "grad_req": req, "env": env or {}}])[0]


def _child_bind() -> None:
    import mxnet as mx

    job = json.loads(sys.stdin.read())
    sym = mx.sym.load_json(job["symbol"])
    ex = sym.simple_bind(mx.cpu(), grad_req=job["grad_req"], type_dict=job.get("type_dict"),
                         **{k: tuple(v) for k, v in job["shapes"].items()})
    lines = [ln for ln in ex.debug_str().splitlines() if ln.startswith("Total")]
    finish("\n".join(lines))


if __name__ == "__main__":
    _child_bind()
