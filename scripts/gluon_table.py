"""Memory of model-zoo Gluon networks trained unplanned vs through PlannedBlock.

Three measurements, all printed as Markdown (and, with --out, written into the marked
section of the given page):

1. Per network and policy: the plan's predicted MB beside MXNet's own figure
   (``Total X MB allocated`` of the planned executor's debug_str, bound in a child
   process exactly as PlannedBlock binds it: parameters trained, the input without a
   gradient), and the recompute ratio. PlannedBlock also allocates, on top of MXNet's
   figure, a copy of the weights and one gradient buffer per parameter (backward()
   copies it into Parameter.grad()), the input copy and the output and output-gradient
   copies: the "own arrays" column.
2. Peak RSS of a child process over a few real Trainer steps, plain hybridized vs
   PlannedBlock (a couple of networks; everything else in the process is the same).
3. Step time planned / plain hybridized from the same runs (one run, steps after the
   first, median).

    python scripts/gluon_table.py [--batch 16] [--out docs/gluon.md]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from _bootstrap import ROOT

from mxmirror.adapter.figure import mxnet_mb_many

NETWORKS = ["resnet50_v1", "resnet101_v1", "resnet152_v1", "resnet50_v2", "resnet101_v2",
            "resnet152_v2", "densenet121", "densenet201", "mobilenetv2_1.0", "inceptionv3"]
POLICIES = ["cheap", "sqrt", "optimal"]
START, END = "<!-- gluon_table: start -->", "<!-- gluon_table: end -->"


def image_size(name: str) -> int:
    return 299 if "inception" in name else 224


def model(name: str):
    from mxnet.gluon.model_zoo import vision

    return vision.get_model(name, pretrained=False, classes=1000)


def memory_rows(networks: list[str], policies: list[str], batch: int) -> list[str]:
    import mxnet as mx
    import numpy as np

    import mxmirror
    from mxmirror.ir.symbol_json import strip_json

    head = ("| network | params MB | unplanned: predicted / MXNet MB | "
            + " | ".join(f"{p}: predicted / MXNet MB (x unplanned), recompute" for p in policies)
            + " | own arrays MB |")
    rows = [head, "|" + "---|" * (4 + len(policies))]
    for name in networks:
        net = model(name)
        sym = net(mx.sym.var("data"))
        size = image_size(name)
        shape = (batch, 3, size, size)
        net.initialize()
        arg_shapes, _, _ = sym.infer_shape(data=shape)
        params = {n: s for n, s in zip(sym.list_arguments(), arg_shapes) if n != "data"}
        param_mb = sum(int(np.prod(s)) for s in params.values()) * 4 / 2**20
        req = {n: ("null" if n == "data" else "write") for n in sym.list_arguments()}
        plans = {p: mxmirror.plan(sym, p, grad_req=req, data=shape) for p in policies}
        jobs = [strip_json(sym.tojson())] + [plans[p].symbol.tojson() for p in policies]
        figures = mxnet_mb_many([
            {"symbol": js, "shapes": {"data": list(shape)}, "type_dict": None, "grad_req": req}
            for js in jobs])
        base = figures[0]
        cells = [f"{name} | {param_mb:.0f} | {plans[policies[0]].baseline_mb:.0f} / {base}"]
        for p, fig in zip(policies, figures[1:]):
            pl = plans[p]
            cells.append(f"{pl.planned_mb:.0f} / {fig} ({fig / base:.2f}x), "
                         f"{pl.recompute_ratio:.2f}")
        own = 2 * param_mb + (np.prod(shape) + 2 * batch * 1000) * 4 / 2**20
        rows.append("| " + " | ".join(cells) + f" | {own:.0f} |")
        print(rows[-1], flush=True)
    return rows


def timed_steps(net, mode: str, x, y, steps: int) -> tuple:
    """`steps` Trainer steps (SGD with momentum) of the initialized, hybridized `net`, plain
    (mode "plain") or through PlannedBlock(policy=mode): what ran it, and the wall and
    process CPU seconds of each step."""
    import mxnet as mx
    from mxnet import autograd, gluon

    from mxmirror.gluon import PlannedBlock

    run = net if mode == "plain" else PlannedBlock(net, policy=mode)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01,
                                                          "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    wall, cpu = [], []
    for _ in range(steps):
        t, c = time.perf_counter(), time.process_time()
        with autograd.record():
            loss = loss_fn(run(x), y)
        loss.backward()
        trainer.step(x.shape[0])
        mx.nd.waitall()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return run, wall, cpu


def child(name: str, mode: str, batch: int, steps: int) -> None:
    """Train `steps` Trainer steps; print peak RSS and step times as JSON."""
    import mxnet as mx

    mx.random.seed(0)
    net = model(name)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    size = image_size(name)
    x = mx.nd.random.uniform(shape=(batch, 3, size, size))
    y = mx.nd.array([i % 1000 for i in range(batch)])
    _, times, _ = timed_steps(net, mode, x, y, steps)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"peak_rss_mb": rss, "step_seconds": times}))


def run_child(name: str, mode: str, batch: int, steps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("MXMIRROR_POLICY", None)
    proc = subprocess.run([sys.executable, __file__, "--child", name, mode, str(batch),
                           str(steps)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"child {name} {mode} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rss_rows(networks: list[str], policy: str, batch: int, steps: int,
             timed: str) -> list[str]:
    rows = [f"| network (batch {batch}, {steps} steps) | plain hybridized peak RSS MB | "
            f"PlannedBlock({policy}) peak RSS MB | ratio | step time planned / plain |",
            "|---|---|---|---|---|"]
    for name in networks:
        plain = run_child(name, "plain", batch, steps)
        planned = run_child(name, policy, batch, steps)
        ratio = ""
        if name == timed:
            def median(v):
                s = sorted(v[1:])
                return s[len(s) // 2]
            ratio = (f"{median(planned['step_seconds']) / median(plain['step_seconds']):.2f} "
                     f"({median(planned['step_seconds']):.2f} s / "
                     f"{median(plain['step_seconds']):.2f} s)")
        rows.append(f"| {name} | {plain['peak_rss_mb']:.0f} | {planned['peak_rss_mb']:.0f} | "
                    f"{planned['peak_rss_mb'] / plain['peak_rss_mb']:.2f}x | {ratio} |")
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--networks", default=",".join(NETWORKS))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--rss-networks", default="resnet50_v1,densenet121")
    ap.add_argument("--rss-policy", default="sqrt")
    ap.add_argument("--rss-batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--timed", default="resnet50_v1", help="network whose step time is given")
    ap.add_argument("--out", help="page whose marked table section is rewritten")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        name, mode, batch, steps = args.child
        child(name, mode, int(batch), int(steps))
        return
    import mxnet as mx

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip() or "unknown"
    command = "python scripts/gluon_table.py " + " ".join(argv if argv is not None
                                                          else sys.argv[1:])
    mkldnn = "off" if os.environ.get("MXNET_MKLDNN_ENABLED") == "0" else "on"
    lines = [f"Generated by `{command.strip()}` at commit {commit} (MXNet {mx.__version__}, "
             f"CPU, MKL-DNN {mkldnn}).",
             "",
             f"Memory for intermediates at batch {args.batch} (224x224, Inception-V3 299x299), "
             f"float32, parameters trained, the input without a gradient. Predicted: "
             f"mxmirror's simulation; MXNet: `Total X MB allocated` of the planned "
             f"executor's debug_str (whole MB). Own arrays: what PlannedBlock allocates "
             f"besides (weight copies, parameter-gradient buffers, input and output copies).", ""]
    lines += memory_rows(args.networks.split(","), args.policies.split(","), args.batch)
    lines += ["", "Peak RSS of a child process over real Trainer steps (SGD with momentum), "
              "and the step time of one run (median of the steps after the first):", ""]
    lines += rss_rows(args.rss_networks.split(","), args.rss_policy, args.rss_batch,
                      args.steps, args.timed)
    text = "\n".join(lines) + "\n"
    if args.out:
        page = Path(args.out).read_text()
        if START not in page or END not in page:
            raise SystemExit(f"{args.out} has no {START} ... {END} section")
        head, rest = page.split(START, 1)
        page = head + START + "\n" + text + END + rest.split(END, 1)[1]
        Path(args.out).write_text(page)


if __name__ == "__main__":
    main()
