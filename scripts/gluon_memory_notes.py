"""Where a Gluon process's memory goes, beside scripts/gluon_table.py's peak RSS: the
figures docs/gluon.md reads that table with.

1. The word-level LM (scripts/gluon_table.py's, fused, stacked, and with the loss inside
   the block): MXNet's planner simulated for no plan and for the sqrt and search plans,
   what plain Gluon keeps for the backward, and the block's output (T x batch x vocab).
2. mxmirror's own cost in a process whose plan is not used: MobileNetV2 at batch 8, 32x32,
   3 steps, plain hybridized, with mxmirror imported, through a PlannedBlock whose calls
   return at once, through one whose plan is made and not used, and through one whose
   plan is made in a forked child (os.fork; MXNet's fork handlers stop its engine's
   threads and start new ones in this process) and not used, 3 alternating runs each (the
   peak varies by several MB from run to run).
3. An executor's memory beyond MXNet's figure: the process's growth over 3 training steps
   of MXNet's executor bound on the Parameters' arrays, unplanned, vs the CachedOp's, and
   the MKL-DNN layout copies mxmirror counts for that executor (sim/storage_fallback.py).
4. What a further call of a block in one record() costs plain Gluon, against PlannedBlock:
   peak RSS over 3 steps where each record() calls it 1 to 4 and 8 times (a Dense layer's
   64 MB weight, and ResNet-50 at batch 8, 32x32 plain and sqrt). Plain Gluon's backward
   holds a gradient term of every Parameter for each call while it sums fewer than 8 with
   one ElementWiseSum, which the decision counts beside a second planned call
   (gluon/executor.choose_plan); from 8 it chains the sum.

Each measurement runs in a child process of its own.

    python scripts/gluon_memory_notes.py [--out docs/gluon.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from _bootstrap import ROOT
from provenance import generated_by, write_section


def _rss() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") \
        / 2**20


def lm_figures() -> list[str]:
    import mxnet as mx
    from gluon_table import LM, language_model

    import mxmirror
    from mxmirror.gluon.executor import retained_bytes

    class WithLoss(type(language_model(False))):
        def hybrid_forward(self, F, inputs, hidden, target):
            out, hidden = super().hybrid_forward(F, inputs, hidden)
            return -F.pick(F.log_softmax(out), target.reshape((-1,)), axis=-1), hidden

    rows = ["| LM, T | no plan MB | sqrt MB | search MB | plain Gluon keeps MB | the block's "
            "output MB |", "|---|---|---|---|---|---|"]
    for T in (35, 200):
        for name, net in (("fused", language_model(False)), ("stacked", language_model(True)),
                          ("fused, loss inside", WithLoss(LM["vocab"], LM["emb"], LM["hidden"],
                                                          2, 0.2))):
            net.initialize()
            inputs = [mx.sym.var("data0"), [mx.sym.var("data1"), mx.sym.var("data2")]]
            shapes = {"data0": (T, LM["batch"]), "data1": (2, LM["batch"], LM["hidden"]),
                      "data2": (2, LM["batch"], LM["hidden"])}
            if "loss" in name:
                inputs.append(mx.sym.var("data3"))
                shapes["data3"] = (T, LM["batch"])
            out, state = net(*inputs)
            sym = mx.sym.Group([out, *state])
            req = {a: ("null" if a in shapes else "write") for a in sym.list_arguments()}
            plans = {p: mxmirror.plan(sym, p, grad_req=req, **shapes) for p in ("sqrt", "search")}
            output_mb = T * LM["batch"] * (1 if "loss" in name else LM["vocab"]) * 4 / 2**20
            kept = retained_bytes(plans["sqrt"].graph) / 2**20
            rows.append(f"| {name}, T={T} | {plans['sqrt'].baseline_mb:.1f} | "
                        f"{plans['sqrt'].planned_mb:.1f} | {plans['search'].planned_mb:.1f} | "
                        f"{kept:.1f} | {output_mb:.1f} |")
    return rows


def overhead_child(mode: str) -> None:
    """MobileNetV2 at batch 8, 32x32, 3 steps: plain ('plain'), with mxmirror.gluon imported
    ('imported'), through a PlannedBlock whose calls return to the block at once
    ('returning': its hooks in place, nothing traced or planned), or trained unplanned
    ('unused': traced and planned, the plan not used)."""
    import mxnet as mx
    from mxnet import gluon
    from mxnet.gluon.model_zoo import vision

    mx.random.seed(0)
    net = vision.get_model("mobilenetv2_1.0", classes=10)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    run = net
    if mode != "plain":
        import mxmirror.gluon.block as block
        from mxmirror.gluon import PlannedBlock

        if mode == "returning":
            block.PlannedBlock.planned_call = lambda self, args, kwargs: None
        if mode == "forked":
            block.signature = _in_forked_child(block.signature)
        chosen = block.choose_plan
        block.choose_plan = lambda *a, **k: (chosen(*a, **k)[0], False, False, False)  # unused
        if mode != "imported":
            run = PlannedBlock(net, "sqrt")
    x = mx.nd.random.uniform(shape=(8, 3, 32, 32))
    y = mx.nd.array([i % 10 for i in range(8)])
    _three_steps(net, run, lambda: gluon.loss.SoftmaxCrossEntropyLoss()(run(x), y))


def _in_forked_child(signature):
    """`signature` run in a forked child, its result sent back pickled (the plan's analysed
    graph already let go): what planning in a process of its own would leave in this one."""
    import pickle

    def forked(*args, **kwargs):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            sig = signature(*args, **kwargs)
            sig.plan.analysis_of = sig.plan.release_analysis = None
            with os.fdopen(write, "wb") as out:
                out.write(pickle.dumps(sig))
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as found:
            sig = pickle.loads(found.read())
        os.waitpid(pid, 0)
        return sig

    return forked


def _three_steps(net, run, loss_of) -> None:
    """3 Trainer steps (SGD with momentum) of loss_of(); print the peak RSS and whether
    each plan was used."""
    import resource

    import mxnet as mx
    from mxnet import autograd, gluon

    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01,
                                                          "momentum": 0.9})
    for _ in range(3):
        with autograd.record():
            loss = loss_of()
        loss.backward()
        trainer.step(8)
        mx.nd.waitall()
    used = [u for _, u in run.decisions] if run is not net else []
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "used": used}))


def executor_child(name: str, how: str, batch: str, side: str) -> None:
    import mxnet as mx
    from mxnet import autograd
    from mxnet.gluon.model_zoo import vision

    import mxmirror
    from mxmirror.adapter.children import allocated_mb
    from mxmirror.adapter.executor_memory import layout_copies

    net = vision.get_model(name, classes=10)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    x = mx.nd.random.uniform(shape=(int(batch), 3, int(side), int(side)))
    net(x)
    mx.nd.waitall()
    sym = net(mx.sym.var("data"))
    params = {p.name: p for p in net.collect_params().values()}
    before = _rss()
    figure = copies = None
    for _ in range(3):
        if how == "executor":
            if figure is None:
                args = {n: params[n].data() for n in sym.list_arguments() if n != "data"}
                args["data"] = x
                grads = {n: params[n].grad() for n in args if n != "data"}
                aux = {n: params[n].data() for n in sym.list_auxiliary_states()}
                req = {n: "null" if n == "data" else "write" for n in args}
                ex = sym.bind(mx.cpu(), args, args_grad=grads, grad_req=req, aux_states=aux)
                figure = sum(allocated_mb(ex.debug_str()))
                copies = layout_copies(mxmirror.plan(sym, "none", grad_req=req,
                                                          data=x.shape)) / 2**20
            ex.forward(is_train=True)
            ex.backward(mx.nd.ones(ex.outputs[0].shape))
        else:
            with autograd.record():
                out = net(x)
            out.backward()
        mx.nd.waitall()
    print(json.dumps({"growth_mb": _rss() - before, "figure_mb": figure,
                      "copies_mb": copies if how == "executor" else None}))


def calls_child(name: str, mode: str, count: str) -> None:
    """3 Trainer steps of `name` ('dense' or a model-zoo network) called `count` times in
    each record(), plain or PlannedBlock(mode): the peak RSS."""

    import mxnet as mx
    from mxnet import gluon
    from mxnet.gluon.model_zoo import vision

    mx.random.seed(0)
    if name == "dense":
        net, shape = gluon.nn.Dense(4096, in_units=4096, use_bias=False), (2, 4096)
    else:
        net, shape = vision.get_model(name, classes=10), (8, 3, 32, 32)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    run = net
    if mode != "plain":
        from mxmirror.gluon import PlannedBlock

        run = PlannedBlock(net, mode)
    xs = [mx.nd.random.uniform(shape=shape) for _ in range(int(count))]
    _three_steps(net, run, lambda: sum(run(x).mean() for x in xs))


def child(args: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), str(ROOT / "scripts"), os.environ.get("PYTHONPATH")) if p))
    env.pop("MXMIRROR_POLICY", None)
    proc = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True,
                          text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="page whose marked section is rewritten")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        if kind == "lm":
            print(json.dumps(lm_figures()))
        elif kind == "overhead":
            overhead_child(*rest)
        elif kind == "calls":
            calls_child(*rest)
        else:
            executor_child(*rest)
        return
    load = os.getloadavg()[0]
    lines = [generated_by("scripts/gluon_memory_notes.py", sys.argv[1:] if argv is None
                          else argv) + f" Load average {load:.1f} at the start.", "",
             "The language model's memory, simulated (MXNet's planner; vocabulary 10000, "
             "batch 32, hidden 256, 2 layers):", ""]
    lines += child(["lm"])
    modes = {"plain": "plain", "imported": "mxmirror.gluon imported, the block called itself",
             "returning": "PlannedBlock whose calls return to the block at once",
             "unused": "PlannedBlock, traced and planned, the plan not used",
             "forked": "the same, traced and planned in a forked child"}
    runs = {mode: [] for mode in modes}
    for _ in range(3):  # alternating: the peak varies by several MB from run to run
        for mode, found in runs.items():
            found.append(child(["overhead", mode]))
    assert all(r["used"] == [False] for r in runs["unused"] + runs["forked"]), runs
    lines += ["", "mxmirror's own cost where no plan is used (MobileNetV2, batch 8, 32x32, 3 "
              "steps, 3 runs each, alternating):", "", "| process | peak RSS MB |", "|---|---|"]
    for mode, label in modes.items():
        peaks = [r["peak_rss_mb"] for r in runs[mode]]
        lines.append(f"| {label} | {min(peaks):.1f} to {max(peaks):.1f} |")
    lines += ["",
              "Growth of the process over 3 training steps, besides the Parameters and their "
              "gradients, for MXNet's executor (unplanned; its figure, and the MKL-DNN layout "
              "copies of its storage fallback that mxmirror counts, beside) and for the "
              "CachedOp:", "",
              "| network, batch, image | executor MB (MXNet's figure MB; layout copies counted "
              "MB) | CachedOp MB |", "|---|---|---|"]
    for name, batch, side in (("resnet50_v1", 8, 32), ("mobilenetv2_1.0", 8, 32),
                              ("mobilenetv2_1.0", 16, 224)):
        ex, cached = (child(["executor", name, how, str(batch), str(side)])
                      for how in ("executor", "cachedop"))
        lines.append(f"| {name}, {batch}, {side}x{side} | {ex['growth_mb']:.0f} "
                     f"({ex['figure_mb']}; {ex['copies_mb']:.0f}) | {cached['growth_mb']:.0f} |")
    counts = (1, 2, 3, 4, 8)
    lines += ["", "Peak RSS MB over 3 steps where each record() calls the block 1 to 4 and 8 "
              "times (plan used: yes for every call, else said):", "",
              "| block, mode | " + " | ".join(f"{n} call{'s' * (n > 1)}" for n in counts)
              + " |", "|---" * (len(counts) + 1) + "|"]
    for name, mode in (("dense", "plain"), ("resnet50_v1", "plain"), ("resnet50_v1", "sqrt")):
        cells = []
        for count in counts:
            found = child(["calls", name, mode, str(count)])
            unused = "" if all(found["used"]) else " (trained unplanned)"
            cells.append(f"{found['peak_rss_mb']:.0f}{unused}")
        label = "Dense 4096x4096 (64 MB weight)" if name == "dense" else \
            f"{name}, batch 8, 32x32"
        lines.append(f"| {label}, {mode} | " + " | ".join(cells) + " |")
    write_section(args.out, "gluon_memory_notes", lines)


if __name__ == "__main__":
    main()
