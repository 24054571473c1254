"""Recursive recomputation: memory vs depth, ResNet-1001, and the budget trade-off curve.

    python scripts/recursive_benchmark.py depth   [--kmax 10] [--run-kmax 7] [--batch 32]
                                                  [--out docs/figures/recursive_depth.md]
    python scripts/recursive_benchmark.py steps   [--k 5] [--out docs/figures/recursive_steps.md]
    python scripts/recursive_benchmark.py whole   [--out docs/figures/resnet1001_whole.md]
    python scripts/recursive_benchmark.py resnet1001
    python scripts/recursive_benchmark.py tradeoff [--quick] [--out docs/figures]

depth: chains of 2^k residual blocks (basic blocks, 16 channels, 32x32, no
downsampling). For k = 3..kmax the planned bytes of no plan, sqrt and
recursive are predicted by the simulator (no bind); for k <= run-kmax each
configuration trains two real steps in its own child process, which reports
its resident memory from the bind on (peak and growth, sampled every 2 ms),
the step time and, for the segmented executor, the forward FLOPs it really
ran (the measured recompute ratio).

resnet1001: bottleneck ResNet-1001, batch 32, 3x224x224: planned MB of none,
sqrt and recursive (prediction only: a CPU cannot train it).

tradeoff: budget -> least recompute, for ResNet-1001 and the paper's LSTM
(4 x 1024, 200 steps, batch 64): the multi-level DP's curve, the plans with at
most one recomputation per node (none, cheap, budget grid, sqrt), and the
recursive point; a Markdown table and a PNG in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _bootstrap import ROOT

MB = 2**20


def chain_symbol(blocks: int, width: int = 16):
    """stem conv, `blocks` basic residual blocks at one width, pooling, classifier."""
    import mxnet as mx

    def cbr(x, name, act=True):
        x = mx.sym.Convolution(x, num_filter=width, kernel=(3, 3), pad=(1, 1), no_bias=True,
                               name=f"{name}_conv")
        x = mx.sym.BatchNorm(x, fix_gamma=False, name=f"{name}_bn")
        return mx.sym.Activation(x, act_type="relu", name=f"{name}_relu") if act else x

    x = cbr(mx.sym.Variable("data"), "stem")
    for b in range(blocks):
        y = cbr(cbr(x, f"b{b}_1"), f"b{b}_2", act=False)
        x = mx.sym.Activation(x + y, act_type="relu", name=f"b{b}_out")
    x = mx.sym.Pooling(x, global_pool=True, kernel=(1, 1), pool_type="avg", name="pool")
    x = mx.sym.FullyConnected(mx.sym.Flatten(x), num_hidden=10, name="fc")
    return mx.sym.SoftmaxOutput(x, name="softmax")


def shapes_for(batch: int) -> dict:
    return {"data": (batch, 3, 32, 32), "softmax_label": (batch,)}


# ------------------------------------------------------------------ depth
def predict_depth(k: int, batch: int, with_sqrt: bool) -> dict:
    from mxmirror.api import prepare

    prep = prepare(chain_symbol(2**k), **shapes_for(batch))
    row = {"k": k, "blocks": 2**k}
    for policy in ("none", "sqrt", "recursive") if with_sqrt else ("none", "recursive"):
        p = prep.own_plan(policy)
        row[f"{policy}_mb"] = round(p.planned_bytes / MB, 1)
        row[f"{policy}_ratio"] = round(p.recompute_ratio, 3)
        row[f"{policy}_seconds"] = round(p.plan_seconds, 1)
        if p.execution.kind == "segmented":
            row["segments"] = p.execution.segment_plan.segments.m
            row["kept_mb"] = round(p.execution.segment_plan.dry.peak_bytes / MB, 1)
            row["pool_mb"] = round(p.execution.segment_plan.pool_bytes / MB, 1)
    return row


def child_step(k: int, batch: int, policy: str, budget: str | None = None) -> None:
    """Run in a child: bind, two training steps, print one JSON line."""
    import mxnet as mx
    import numpy as np

    import mxmirror

    sym = chain_symbol(2**k)
    shapes = shapes_for(batch)
    req = {a: ("null" if a in shapes else "write") for a in sym.list_arguments()}
    sampler = _RssSampler()
    if policy == "none":
        ex = sym.simple_bind(mx.cpu(), grad_req=req, **shapes)
    else:
        ex = mxmirror.simple_bind(sym, mx.cpu(), policy=policy, budget=budget,
                                  grad_req=req, **shapes)
    rng = np.random.RandomState(0)
    for name, arr in ex.arg_dict.items():
        if name == "softmax_label":
            arr[:] = rng.randint(0, 10, arr.shape)
        else:
            arr[:] = rng.uniform(-0.1, 0.1, arr.shape)
    for name, arr in ex.aux_dict.items():
        arr[:] = 1.0 if "var" in name else 0.0
    times = []
    for _ in range(2):
        t = time.perf_counter()
        ex.forward(is_train=True)
        ex.backward()
        mx.nd.waitall()
        times.append(time.perf_counter() - t)
    sampler.stop()
    # Not ru_maxrss: a child started by fork carries its parent's resident peak (hundreds of
    # MB once the parent has planned deep chains), which would hide this process's own.
    out = {"k": k, "policy": policy, "executor": type(ex).__name__,
           "peak_rss_mb": round(sampler.peak / MB, 1),
           "rss_above_start_mb": round((sampler.peak - sampler.start) / MB, 1),
           "step_seconds": round(min(times), 3)}
    flops = ex.runner.forward_flops_run if hasattr(ex, "runner") else None
    if flops is not None:
        from mxmirror.api import prepare

        graph = prepare(sym, **shapes).analysis.graph
        out["measured_recompute"] = round(flops / 2 / graph.forward_flops - 1, 3)
    print("RESULT " + json.dumps(out))


class _RssSampler:
    """Peak resident memory from now on, sampled every 2 ms from /proc/self/statm."""

    def __init__(self) -> None:
        import threading

        self.start = self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self._rss())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())


def run_child(k: int, batch: int, policy: str, *budget: str) -> dict:
    env = dict(os.environ, MXNET_SUBGRAPH_VERBOSE="0")
    proc = subprocess.run([sys.executable, __file__, "_child", str(k), str(batch), policy,
                           *budget],
                          capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"k": k, "policy": policy, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}


def emit(args, lines: list[str], note: str) -> None:
    """Print the tables; with --out also write them, after the command and commit that made
    them and `note` (what the columns are), as a results file."""
    print("\n".join(lines), flush=True)
    if getattr(args, "out", None):
        from provenance import generated_by

        head = [generated_by("scripts/recursive_benchmark.py", args.argv) + " " + note, ""]
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(head + lines) + "\n")


def cmd_depth(args) -> None:
    rows = []
    lines = [f"Chains of 2^k basic residual blocks (16 channels, 32x32, batch {args.batch}).",
             "", "Predicted (planned MB, simulator, no bind):", "",
             "| k | blocks | none MB | sqrt MB | recursive MB | kept MB | pool MB | segments "
             "| recursive recompute | plan s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for k in range(3, 0 if args.no_predict else args.kmax + 1):
        r = predict_depth(k, args.batch, with_sqrt=k <= args.sqrt_kmax)
        rows.append(r)
        lines.append(f"| {k} | {r['blocks']} | {r['none_mb']} | {r.get('sqrt_mb', '-')} | "
                     f"{r['recursive_mb']} | {r['kept_mb']} | {r['pool_mb']} | "
                     f"{r['segments']} | {r['recursive_ratio']} | {r['recursive_seconds']} |")
        print(lines[-1], flush=True)
    lines += ["", "Real training steps, each configuration in its own child process (two "
              "steps, the faster one shown; plain MXNet for `none`; `recursive` binds "
              "whatever `mxmirror.simple_bind` chooses, a one-recompute plan on MXNet's "
              "Executor where the segmented plan is not predicted below it). Resident "
              "memory of the process sampled every 2 ms from just before the bind: its "
              "peak, and its growth over the value before the bind:", "",
              "| k | policy | executor | peak RSS MB | RSS growth from bind MB | step s "
              "| measured recompute |", "|---|---|---|---|---|---|---|"]
    for k in range(args.run_kmin, args.run_kmax + 1):
        for policy in ("none", "recursive"):
            r = run_child(k, args.batch, policy)
            rows.append(r)
            lines.append(f"| {k} | {policy} | {r.get('executor', '-')} | "
                         f"{r.get('peak_rss_mb', r.get('error'))} | "
                         f"{r.get('rss_above_start_mb', '-')} | {r.get('step_seconds', '-')} "
                         f"| {r.get('measured_recompute', '-')} |")
            print(lines[-1], flush=True)
    emit(args, lines, "sqrt is planned up to k = --sqrt-kmax; real steps for k = --run-kmin "
                      "to --run-kmax. Step times are those of a shared 2-core machine.")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


# ------------------------------------------------------------------ ResNet-1001
def resnet1001_prepared():
    from mxmirror.api import prepare
    from symbols.resnet import resnet_by_depth

    sym = resnet_by_depth(1001, image_shape=(3, 224, 224))
    return prepare(sym, data=(32, 3, 224, 224), softmax_label=(32,))


def lstm_prepared():
    from mxmirror.api import prepare
    from symbols.lstm import input_shapes, paper_lstm

    return prepare(paper_lstm(200), **input_shapes(200, 64))


def cmd_resnet1001(args) -> None:

    prep = resnet1001_prepared()
    for policy in ("none", "sqrt", "recursive"):
        p = prep.own_plan(policy)
        extra = p.to_dict().get("segmented", "")
        print(f"ResNet-1001 batch 32: {policy:9s} planned {p.planned_mb:8.0f} MB  "
              f"recompute {p.recompute_ratio:5.2f}  ({p.plan_seconds:.0f} s) {extra}",
              flush=True)


# ------------------------------------------------------------------ trade-off
def cmd_whole(args) -> None:
    """ResNet-1001's segmented plan bound once in a child: every array it holds, measured,
    against the prediction (kept values: the dry run, as a CPU cannot run the step)."""
    p = resnet1001_prepared().plan(args.policy, args.budget)
    lines = [f"ResNet-1001 batch 32, {args.policy} {args.budget or ''}: {p.summary()}", ""]
    if p.execution.kind != "segmented":
        emit(args, lines, "")
        return
    t = time.perf_counter()
    r = p.execution.measure(p)
    lines += [f"Bound once in a child in {time.perf_counter() - t:.0f} s:", "",
              "| part | measured MB | predicted MB |", "|---|---|---|"]
    for part in r["measured_mb"]:
        lines.append(f"| {part} | {r['measured_mb'][part]:.1f} | "
                     f"{r['predicted_mb'][part]:.1f} |")
    total, pred = r["measured_mb"]["total"], r["predicted_mb"]["total"]
    lines += ["", f"Prediction / measured = {pred / total:.4f}; MXNet's figure per template "
              f"(each drawn from the pool, not added): {r['template_mxnet_mb']}"]
    emit(args, lines, "Measured: the bytes of every array the bound executor holds; kept "
                      "values from the dry run (a CPU cannot run the step).")


def cmd_steps(args) -> None:
    """Step time of none, sqrt, recursive and multilevel on one chain, each in its own
    child, with the predicted and measured recompute ratios."""
    from mxmirror import PlanError
    from mxmirror.api import prepare

    prep = prepare(chain_symbol(2**args.k), **shapes_for(args.batch))
    rec, sq = prep.plan("recursive"), prep.plan("sqrt")
    budget = f"{(rec.planned_bytes + sq.planned_bytes) / 2 / MB:.3f}MB"
    lines = [f"Chain of {2**args.k} residual blocks, batch {args.batch}; multilevel budget "
             f"{budget} (between recursive and sqrt).", "",
             "| policy | executor | planned MB | predicted recompute | measured recompute | "
             "step s | vs none |", "|---|---|---|---|---|---|---|"]
    base = None
    for policy, b in (("none", None), ("sqrt", None), ("recursive", None),
                      ("multilevel", budget)):
        try:
            p = prep.plan(policy, b)
        except PlanError as exc:  # small chains: the budget can fall below the DP's floor
            lines.append(f"| {policy} | refused: {exc} | | | | | |")
            print(lines[-1], flush=True)
            continue
        r = run_child(args.k, args.batch, policy, *([b] if b else []))
        base = base or r["step_seconds"]
        lines.append(f"| {policy} | {r['executor']} | {p.planned_mb:.1f} | "
                     f"{p.recompute_ratio:.2f} | {r.get('measured_recompute', '-')} | "
                     f"{r['step_seconds']:.3f} | {r['step_seconds'] / base:.2f}x |")
        print(lines[-1], flush=True)
    emit(args, lines, "Each policy in its own child process, the faster of two steps, on a "
                      "shared 2-core machine: step times move by tens of percent with the "
                      "load.")


def tradeoff(name: str, prep, max_segments: int) -> dict:
    from mxmirror.planning import dp as multilevel_dp
    from mxmirror.planning.algorithm3 import candidates, segment_mirror

    a = prep.analysis
    t = time.perf_counter()
    dp = [(b, r) for b, r, _ in multilevel_dp.curve(a, max_segments=max_segments)]
    dp_seconds = time.perf_counter() - t
    one = []
    base = a.baseline
    one.append(("none", base.planned_bytes, 0.0))
    for policy in ("cheap", "sqrt"):
        p = prep.own_plan(policy)
        one.append((policy, p.planned_bytes, p.recompute_ratio))
    for c in candidates(a, steps=9, spread=8.0):
        b = c.budget
        s = a.score(c.mirror)
        one.append((f"segments B={b / MB:.0f}MB", s.planned_bytes, s.recompute_ratio))
        s = a.score(segment_mirror(a, c.cuts, only_cheap=True))
        one.append((f"cheap segments B={b / MB:.0f}MB", s.planned_bytes, s.recompute_ratio))
    rec = prep.own_plan("recursive")
    return {"name": name, "dp": dp, "one": one, "dp_seconds": dp_seconds,
            "recursive": (rec.planned_bytes, rec.recompute_ratio),
            "sqrt": [o for o in one if o[0] == "sqrt"][0][1:]}


def front(points):
    """Least recompute for each memory level (the Pareto front), sorted by bytes."""
    out = []
    for b, r in sorted(points):
        if not out or r < out[-1][1] - 1e-12:
            out.append((b, r))
    return out


def write_tradeoff(results: list[dict], out: Path) -> None:
    import matplotlib
    from provenance import generated_by

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Budget -> least recompute (planned MB as MXNet counts; recompute = extra "
             "forward FLOPs / forward FLOPs)", "",
             generated_by("scripts/recursive_benchmark.py", sys.argv[1:])
             + " Simulated figures (no bind); also writes tradeoff_points.json and "
               "tradeoff_curve.png.", ""]
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5))
    axes = axes if len(results) > 1 else [axes]
    for res, ax in zip(results, axes):
        one = front([(b, r) for _, b, r in res["one"]])
        dp = front(res["dp"])
        merged = front(one + dp)
        lines += [f"## {res['name']}", "",
                  f"sqrt: {res['sqrt'][0] / MB:.0f} MB at {res['sqrt'][1]:.2f}; recursive: "
                  f"{res['recursive'][0] / MB:.0f} MB at {res['recursive'][1]:.2f}; "
                  f"DP {res['dp_seconds']:.0f} s", "",
                  "| budget MB | least recompute | how |", "|---|---|---|"]
        one_set = set(one)
        for b, r in merged:
            how = "one recomputation per node (MXNet mirroring)" if (b, r) in one_set else \
                "segmented executor, multi-level DP"
            lines.append(f"| {b / MB:.0f} | {r:.3f} | {how} |")
        lines.append("")
        ax.step([b / MB for b, _ in one], [r for _, r in one], where="post",
                label="at most one recompute (mirroring)", color="tab:blue")
        ax.step([b / MB for b, _ in dp], [r for _, r in dp], where="post",
                label="multi-level DP (segmented)", color="tab:orange")
        ax.scatter([res["sqrt"][0] / MB], [res["sqrt"][1]], marker="s", color="tab:green",
                   zorder=3, label="sqrt")
        ax.scatter([res["recursive"][0] / MB], [res["recursive"][1]], marker="^",
                   color="tab:red", zorder=3, label="recursive")
        ax.set_xscale("log")
        ax.set_ylim(0, 10)  # the DP's last levels (tens of reruns) are clipped: see the table
        ax.set_xlabel("planned memory budget (MB)")
        ax.set_ylabel("recompute ratio (extra forward / forward)")
        ax.set_title(res["name"])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    (out / "tradeoff_points.json").write_text(json.dumps(results))
    fig.tight_layout()
    fig.savefig(out / "tradeoff_curve.png", dpi=120)
    (out / "tradeoff_table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def cmd_tradeoff(args) -> None:
    if args.replot:
        write_tradeoff(json.loads(Path(args.replot).read_text()), Path(args.out))
        return
    results = []
    if args.quick:
        from mxmirror.api import prepare
        from symbols.lstm import input_shapes, paper_lstm
        from symbols.resnet import resnet_by_depth

        g = prepare(resnet_by_depth(56, bottleneck=False, num_classes=10,
                                    image_shape=(3, 32, 32)),
                    data=(32, 3, 32, 32), softmax_label=(32,))
        results.append(tradeoff("ResNet-56 (CIFAR, batch 32)", g, 120))
        g = prepare(paper_lstm(20, num_layers=2, num_hidden=256, num_embed=256),
                    **input_shapes(20, 32, num_layers=2, num_hidden=256))
        results.append(tradeoff("LSTM 2x256, 20 steps, batch 32", g, 120))
    else:
        results.append(tradeoff("ResNet-1001 (bottleneck, batch 32, 224x224)",
                                resnet1001_prepared(), 400))
        print("resnet done", flush=True)
        results.append(tradeoff("LSTM 4x1024, 200 steps, batch 64", lstm_prepared(), 240))
    write_tradeoff(results, Path(args.out))


def main(argv: list[str] | None = None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "_child":
        child_step(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], *sys.argv[5:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("depth")
    p.add_argument("--kmax", type=int, default=10)
    p.add_argument("--sqrt-kmax", type=int, default=7)
    p.add_argument("--run-kmax", type=int, default=7)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--run-kmin", type=int, default=3)
    p.add_argument("--no-predict", action="store_true")
    p.add_argument("--json")
    p.add_argument("--out", help="also write the tables, with command and commit, here")
    sub.add_parser("resnet1001")
    p = sub.add_parser("whole")
    p.add_argument("--policy", default="recursive")
    p.add_argument("--budget")
    p.add_argument("--out", help="also write the table, with command and commit, here")
    p = sub.add_parser("steps")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--out", help="also write the table, with command and commit, here")
    p = sub.add_parser("tradeoff")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(ROOT / "docs" / "figures"))
    p.add_argument("--replot", help="tradeoff_points.json of an earlier run: only redraw")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    args.argv = sys.argv[1:] if argv is None else argv
    {"depth": cmd_depth, "resnet1001": cmd_resnet1001, "tradeoff": cmd_tradeoff,
     "whole": cmd_whole, "steps": cmd_steps}[args.cmd](args)


if __name__ == "__main__":
    main()
