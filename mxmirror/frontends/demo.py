"""`mxmirror demo`: plan the paper's ResNet and LSTM and show MXNet's own figures."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from mxmirror.adapter.figure import mxnet_mb_many
from mxmirror.adapter.symbol import symbol_json
from mxmirror.api import prepare
from mxmirror.tools.timeline import plot_timeline
from mxmirror.tools.viz import plot_plan


def _networks(quick: bool):
    from symbols import lstm, resnet

    if quick:
        return [("CIFAR ResNet-56, batch 64",
                 resnet.resnet_by_depth(56, bottleneck=False, num_classes=10,
                                        image_shape=(3, 32, 32)),
                 {"data": (64, 3, 32, 32), "softmax_label": (64,)}),
                ("LSTM 2x256, 20 steps, batch 32",
                 lstm.paper_lstm(20, num_layers=2, num_hidden=256, num_embed=256),
                 lstm.input_shapes(20, 32, num_layers=2, num_hidden=256))]
    return [("ResNet-1001 (bottleneck), batch 32, 224x224",
             resnet.resnet([3, 120, 207, 3], act="leaky"), {"data": (32, 3, 224, 224)}),
            ("LSTM 4x1024, 200 steps, batch 64 (paper)", lstm.paper_lstm(200),
             lstm.input_shapes(200, 64))]


def _draw(plan, stem: Path, title: str, done: list) -> None:
    """The pictures of one network's plan: full DOT source, collapsed drawings, timeline."""
    try:
        done.append(plot_plan(plan, f"{stem}_{plan.policy}.dot"))
        for mode, suffix in (("segment", "segments"), ("block", "blocks")):
            done.append(plot_plan(plan, f"{stem}_{plan.policy}_{suffix}.svg", collapse=mode))
        done.append((plot_timeline(plan, f"{stem}_timeline.png",
                                   title=f"{title}: live memory, no plan vs {plan.policy}"),
                     ""))
    except Exception as exc:  # reported after the table, never hides it
        done.append((None, f"drawing failed: {exc}"))


def run_demo(out: Path, quick: bool = False) -> int:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for title, sym, shapes in _networks(quick):
        print(f"== {title}", flush=True)
        plans = {}
        prepared = prepare(sym, grad_req="write", **shapes)
        print(f"   read and analysed the graph in {prepared.seconds:.1f}s", flush=True)
        for policy in ("cheap", "sqrt"):
            t = time.perf_counter()
            plans[policy] = prepared.plan(policy)
            print(f"   planned {policy} in {time.perf_counter() - t:.1f}s", flush=True)
        base = plans["sqrt"]
        job = {"shapes": shapes, "type_dict": None, "grad_req": prepared.inputs.grad_req}
        jobs = [dict(job, symbol=base.source_json),
                dict(job, symbol=base.source_json, env={"MXNET_BACKWARD_DO_MIRROR": "1"})]
        jobs += [dict(job, symbol=symbol_json(p.symbol)) for p in plans.values()]
        # the drawings are made while MXNet binds in child processes
        drawn: list = []
        stem = out / ("resnet" if "ResNet" in title else "lstm")
        drawer = threading.Thread(target=_draw, args=(plans["sqrt"], stem, title, drawn))
        drawer.start()
        print("   binding in MXNet for its own figures ...", flush=True)
        try:
            mb = mxnet_mb_many(jobs)
        finally:
            drawer.join()
        for written, note in drawn:
            print(f"   wrote {written}" + (f" ({note})" if note else "") if written
                  else f"   {note}", flush=True)
        rows.append((title, "no plan (sharing)", base.baseline_mb, mb[0], 0.0))
        rows.append((title, "MXNET_BACKWARD_DO_MIRROR=1", None, mb[1], None))
        for (name, p), m in zip(plans.items(), mb[2:]):
            rows.append((title, f"mxmirror {name}", p.planned_mb, m, p.recompute_ratio))
    print()
    print("| network | plan | simulated MB | MXNet MB | extra forward |")
    print("|---|---|---:|---:|---:|")
    for title, name, sim, mx_mb, ratio in rows:
        sim_s = f"{sim:.0f}" if sim is not None else "-"
        r_s = f"{ratio:.2f}x" if ratio is not None else "-"
        print(f"| {title} | {name} | {sim_s} | {mx_mb} | {r_s} |")
    return 0
