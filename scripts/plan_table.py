#!/usr/bin/env python
"""Every policy's plan on the reference networks: predicted MB, recompute ratio, plan time.

Simulator only (no bind), so it runs in minutes. Inputs given shapes get no gradient
(Module's convention). ``budget`` and ``auto`` get 1.25x the sqrt plan's predicted bytes,
``multilevel`` 0.75x. Times: "cold" plans with an empty plan cache (a folder of this run;
learned templates still come from the user's cache), "warm" plans the same again in a new
``prepare`` (the plan read from the cache); "total" adds reading the symbol and analysing
its graph (``prepare``), which every bind pays; "CPU" is the process time of the cold
planning (steadier than wall time when other jobs share the machine). ``--json FILE``
keeps the rows so that two commits can be compared exactly (``--compare OLD.json``: the same
MB, recompute ratio, recomputed nodes and checkpoints). The
machine's load average is printed: timings on a shared machine are noisy.

Usage::

    python scripts/plan_table.py [--only NAME,...] [--json rows.json] [--compare old.json]
        [--out docs/plan_times.md]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import _bootstrap  # noqa: F401 (this checkout importable)

POLICIES = ("none", "cheap", "sqrt", "budget", "auto", "search", "recursive", "multilevel")
RENAMED = {"optimal": "search"}  # rows of runs before the rename compare under the new name


def networks() -> dict:
    """name -> (symbol factory, shapes)."""
    from symbols.lstm import input_shapes, paper_lstm
    from symbols.resnet import resnet

    def gluon_resnet50_v2():
        import mxnet as mx
        from mxnet.gluon.model_zoo import vision

        net = vision.get_model("resnet50_v2", pretrained=False, classes=1000)
        net.initialize()
        net.hybridize()
        net(mx.nd.zeros((1, 3, 32, 32)))
        out = net(mx.sym.var("data"))
        return mx.sym.SoftmaxOutput(out, name="softmax")

    img = {"data": (32, 3, 224, 224), "softmax_label": (32,)}
    return {
        "ResNet-200": (lambda: resnet([3, 24, 36, 3], act="leaky"), img),
        "ResNet-1001": (lambda: resnet([3, 120, 207, 3], act="leaky"), img),
        "LSTM 4x1024x200": (lambda: paper_lstm(200), input_shapes(200, 64)),
        "CIFAR ResNet-110": (
            lambda: resnet([18, 18, 18], bottleneck=False, num_classes=10,
                           image_shape=(3, 32, 32)),
            {"data": (32, 3, 32, 32), "softmax_label": (32,)}),
        "Gluon resnet50_v2": (gluon_resnet50_v2,
                              {"data": (32, 3, 224, 224), "softmax_label": (32,)}),
    }


def timed_plan(sym, policy: str, budget, shapes: dict):
    """(plan, seconds of mxmirror.plan: prepare + plan, CPU seconds of its planning part)."""
    from mxmirror.api import prepare

    start = time.perf_counter()
    prep = prepare(sym, **shapes)
    cpu = time.process_time()
    p = prep.plan(policy, budget)
    return p, time.perf_counter() - start, time.process_time() - cpu


def plan_digest(p) -> str:
    """What decides a plan besides its figures: the recomputed nodes and the checkpoints."""
    return hashlib.sha1(repr((sorted(p.recomputed_ids), list(p.checkpoints))).encode()).hexdigest()


def rows_for(name: str, factory, shapes: dict, policies) -> list[dict]:
    import mxmirror

    sym = factory()
    rows = []
    sqrt_bytes = None
    for policy in policies:
        budget = None
        if policy in ("budget", "auto", "multilevel"):
            if sqrt_bytes is None:
                sqrt_bytes = mxmirror.plan(sym, policy="sqrt", **shapes).planned_bytes
            budget = int(sqrt_bytes * (0.75 if policy == "multilevel" else 1.25))
        try:
            p, seconds, cpu = timed_plan(sym, policy, budget, shapes)
        except mxmirror.PlanError as exc:
            rows.append({"network": name, "policy": policy, "error": str(exc)})
            continue
        warm, warm_seconds, _ = timed_plan(sym, policy, budget, shapes)
        if (warm.planned_bytes, warm.recomputed_ids) != (p.planned_bytes, p.recomputed_ids):
            raise SystemExit(f"{name} {policy}: the cached plan differs from the fresh one")
        if policy == "sqrt":
            sqrt_bytes = p.planned_bytes
        rows.append({"network": name, "policy": policy, "budget": budget,
                     "planned_bytes": p.planned_bytes, "baseline_bytes": p.baseline_bytes,
                     "recompute_ratio": p.recompute_ratio, "seconds": round(seconds, 2),
                     "plan_seconds": round(p.plan_seconds, 2), "plan_cpu": round(cpu, 2),
                     "warm_seconds": round(warm_seconds, 2),
                     "warm_plan_seconds": round(warm.plan_seconds, 3),
                     "digest": plan_digest(p)})
        print(f"  {name:<18} {policy:<10} {p.planned_bytes / 2**20:>9.1f} MB "
              f"{p.recompute_ratio:>6.3f} cold {p.plan_seconds:>6.1f} s (CPU {cpu:>5.1f} s) "
              f"(total {seconds:>6.1f} s) warm {warm.plan_seconds:>6.3f} s "
              f"(total {warm_seconds:>6.1f} s)", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict], old: dict | None) -> str:
    head = ("| network | policy | planned MB | recompute | plan s cold | plan CPU s cold "
            "| total s cold | plan s warm | total s warm |")
    sep = "|---|---|---:|---:|---:|---:|---:|---:|---:|"
    if old is not None:
        head += " before MB | before recompute | before total s | same |"
        sep += "---:|---:|---:|---|"
    lines = [head, sep]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['network']} | {r['policy']} | error: {r['error'][:60]} "
                         f"| | | | | | |")
            continue
        line = (f"| {r['network']} | {r['policy']} | {r['planned_bytes'] / 2**20:.1f} | "
                f"{r['recompute_ratio']:.4f} | {r.get('plan_seconds', float('nan')):.1f} | "
                f"{r.get('plan_cpu', float('nan')):.1f} | {r['seconds']:.1f} | "
                f"{r.get('warm_plan_seconds', float('nan')):.3f} | "
                f"{r.get('warm_seconds', float('nan')):.1f} |")
        if old is not None:
            o = old.get((r["network"], r["policy"]))
            if o is None or "error" in o:
                line += " - | - | - | - |"
            else:
                same = (o["planned_bytes"] == r["planned_bytes"]
                        and abs(o["recompute_ratio"] - r["recompute_ratio"]) < 1e-12
                        and o.get("digest", r["digest"]) == r["digest"])
                line += (f" {o['planned_bytes'] / 2**20:.1f} | {o['recompute_ratio']:.4f} | "
                         f"{o['seconds']:.1f} | {'yes' if same else '**no**'} |")
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated network names")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--compare", help="rows of an earlier run, shown beside")
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = ap.parse_args()
    from provenance import generated_by

    from mxmirror.planning import cache

    plans = Path(tempfile.mkdtemp(prefix="mxmirror-plans-"))
    cache.plans_dir = lambda: plans  # cold: an empty plan cache of this run only
    load_before = os.getloadavg()
    nets = networks()
    names = args.only.split(",") if args.only else list(nets)
    rows = []
    for name in names:
        factory, shapes = nets[name]
        rows += rows_for(name, factory, shapes, args.policies.split(","))
    old = None
    if args.compare:
        old = {(r["network"], RENAMED.get(r["policy"], r["policy"])): r
               for r in json.loads(Path(args.compare).read_text())}
    load_after = os.getloadavg()
    text = (f"# Plans by policy (simulator) and their planning time\n\n"
            f"{generated_by('scripts/plan_table.py', sys.argv[1:])} Do not edit by hand.\n\n"
            f"Machine: {os.cpu_count()} cores, load average (1, 5, 15 min) "
            f"{' '.join(f'{x:.1f}' for x in load_before)} at the start, "
            f"{' '.join(f'{x:.1f}' for x in load_after)} at the end.\n\n"
            f"{table(rows, old)}\n")
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    shutil.rmtree(plans, ignore_errors=True)


if __name__ == "__main__":
    main()
