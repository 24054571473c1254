"""The segmented executor's overhead beyond the forwards it recomputes (issue 13 item 6).

    python scripts/executor_overhead.py [--steps 5] [--rounds 2] [--threads 1,0]
        [--networks resnet110,lstm] [--out docs/executor_overhead.md] [--before COMMIT]

For each network (CIFAR ResNet-110, batch 32, 3x32x32; the paper's LSTM structure at a
CPU size: 4 layers x 256 hidden, 256 embedding, 32 steps, batch 32, 1000 classes, data,
labels and initial states without gradient) one child process binds four executors side by
side: no plan (plain MXNet), sqrt (MXNet's executor with mirror attributes), recursive and
multilevel (segmented; the budget halfway between the recursive and sqrt plans'
predictions), runs one warm-up step on each, then `--steps` rounds that alternate the
four (forward + backward + waitall each) and the unplanned executor's forward alone. Per
step: wall time and process CPU time (every thread of the process). A child runs per
thread setting (``OMP_NUM_THREADS``; 0 = MXNet's default) and per round; with
`--before COMMIT` the rounds alternate between that commit's mxmirror package (extracted
with ``git archive`` into a temporary directory, its C extensions built there) and this
checkout's, so that old and new code run under the same load.

The overhead of a plan is what its step costs beyond the unplanned step plus the forwards
it recomputes:  step(plan) - [step(none) + r * forward(none)], with r the measured
recompute ratio (extra forward FLOPs over the graph's forward FLOPs; the predicted one for
sqrt, whose recomputation MXNet runs); stated as a fraction of step(plan). Medians over
all steps of all rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bootstrap import ROOT

MB = 2**20
POLICIES = ("none", "sqrt", "recursive", "multilevel")
LSTM = {"seq_len": 32, "num_layers": 4, "num_hidden": 256, "num_embed": 256,
        "num_classes": 1000, "batch": 32}
NETWORKS = {
    "resnet110": "CIFAR ResNet-110 (basic blocks, 18 units per stage), batch 32, 3x32x32",
    "lstm": (f"paper LSTM structure, {LSTM['num_layers']} layers x {LSTM['num_hidden']} "
             f"hidden, {LSTM['num_embed']} embedding, {LSTM['seq_len']} steps, batch "
             f"{LSTM['batch']}, {LSTM['num_classes']} classes"),
}


def network(name: str):
    """(symbol, shapes, inputs without gradient) of a benchmark network."""
    if name == "resnet110":
        from symbols.resnet import resnet_by_depth

        sym = resnet_by_depth(110, bottleneck=False, num_classes=10, image_shape=(3, 32, 32))
        shapes = {"data": (32, 3, 32, 32), "softmax_label": (32,)}
        return sym, shapes, set(shapes)
    from symbols.lstm import input_shapes, paper_lstm

    c = LSTM
    sym = paper_lstm(c["seq_len"], num_layers=c["num_layers"], num_hidden=c["num_hidden"],
                     num_embed=c["num_embed"], num_classes=c["num_classes"])
    shapes = input_shapes(c["seq_len"], c["batch"], num_layers=c["num_layers"],
                          num_hidden=c["num_hidden"])
    return sym, shapes, set(shapes)


# ------------------------------------------------------------------ child
def _fill(ex, labels: int) -> None:
    import numpy as np

    rng = np.random.RandomState(0)
    for name, arr in ex.arg_dict.items():
        if name.endswith("label"):
            arr[:] = rng.randint(0, labels, arr.shape)
        else:
            arr[:] = rng.uniform(-0.1, 0.1, arr.shape)
    for name, arr in ex.aux_dict.items():
        arr[:] = 1.0 if "var" in name else 0.0


def _timed(fn) -> tuple[float, float]:
    import mxnet as mx

    mx.nd.waitall()
    w, c = time.perf_counter(), time.process_time()
    fn()
    mx.nd.waitall()
    return time.perf_counter() - w, time.process_time() - c


def child(name: str, steps: int) -> dict:
    """Bind the four executors of `name`, alternate their steps; one JSON-able dict."""
    import mxnet as mx

    from mxmirror.api import prepare

    sym, shapes, frozen = network(name)
    req = {a: ("null" if a in frozen else "write") for a in sym.list_arguments()}
    prep = prepare(sym, grad_req=req, **shapes)
    plans = {"sqrt": prep.own_plan("sqrt"), "recursive": prep.own_plan("recursive")}
    budget = (plans["recursive"].planned_bytes + plans["sqrt"].planned_bytes) // 2
    plans["multilevel"] = prep.own_plan("multilevel", budget)
    execs = {"none": sym.simple_bind(mx.cpu(), grad_req=req, **shapes)}
    for policy, p in plans.items():
        execs[policy] = p.bind(mx.cpu(), symbol=sym, grad_req=req, **shapes)
    labels = 10 if name == "resnet110" else LSTM["num_classes"]
    for ex in execs.values():
        _fill(ex, labels)

    def step(ex):
        def run():
            ex.forward(is_train=True)
            ex.backward()
        return run

    for ex in execs.values():  # warm-up: MKL-DNN primitives, memory pages
        _timed(step(ex))
    for ex in execs.values():
        if hasattr(ex, "runner"):  # the segmented executor: count the measured steps only
            ex.runner.forward_flops_run = 0.0
    times: dict[str, list] = {p: [] for p in (*POLICIES, "forward none")}
    for _ in range(steps):
        times["forward none"].append(_timed(lambda: execs["none"].forward(is_train=True)))
        for policy in POLICIES:
            times[policy].append(_timed(step(execs[policy])))
    fwd = prep.analysis.graph.forward_flops
    out = {"network": name, "steps": steps, "times": times, "plans": {}}
    for policy, p in plans.items():
        ex = execs[policy]
        flops = ex.runner.forward_flops_run if hasattr(ex, "runner") else None
        out["plans"][policy] = {
            "executor": type(ex).__name__, "planned_mb": p.planned_bytes / MB,
            "predicted_recompute": p.recompute_ratio,
            "measured_recompute": None if flops is None else flops / steps / fwd - 1,
            "budget_mb": budget / MB if policy == "multilevel" else None,
            "segments": p.execution.segment_plan.segments.m
            if p.execution.kind == "segmented" else None}
    return out


# ------------------------------------------------------------------ parent
def run_child(name: str, steps: int, threads: int, src: Path) -> dict:
    env = dict(os.environ, MXNET_SUBGRAPH_VERBOSE="0",
               PYTHONPATH=os.pathsep.join([str(src), str(ROOT)]))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    else:
        env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.run([sys.executable, __file__, "_child", name, str(steps)],
                          capture_output=True, text=True, env=env, cwd=src)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"child {name} ({src}) failed: " + proc.stderr[-3000:])


def summarize(results: list[dict]) -> dict:
    """Medians over every step of every round, and the overheads."""
    times: dict[str, list] = {}
    for r in results:
        for policy, ts in r["times"].items():
            times.setdefault(policy, []).extend(ts)
    med = {p: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts))
           for p, ts in times.items()}
    rows = {}
    for policy in POLICIES:
        wall, cpu = med[policy]
        row = {"wall": wall, "cpu": cpu, "n": len(times[policy])}
        if policy != "none":
            info = results[0]["plans"][policy]
            row.update(info)
            r = info["measured_recompute"]
            r = info["predicted_recompute"] if r is None else r
            for k, j in (("wall", 0), ("cpu", 1)):
                over = med[policy][j] - (med["none"][j] + r * med["forward none"][j])
                row[f"overhead_{k}"] = over / med[policy][j]
        rows[policy] = row
    return {"rows": rows, "forward none": med["forward none"]}


def table(summary: dict) -> list[str]:
    fw, fc = summary["forward none"]
    lines = ["| policy | executor | planned MB | recompute predicted / measured | "
             "step wall s | vs none | step CPU s | vs none | overhead (wall) | "
             "overhead (CPU) |", "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    base = summary["rows"]["none"]
    for policy, r in summary["rows"].items():
        if policy == "none":
            lines.append(f"| none | Executor | | | {r['wall']:.3f} | 1.00x | {r['cpu']:.3f} "
                         f"| 1.00x | | |")
            continue
        name = policy if r["budget_mb"] is None else f"multilevel ({r['budget_mb']:.1f} MB)"
        measured = "-" if r["measured_recompute"] is None else f"{r['measured_recompute']:.2f}"
        lines.append(
            f"| {name} | {r['executor']} | {r['planned_mb']:.1f} | "
            f"{r['predicted_recompute']:.2f} / {measured} | {r['wall']:.3f} | "
            f"{r['wall'] / base['wall']:.2f}x | {r['cpu']:.3f} | {r['cpu'] / base['cpu']:.2f}x "
            f"| {100 * r['overhead_wall']:+.1f}% | {100 * r['overhead_cpu']:+.1f}% |")
    lines.append(f"\nUnplanned forward alone: {fw:.3f} s wall, {fc:.3f} s CPU "
                 f"({summary['rows']['none']['n']} steps per policy).")
    return lines


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        sys.path[:0] = [str(Path.cwd()), str(ROOT)]
        print("RESULT " + json.dumps(child(sys.argv[2], int(sys.argv[3]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", default="1,0", help="OMP_NUM_THREADS per run, 0 = default")
    ap.add_argument("--networks", default="resnet110,lstm")
    ap.add_argument("--before", help="a commit whose mxmirror to run beside this one")
    ap.add_argument("--out", default="docs/executor_overhead.md")
    args = ap.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
    from provenance import generated_by

    srcs = [("this checkout", str(ROOT))]
    tmp = tempfile.TemporaryDirectory()
    if args.before:
        archive = subprocess.run(["git", "archive", args.before, "mxmirror", "setup.py"],
                                 cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp.name], input=archive, check=True)
        # that commit's C extensions (the planner's), built beside its sources
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                       cwd=tmp.name, capture_output=True, check=True)
        srcs = [(f"before: {args.before}", tmp.name), ("after: this checkout", str(ROOT))]
    stamp = generated_by("scripts/executor_overhead.py", sys.argv[1:])
    out = [f"# Segmented executor overhead\n\n{stamp}\n",
           "Overhead = step(plan) - [step(none) + r x forward(none)], r the measured "
           "recompute ratio (predicted for sqrt), as a fraction of step(plan); medians over "
           "all steps; wall time and process CPU time (all threads). OMP_NUM_THREADS=1 is the "
           "more robust measure on a loaded machine.\n"]
    if len(srcs) > 1:
        out.append("Sources compared (rounds alternate between them): "
                   + ", ".join(f"`{label}`" for label, _ in srcs) + ".\n")
    for name in args.networks.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            results: dict[str, list] = {label: [] for label, _ in srcs}
            loads = []  # the 1-minute load average as each child starts
            for _ in range(args.rounds):
                for label, src in srcs:
                    loads.append(os.getloadavg()[0])
                    results[label].append(run_child(name, args.steps, threads, Path(src)))
            for label, _ in srcs:
                head = (f"## {NETWORKS[name]}; OMP_NUM_THREADS="
                        f"{threads if threads else 'default'}"
                        + (f"; {label}" if len(srcs) > 1 else ""))
                lines = [head, "", *table(summarize(results[label])),
                         f"Machine: {os.cpu_count()} cores; load average (1 min) as each "
                         f"child of this section started: "
                         f"{', '.join(f'{x:.1f}' for x in loads)}.", ""]
                print("\n".join(lines), flush=True)
                out.extend(lines)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(out))
    print(f"wrote {args.out}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
