"""The whole segmented plan as allocated, measured in a child process.

MXNet's ``Total X MB allocated`` of one executor is the storage its memory plan
uses; the template executors of a SegmentedExecutor all take theirs from one pool,
so their figures overlap and are not summed. What the plan really holds is the
pool (the owner executor's blocks), the BatchNorm statistics the owner holds (with
the arrays of its BatchNorm ops that hold them), every slot array bound to a template
(shared activation slots once, each template's own parameter slots and gradients), the
copies of the outputs, the Dropout masks, and the arrays holding kept boundary values
and gradients at their peak, alive or waiting for reuse (``recycler``: measured over
real steps when any are run, else the dry run of the same operations, which the tests
check equals the measured peak).

``python -m mxmirror.runtime.segmented.measure JOB`` is the child: it reads the pickled
segment plan, symbol and step count from JOB and prints one JSON object (MB, exact bytes).
"""

from __future__ import annotations

import json
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

from mxmirror.adapter.children import ChildFailed, allocated_mb, finish, last_json, run_child
from mxmirror.errors import PlanError
from mxmirror.runtime.segmented.steps import array_bytes
from mxmirror.segments.cost import pool_blocks


def allocated_bytes(ex: Any) -> dict[str, int]:
    """Bytes of every array a bound SegmentedExecutor holds, by part (see module doc)."""
    templates, runner = ex.templates, ex.runner
    owner = templates.owner
    pool = statistics = 0
    if owner is not None:  # its first outputs are the pool's blocks, then the statistics'
        blocks = sum(1 for b in pool_blocks(ex.plan.template_blocks) if b)
        pool = sum(array_bytes(a) for a in list(owner.outputs)[:blocks])
        statistics = sum(array_bytes(a) for a in list(owner.outputs)[blocks:]
                         + list(owner.arg_arrays) + list(owner.aux_arrays))
    slots = templates.slot_buffer
    shared = sum(array_bytes(a) for a in slots.values())
    own = 0
    for key, t in templates.executors.items():
        for name, a in t.arg_dict.items():
            lent = name in slots or (key, name) in templates.user_bound
            own += 0 if lent else array_bytes(a)
        for name, g in t.grad_dict.items():
            lent = "grad of " + name in slots or (key, name) in templates.grad_bound
            own += 0 if g is None or lent else array_bytes(g)
    masks = sum(array_bytes(a) for a in list(runner.ones.values()) + list(runner.masks.values()))
    ran = runner.forward_flops_run > 0
    kept = runner.recycler.peak_bytes if ran else ex.plan.dry.peak_bytes
    out = {"pool": pool, "slots": shared + own, "outputs": sum(array_bytes(a) for a in ex.outputs),
           "masks": masks if ran else ex.plan.mask_bytes, "statistics": statistics,
           "kept": kept}
    out["total"] = sum(out.values())
    return out


def measure(segment_plan: Any, symbol_json: str, steps: int = 0) -> dict:
    """Bind `segment_plan` for `symbol_json` in a child (see _child), run `steps` training
    steps there: the measured and predicted figures, in MB."""
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.pickle"
        job.write_bytes(pickle.dumps((segment_plan, symbol_json, steps)))
        try:
            return last_json(run_child("mxmirror.runtime.segmented.measure", str(job)))
        except ChildFailed as exc:
            raise PlanError(f"could not bind the segmented plan: {exc.tail}") from None


def _child(path: str) -> None:
    """Bind a SegmentedExecutor, run `steps` training steps on random inputs, print JSON."""
    import mxnet as mx
    import numpy as np

    from mxmirror.runtime.segmented.executor import SegmentedExecutor

    sp, symbol_json, steps = pickle.loads(Path(path).read_bytes())
    sym = mx.sym.load_json(symbol_json)
    ex = SegmentedExecutor(sym, mx.cpu(), sp)
    rng = np.random.RandomState(0)
    for _ in range(steps):
        for name, a in ex.arg_dict.items():
            a[:] = rng.randint(0, 2, a.shape) if "label" in name else \
                rng.uniform(-1, 1, a.shape)
        ex.forward(is_train=True)
        ex.backward()
        mx.nd.waitall()
    measured = allocated_bytes(ex)
    figures = [allocated_mb(t)[0] for t in ex.executors.values()]
    predicted = {"pool": sp.pool_bytes, "slots": sp.staging_bytes, "outputs": sp.output_bytes,
                 "masks": sp.mask_bytes, "statistics": sp.statistics_bytes,
                 "kept": sp.dry.peak_bytes, "total": sp.planned_bytes}
    user = sum(array_bytes(a) for d in (ex.arg_dict, ex.grad_dict, ex.aux_dict)
               for a in d.values() if a is not None)
    finish(json.dumps({"measured_mb": _mb(measured), "user_mb": round(user / 2**20, 3),
                      "predicted_mb": _mb(predicted), "measured_bytes": measured,
                      "predicted_bytes": predicted, "user_bytes": user,
                      "template_mxnet_mb": figures, "steps": steps}))


def _mb(parts: dict[str, int]) -> dict[str, float]:
    return {k: round(v / 2**20, 3) for k, v in parts.items()}


if __name__ == "__main__":
    _child(sys.argv[1])
