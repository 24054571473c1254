"""At most one extra forward: segmented schedules vs MXNet mirroring vs memonger, measured.

    python scripts/one_recompute.py [--out docs/one_recompute.md] [--quick]

For ResNet-1001 (bottleneck [3,120,207,3], batch 32, 3x224x224) and the paper's
LSTM (4 x 1024, 200 steps, batch 64), data, labels and initial states without
gradient (mxmirror's default), each figure MXNet's own, bound in a child:

- memonger's ``search_plan`` (needs MEMONGER_DIR; its hints: the ResNet's
  ``example`` placement, the LSTM's step tags), bound with the same grad_req;
- the best mirror plan (policy ``search``), ``Plan.mxnet_mb()``;
- the best segmented plan with recompute <= 1.0: the store-all schedule (every
  segment's forward twice) over each chain the multi-level DP runs on
  (``planners.dp.chains``: the finest chain and Algorithm 3's grid) and over
  the cut sets of the search policy's front (the mirror plans' own cuts); the
  smallest predicted is bound whole in a child (``mxmirror/runtime/segmented/measure.py``) and its
  peak broken down (pool, slots, outputs, masks, kept).

--quick runs small stand-ins (a CIFAR ResNet-56 and a 2 x 256 LSTM).
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

from _bootstrap import ROOT

MB = 2**20
TARGET = 0.75


def network(name: str, quick: bool, tags: bool | str = False):
    """(symbol, shapes) of one of the two networks."""
    if name == "resnet":
        from symbols.resnet import resnet

        if quick:
            return (resnet([9, 9, 9], bottleneck=False, num_classes=10, image_shape=(3, 32, 32),
                           memonger_tags=bool(tags)), {"data": (32, 3, 32, 32),
                                                       "softmax_label": (32,)})
        return (resnet([3, 120, 207, 3], image_shape=(3, 224, 224),
                       memonger_tags="example" if tags else False),
                {"data": (32, 3, 224, 224), "softmax_label": (32,)})
    from symbols.lstm import input_shapes, paper_lstm

    if quick:
        return (paper_lstm(20, num_layers=2, num_hidden=256, num_embed=256,
                           memonger_tags=bool(tags)),
                input_shapes(20, 32, num_layers=2, num_hidden=256))
    return paper_lstm(200, memonger_tags=bool(tags)), input_shapes(200, 64)


def child_memonger(name: str, quick: bool) -> None:
    """memonger's search_plan, every cost bound with the inputs without gradient."""
    import memonger_compat as mc

    if mc.load_memonger() is None:
        print("RESULT " + json.dumps({"error": mc.last_error}))
        return
    sym, shapes = network(name, quick, tags=True)
    req = {a: ("null" if a in shapes else "write") for a in sym.list_arguments()}
    start = time.perf_counter()
    with redirect_stdout(io.StringIO()):  # memonger prints every trial
        _, mb = mc.search_plan_cpu(sym, grad_req=req, **shapes)
    print("RESULT " + json.dumps({"mb": mb, "seconds": time.perf_counter() - start}))


def memonger_mb(name: str, quick: bool) -> dict:
    proc = subprocess.run([sys.executable, __file__, "_memonger", name] + (["--quick"] * quick),
                          capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1][7:])


def store_all_plans(a):
    """(label, plan) of the store-all schedule over every chain considered."""
    from mxmirror.planning import dp
    from mxmirror.planning.strategies import search
    from mxmirror.segments.cost import make_segment_plan
    from mxmirror.segments.cuts import build_segments
    from mxmirror.segments.schedule import store_all_tree

    out = []
    for sp in dp.chains(a):
        sg = sp.segments
        out.append((f"DP chain, {sg.m} segments", make_segment_plan(
            a.graph, sg.cuts, store_all_tree(sg.m), sg=sg,
            mem=(sp.template_bytes, sp.template_blocks))))
    for _, bound, cuts in search.checkpoint_front(a):
        sg = build_segments(a.graph, [c.pos for c in cuts])
        if sg.m >= 2:
            out.append((f"search front cuts (segment bound {bound / MB:.0f} MB), {sg.m} "
                        f"segments", make_segment_plan(a.graph, sg.cuts, store_all_tree(sg.m),
                                                       sg=sg)))
    return out


def slot_split(sp) -> dict[str, float]:
    """segments.staging_bytes split by role (MB): parameter copies of repeated templates,
    parameter-gradient slots (a segment's gradient, added into the user's array), boundary
    slots (values, their gradients, gradient inputs, masks); and beside them the BatchNorm
    statistics the pool's owner holds (segments.statistics_bytes)."""
    from math import prod

    from mxmirror.ir.graph import itemsize

    sg = sp.segments
    shared: dict[str, tuple[str, int]] = {}
    copies, seen = 0, set()
    for seg in sg.segments:
        shapes, types, req = (sg.slot_shapes[seg.key], sg.slot_types[seg.key],
                              sg.slot_req[seg.key])
        for name, key in seg.slots:
            if key[0] == "aux":
                continue
            b = prod(shapes[name]) * itemsize(types[name])
            if key[0] == "arg":
                copies += b if seg.key not in seen and (seg.key, name) not in sg.user_slots \
                    else 0
            else:
                shared[name] = ("boundary", max(shared.get(name, ("", 0))[1], b))
            if req.get(name) != "null" and (seg.key, name) not in sg.grad_slots:
                role = "parameter gradients" if key[0] == "arg" else "boundary"
                g = "grad of " + name
                shared[g] = (role, max(shared.get(g, ("", 0))[1], b))
        seen.add(seg.key)
    out = {"parameter copies": copies, "parameter gradients": 0, "boundary": 0}
    for role, b in shared.values():
        out[role] = out.get(role, 0) + b
    out["statistics"] = sp.statistics_bytes
    return {k: v / MB for k, v in out.items()}


