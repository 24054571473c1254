"""How far a segmented plan's training moves from plain MXNet's with MKL-DNN on, beside how
far plain MXNet moves when its input changes by one part in a million.

With MKL-DNN on, a value crossing into one of the segmented executor's sub-executors
arrives in plain layout where the unplanned executor had a blocked one, and BatchNorm then
reduces in another order (docs/recursive.md, "MKL-DNN numerics"). Whether the difference
that follows is the plan's or plain MXNet's own sensitivity shows side by side: per SGD step,
each parameter gradient's largest difference over that gradient's largest magnitude, for
(a) the recursive plan against the unplanned executor and (b) the unplanned executor
against itself with the data multiplied by (1 + 1e-6). Same initial values, same updates.

    python scripts/layout_sensitivity.py [--depth 110] [--batch 4] [--steps 3]
        [--out docs/recursive.md]

The MKL-DNN on and off rows come from child processes of their own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
from _bootstrap import ROOT  # noqa: F401 (this checkout importable)
from provenance import generated_by, write_section

PERTURBATION = 1e-6
LEARNING_RATE = 0.05


def _bind(sym, shapes: dict, req: dict, policy: str | None):
    import mxnet as mx

    from mxmirror.api import prepare

    if policy is None:
        return sym.simple_bind(mx.cpu(), grad_req=req, **shapes)
    plan = prepare(sym, grad_req=req, **shapes).own_plan(policy)
    if plan.execution.kind != "segmented":
        raise SystemExit(f"the {policy} plan of this network runs on MXNet's own executor")
    return plan.bind(mx.cpu(), symbol=sym, grad_req=req, **shapes)


def _differences(a, b, trained: list[str]) -> list[float]:
    """Per trained argument: max |a - b| over max |a| of its gradient."""
    out = []
    for n in trained:
        x, y = a.grad_dict[n].asnumpy(), b.grad_dict[n].asnumpy()
        out.append(float(np.abs(x - y).max() / (np.abs(x).max() or 1.0)))
    return out


def measure(depth: int, batch: int, steps: int) -> list[dict]:
    """Per step: median and largest relative gradient difference of both pairs."""
    from symbols.resnet import resnet_by_depth

    sym = resnet_by_depth(depth, bottleneck=False, num_classes=10, image_shape=(3, 32, 32))
    shapes = {"data": (batch, 3, 32, 32), "softmax_label": (batch,)}
    req = {a: ("null" if a in shapes else "write") for a in sym.list_arguments()}
    trained = [a for a in sym.list_arguments() if req[a] == "write"]
    plain, planned = _bind(sym, shapes, req, None), _bind(sym, shapes, req, "recursive")
    nudged = _bind(sym, shapes, req, None)
    rng = np.random.RandomState(0)
    start = {n: (rng.randint(0, 10, a.shape) if n == "softmax_label"
                 else rng.uniform(-0.1, 0.1, a.shape)) for n, a in plain.arg_dict.items()}
    for ex in (plain, planned, nudged):
        for n, v in start.items():
            ex.arg_dict[n][:] = v * (1 + PERTURBATION) if ex is nudged and n == "data" else v
        for n, a in ex.aux_dict.items():
            a[:] = 1.0 if "var" in n else 0.0
    rows = []
    for step in range(1, steps + 1):
        for ex in (plain, planned, nudged):
            ex.forward(is_train=True)
            ex.backward()
        row = {"step": step}
        for key, other in (("plan", planned), ("nudged", nudged)):
            d = sorted(_differences(plain, other, trained))
            row[key] = (d[len(d) // 2], d[-1])
        rows.append(row)
        for ex in (plain, planned, nudged):
            for n in trained:
                ex.arg_dict[n][:] = ex.arg_dict[n] - LEARNING_RATE * ex.grad_dict[n]
    return rows


def _child_rows(args, mkldnn: bool) -> list[dict]:
    """measure() in a child process with MKL-DNN on or off (read when MXNet loads)."""
    env = dict(os.environ, MXNET_MKLDNN_ENABLED="1" if mkldnn else "0")
    proc = subprocess.run([sys.executable, __file__, "--child", "--depth", str(args.depth),
                           "--batch", str(args.batch), "--steps", str(args.steps)],
                          capture_output=True, text=True, env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, default=110)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", help="page whose marked section is rewritten")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.depth, args.batch, args.steps)))
        return
    lines = [generated_by("scripts/layout_sensitivity.py", sys.argv[1:] if argv is None
                          else argv), "",
             f"CIFAR ResNet-{args.depth}, batch {args.batch}, 3x32x32, SGD (lr "
             f"{LEARNING_RATE}): per step, each parameter gradient's largest difference over "
             f"its largest magnitude, median and largest over the parameters.", "",
             "| MKL-DNN | step | recursive plan vs unplanned: median / largest | unplanned vs "
             f"unplanned with data x (1 + {PERTURBATION:g}): median / largest |",
             "|---|---|---|---|"]
    for mkldnn in (True, False):
        for r in _child_rows(args, mkldnn):
            lines.append(f"| {'on' if mkldnn else 'off'} | {r['step']} | {r['plan'][0]:.1e} / "
                         f"{r['plan'][1]:.1e} | {r['nudged'][0]:.1e} / {r['nudged'][1]:.1e} |")
    write_section(args.out, "layout_sensitivity", lines)


if __name__ == "__main__":
    main()