def run(name: str, title: str, quick: bool) -> dict:
    from mxmirror.api import prepare
    from mxmirror.planning import dp
    from mxmirror.runtime.segmented.measure import measure

    sym, shapes = network(name, quick)
    prep = prepare(sym, **shapes)
    a = prep.analysis
    res: dict = {"name": title}
    t = time.perf_counter()
    mirror = prep.own_plan("search")
    res["mirror"] = {"predicted_mb": mirror.planned_bytes / MB,
                     "recompute": mirror.recompute_ratio,
                     "plan_seconds": time.perf_counter() - t,
                     "mxnet_mb": mirror.mxnet_mb()}
    print(f"{title}: mirror (search) {res['mirror']}", flush=True)
    t = time.perf_counter()
    plans = store_all_plans(a)
    res["store_all_seconds"] = time.perf_counter() - t
    res["store_all"] = [{"label": label, "predicted_mb": p.planned_bytes / MB,
                         "recompute": dp.recompute_of(p), **p.describe()}
                        for label, p in plans]
    within = [(label, p) for label, p in plans if dp.recompute_of(p) <= 1.0]
    label, best = min(within, key=lambda lp: lp[1].planned_bytes)
    t = time.perf_counter()
    measured = measure(best, prep.source_json)
    res["segmented"] = {"label": label, "recompute": dp.recompute_of(best),
                        "segments": best.segments.m, "templates": len(best.template_bytes),
                        "bind_seconds": time.perf_counter() - t, "slots_mb": slot_split(best),
                        **measured}
    print(f"{title}: segmented {res['segmented']}", flush=True)
    res["memonger"] = memonger_mb(name, quick)
    print(f"{title}: memonger {res['memonger']}", flush=True)
    return res


def write(results: list[dict], out: Path, argv: list[str]) -> None:
    from provenance import generated_by

    lines = ["# At most one extra forward: segmented vs mirror vs memonger (measured)", "",
             generated_by("scripts/one_recompute.py", argv) + " Every MB is MXNet's own "
             "figure bound on CPU in a child: `Total X MB allocated` for the mirror plan and "
             "memonger, every array the SegmentedExecutor holds for the segmented plan (its "
             "kept states at the dry run's peak); inputs, labels and initial states without "
             "gradient.", "",
             f"Target (issue 13): the best of the two <= {TARGET}x memonger's `search_plan`.",
             "", "| network | memonger MB | mirror (search) MB | recompute | vs memonger | "
             "segmented MB | recompute | vs memonger | best vs memonger |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        mg = r["memonger"].get("mb")
        mi, sg = r["mirror"], r["segmented"]
        seg_mb = sg["measured_mb"]["total"]

        def ratio(x, mg=mg):
            return f"{x / mg:.3f}" if mg else "—"

        lines.append(f"| {r['name']} | {mg if mg else 'not run'} | {mi['mxnet_mb']:.0f} | "
                     f"{mi['recompute']:.3f} | {ratio(mi['mxnet_mb'])} | {seg_mb:.0f} | "
                     f"{sg['recompute']:.3f} | {ratio(seg_mb)} | "
                     f"{ratio(min(seg_mb, mi['mxnet_mb']))} |")
    for r in results:
        sg = r["segmented"]
        lines += ["", f"## {r['name']}", "",
                  f"Best segmented plan with recompute <= 1.0: store-all over the "
                  f"{sg['label']} ({sg['templates']} templates), bound whole in "
                  f"{sg['bind_seconds']:.0f} s. Its peak:", "",
                  "| part | measured MB | predicted MB |", "|---|---:|---:|"]
        for part, v in sg["measured_mb"].items():
            lines.append(f"| {part} | {v:.1f} | {sg['predicted_mb'][part]:.1f} |")
        lines += ["", "Slots by role (predicted MB): " + ", ".join(
            f"{k} {v:.1f}" for k, v in sg["slots_mb"].items()) + ".",
                  "", f"MXNet's own figure per template (each drawn from the pool): "
                      f"{sg['template_mxnet_mb']} MB.", "",
                  "Every store-all schedule considered (predicted, simulator; "
                  f"{r['store_all_seconds']:.1f} s to build them all):", "",
                  "| chain | predicted MB | recompute | pool MB | slots MB | kept MB |",
                  "|---|---:|---:|---:|---:|---:|"]
        for s in sorted(r["store_all"], key=lambda s: s["predicted_mb"]):
            lines.append(f"| {s['label']} | {s['predicted_mb']:.0f} | {s['recompute']:.3f} | "
                         f"{s['pool_mb']:.0f} | {s['staging_mb']:.0f} | {s['kept_mb']:.0f} |")
        mg = r["memonger"]
        lines += ["", f"Mirror plan: predicted {r['mirror']['predicted_mb']:.0f} MB, planned in "
                      f"{r['mirror']['plan_seconds']:.0f} s. memonger: "
                      + (f"{mg['mb']} MB in {mg['seconds']:.0f} s." if "mb" in mg
                         else f"not run ({mg.get('error')}).")]
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "_memonger":
        child_memonger(sys.argv[2], "--quick" in sys.argv)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "one_recompute.md"))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    nets = [("resnet", "CIFAR ResNet-56, batch 32" if args.quick else
             "ResNet-1001 (bottleneck [3,120,207,3], batch 32, 224x224)"),
            ("lstm", "LSTM 2x256, 20 steps, batch 32" if args.quick else
             "LSTM 4x1024, 200 steps, batch 64")]
    results = [run(name, title, args.quick) for name, title in nets]
    write(results, Path(args.out), sys.argv[1:])


if __name__ == "__main__":
    main()
