#!/usr/bin/env python
"""Figures 5-7 of Chen et al. 2016 ("Training Deep Nets with Sublinear Memory Cost").

* Fig. 5: memory of the planned intermediates vs depth, ImageNet bottleneck
  ResNet, batch 32, 3x224x224 (depth raised by deepening every stage).
* Fig. 6: the same vs sequence length, the paper's LSTM (4 x 1024, embed 1024,
  input 50, 5000 classes, batch 64, a loss at every step).
* Fig. 7: time per training batch, sublinear plan vs sharing, measured on
  CPU-runnable sizes (small ResNets and LSTMs), as ratios.

Memory columns (simulated by mxmirror's replay of MXNet 1.9.1's planner, in
the units of MXNet's ``Total X MB allocated``: intermediates only, no
parameters, gradients of parameters or workspace):

    none      no optimisation: every value its own buffer
    inplace   in-place reuse only (MXNet with NNVM_EXEC_MATCH_RANGE=0)
    sharing   in-place + sharing (MXNet's default plan)
    cheap     the paper's "drop bn-relu" (recompute cheap ops), on top of sharing
    sqrt      the paper's sublinear plan (Algorithm 3 + budget search), on top of sharing
    optimal   mxmirror's best plan with at most one recomputation per node
    recursive the O(log n) plan (Section 4.2): nodes recomputed several times, run by
              mxmirror's SegmentedExecutor (a chain of executors on one pool); its
              figure is mxmirror's prediction only, no single MXNet bind measures it

``mxnet_*`` columns are MXNet's own figure from a bind (in a child process,
nothing runs) of the unplanned symbol (sharing) and of the sqrt-planned one.
``grad_req`` is Module's: data, labels and initial states get no gradient.

    python scripts/paper_figures.py [--quick] [--out docs/figures] [--figs 5,6,7]

Writes figN_*.csv, figN_*.md, figN_*.png and summary.json into ``--out``; each names
the command and the commit it came from (the .csv in a leading ``#`` line, the .png in a
footer and its metadata, summary.json in one record per figure).
``--quick`` uses small sizes (under a minute); the full run takes about
15-25 minutes on two CPU cores.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import matplotlib
from _bootstrap import ROOT

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import mxnet as mx
import numpy as np
from provenance import command, commit, generated_by
from tqdm import tqdm

from mxmirror import api
from mxmirror.adapter.figure import mxnet_mb
from mxmirror.sim import memory_plan, training_graph
from symbols.lstm import input_shapes, paper_lstm
from symbols.resnet import resnet, resnet_by_depth, units_for_depth

MB = 2**20
STRATEGIES = ("none", "inplace", "sharing")
POLICIES = ("cheap", "sqrt", "optimal", "recursive")

# Sizes.  Full: the paper's; quick: enough to exercise every code path.
FULL = {
    "resnet_depths": [50, 101, 152, 200, 269, 401, 602, 803, 1001, 1202],
    "resnet_batch": 32,
    "resnet_image": (3, 224, 224),
    "resnet_mxnet_depths": [50, 200, 1001],
    "lstm_steps": [25, 50, 100, 200, 300],
    "lstm_mxnet_steps": [100, 200],
    "lstm_optimal_max_steps": 25,  # optimal's local search is slow on long unrolls
    "time_resnet": [("cifar", 20), ("cifar", 56), ("cifar", 110), ("imagenet", 50)],
    "time_lstm": [25, 50, 100],
    "time_steps": 8,
    "time_warmup": 2,
}
QUICK = {
    "resnet_depths": [50, 56],
    "resnet_batch": 8,
    "resnet_image": (3, 64, 64),
    "resnet_mxnet_depths": [50],
    "lstm_steps": [5, 10],
    "lstm_mxnet_steps": [],
    "lstm_optimal_max_steps": 0,
    "time_resnet": [("cifar", 8)],
    "time_lstm": [5],
    "time_steps": 3,
    "time_warmup": 1,
}
LSTM_BATCH = 64
# Fig. 7 sizes that two CPU cores step through in seconds.
TIME_CIFAR_BATCH, TIME_IMAGENET = 32, (8, (3, 96, 96))
TIME_LSTM = {"num_layers": 4, "num_hidden": 256, "num_embed": 256, "batch": 16}
QUICK_TIME_LSTM = {"num_layers": 2, "num_hidden": 32, "num_embed": 32, "batch": 4}


# ------------------------------------------------------------------ memory figures
def memory_row(sym: mx.sym.Symbol, shapes: dict, with_optimal: bool, label: dict,
               binds: ThreadPoolExecutor | None, bar: tqdm) -> dict:
    """Simulated MB for every strategy and policy; MXNet's binds queued on `binds`."""
    t0 = time.perf_counter()
    prep = api.prepare(sym, **shapes)
    graph = prep.analysis.graph
    row = dict(label)
    row["nodes"] = len(graph.op_nodes)
    tg = training_graph.build(graph, set())
    for s in STRATEGIES:
        row[s] = memory_plan.simulate(tg, s).total_bytes / MB
    sqrt_symbol = None
    for pol in POLICIES:
        if pol == "optimal" and not with_optimal:
            row[pol] = None
            continue
        bar.set_postfix_str(f"{label} {pol}")
        p = prep.plan(pol)
        row[pol] = p.planned_mb
        row[f"{pol}_recompute"] = p.recompute_ratio
        row[f"{pol}_plan_s"] = p.plan_seconds
        if pol == "sqrt":
            sqrt_symbol = p.symbol
    row["sharing_over_sqrt"] = row["sharing"] / row["sqrt"]
    row["none_over_sqrt"] = row["none"] / row["sqrt"]
    row["seconds"] = time.perf_counter() - t0
    if binds is not None:
        row["_mxnet"] = {
            "sharing": binds.submit(mxnet_mb, sym.tojson(), shapes),
            "sqrt": binds.submit(mxnet_mb, sqrt_symbol.tojson(), shapes),
        }
    return row


def collect_mxnet(rows: list[dict]) -> None:
    for row in rows:
        futs: dict[str, Future] | None = row.pop("_mxnet", None)
        row["mxnet_sharing"] = futs["sharing"].result() if futs else None
        row["mxnet_sqrt"] = futs["sqrt"].result() if futs else None
        row["mxnet_sharing_over_sqrt"] = (row["mxnet_sharing"] / row["mxnet_sqrt"]
                                          if futs and row["mxnet_sqrt"] else None)


def fig5(cfg: dict, binds: ThreadPoolExecutor) -> list[dict]:
    rows = []
    bar = tqdm(cfg["resnet_depths"], desc="Fig. 5 ResNet depths", unit="net")
    for depth in bar:
        batch, image = cfg["resnet_batch"], cfg["resnet_image"]
        sym = resnet_by_depth(depth, image_shape=image)
        shapes = {"data": (batch, *image), "softmax_label": (batch,)}
        label = {"depth": depth, "units": "-".join(map(str, units_for_depth(depth)))}
        rows.append(memory_row(sym, shapes, True, label,
                               binds if depth in cfg["resnet_mxnet_depths"] else None, bar))
    collect_mxnet(rows)
    return rows


def fig6(cfg: dict, binds: ThreadPoolExecutor) -> list[dict]:
    rows = []
    bar = tqdm(cfg["lstm_steps"], desc="Fig. 6 LSTM lengths", unit="net")
    for steps in bar:
        sym = paper_lstm(steps)
        shapes = input_shapes(steps, LSTM_BATCH)
        rows.append(memory_row(sym, shapes, steps <= cfg["lstm_optimal_max_steps"],
                               {"steps": steps},
                               binds if steps in cfg["lstm_mxnet_steps"] else None, bar))
    collect_mxnet(rows)
    return rows


# ------------------------------------------------------------------ Fig. 7: time
def _bind(sym: mx.sym.Symbol, shapes: dict, int_inputs: dict[str, int], seed: int = 0):
    req = {k: ("null" if k in shapes else "write") for k in sym.list_arguments()}
    exe = sym.simple_bind(mx.cpu(), grad_req=req, **shapes)
    rng = np.random.RandomState(seed)
    for name, arr in exe.arg_dict.items():
        if name in int_inputs:
            arr[:] = rng.randint(0, int_inputs[name], arr.shape)
        elif name.endswith(("_init_c", "_init_h")):
            arr[:] = 0
        else:
            arr[:] = rng.uniform(-0.05, 0.05, arr.shape)
    for arr in exe.aux_dict.values():
        arr[:] = 1 if arr.shape else 0
    return exe


def _step(exe) -> None:
    exe.forward(is_train=True)
    exe.backward()
    for g in exe.grad_arrays:
        if g is not None:
            g.wait_to_read()
    for o in exe.outputs:
        o.wait_to_read()


def time_pair(sym: mx.sym.Symbol, shapes: dict, int_inputs: dict[str, int], steps: int,
              warmup: int) -> dict:
    """Median step time of the unplanned (sharing) and the sqrt-planned symbol.

    Both executors live in this process and their steps alternate (the order
    flips every round), so machine load hits both alike.
    """
    p = api.plan(sym, "sqrt", **shapes)
    exes = {"sharing": _bind(sym, shapes, int_inputs), "sqrt": _bind(p.symbol, shapes,
                                                                     int_inputs)}
    for _ in range(warmup):
        for exe in exes.values():
            _step(exe)
    times: dict[str, list[float]] = {k: [] for k in exes}
    for i in range(steps):
        order = list(exes) if i % 2 == 0 else list(exes)[::-1]
        for k in order:
            t = time.perf_counter()
            _step(exes[k])
            times[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"sharing_s": med["sharing"], "sqrt_s": med["sqrt"],
            "time_ratio": med["sqrt"] / med["sharing"],
            "sqrt_recompute": p.recompute_ratio,
            "sharing_mb": p.baseline_mb, "sqrt_mb": p.planned_mb}


def fig7(cfg: dict, quick: bool) -> list[dict]:
    jobs = []
    for kind, depth in cfg["time_resnet"]:
        if kind == "cifar":
            batch, image = TIME_CIFAR_BATCH if not quick else 4, (3, 32, 32)
            sym = resnet_by_depth(depth, bottleneck=False, num_classes=10, image_shape=image)
            name = f"CIFAR ResNet-{depth} (basic), batch {batch}, 32x32"
            classes = 10
        else:
            batch, image = TIME_IMAGENET
            sym = resnet(units_for_depth(depth), num_classes=100, image_shape=image)
            name = f"ResNet-{depth} (bottleneck), batch {batch}, {image[1]}x{image[2]}"
            classes = 100
        shapes = {"data": (batch, *image), "softmax_label": (batch,)}
        jobs.append(({"network": name, "kind": "resnet", "size": depth}, sym, shapes,
                     {"softmax_label": classes}))
    lcfg = QUICK_TIME_LSTM if quick else TIME_LSTM
    for steps in cfg["time_lstm"]:
        sym = paper_lstm(steps, num_layers=lcfg["num_layers"], num_hidden=lcfg["num_hidden"],
                         num_embed=lcfg["num_embed"])
        shapes = input_shapes(steps, lcfg["batch"], num_layers=lcfg["num_layers"],
                              num_hidden=lcfg["num_hidden"])
        name = (f"LSTM {lcfg['num_layers']}x{lcfg['num_hidden']}, {steps} steps, "
                f"batch {lcfg['batch']}")
        jobs.append(({"network": name, "kind": "lstm", "size": steps}, sym, shapes,
                     {f"t{t}_label": 5000 for t in range(steps)}))
    rows = []
    for label, sym, shapes, ints in tqdm(jobs, desc="Fig. 7 step times", unit="net"):
        row = dict(label)
        row.update(time_pair(sym, shapes, ints, cfg["time_steps"], cfg["time_warmup"]))
        rows.append(row)
    return rows


# ------------------------------------------------------------------ output
def _fmt(v, digits: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def write_csv(path: Path, rows: list[dict], cols: list[str], made: str) -> None:
    """Rows as CSV after one `# Generated by ...` line (read with `comment="#"`)."""
    with open(path, "w", newline="") as f:
        f.write(f"# {made}\n")
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow(["" if r.get(c) is None else
                        (round(r[c], 3) if isinstance(r[c], float) else r[c]) for c in cols])


def memory_markdown(rows: list[dict], key: str, title: str, made: str = "") -> str:
    head = [key, "none", "inplace", "sharing", "drop bn-relu (cheap)", "sublinear (sqrt)",
            "optimal", "recursive (predicted)", "sharing / sqrt", "MXNet sharing", "MXNet sqrt",
            "MXNet sharing / sqrt", "sqrt recompute"]
    lines = [f"### {title}", "", made, "",
             "MB of planned intermediates (MXNet's `Total X MB allocated` units); "
             "`-`: not run at this size; MXNet columns: measured by a bind.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r[key]), _fmt(r["none"]), _fmt(r["inplace"]), _fmt(r["sharing"]),
                 _fmt(r["cheap"]), _fmt(r["sqrt"]), _fmt(r["optimal"]), _fmt(r["recursive"]),
                 _fmt(r["sharing_over_sqrt"], 1) + "x", _fmt(r["mxnet_sharing"]),
                 _fmt(r["mxnet_sqrt"]),
                 (_fmt(r["mxnet_sharing_over_sqrt"], 1) + "x")
                 if r["mxnet_sharing_over_sqrt"] else "-",
                 _fmt(r.get("sqrt_recompute"), 2)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


MEM_COLS = ["nodes", "none", "inplace", "sharing", "cheap", "sqrt", "optimal", "recursive",
            "sharing_over_sqrt", "none_over_sqrt", "mxnet_sharing", "mxnet_sqrt",
            "mxnet_sharing_over_sqrt", "cheap_recompute", "sqrt_recompute",
            "optimal_recompute", "recursive_recompute", "cheap_plan_s", "sqrt_plan_s",
            "optimal_plan_s", "recursive_plan_s", "seconds"]


def save_figure(fig, path: Path, stamp: str) -> None:
    """The plot with its command and commit as a footer and in the PNG's metadata."""
    fig.text(0.005, 0.005, stamp, fontsize=5, color="gray", ha="left", va="bottom")
    fig.savefig(path, dpi=110, metadata={"Source": stamp})
    plt.close(fig)


def memory_plot(rows: list[dict], key: str, xlabel: str, title: str, path: Path,
                stamp: str) -> None:
    xs = [r[key] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.6))
    styles = [("none", "no optimization", "o-"), ("inplace", "inplace", "s-"),
              ("sharing", "sharing", "^-"), ("cheap", "drop bn-relu", "v-"),
              ("sqrt", "sublinear plan (sqrt)", "D-"), ("optimal", "optimal (mxmirror)", "x--"),
              ("recursive", "recursive (predicted)", "+:")]
    for col, name, style in styles:
        pts = [(x, r[col] / 1024) for x, r in zip(xs, rows) if r.get(col)]
        if pts:
            ax.plot(*zip(*pts), style, label=name, markersize=4)
    for col, name, marker in (("mxnet_sharing", "MXNet bind: sharing", "*"),
                              ("mxnet_sqrt", "MXNet bind: sublinear", "P")):
        pts = [(x, r[col] / 1024) for x, r in zip(xs, rows) if r.get(col)]
        if pts:
            ax.plot(*zip(*pts), marker, color="black", markersize=10, label=name,
                    markerfacecolor="none")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("memory of intermediates (GB, log scale)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    save_figure(fig, path, stamp)


def time_markdown(rows: list[dict], made: str, load: tuple[float, float],
                  seconds: float) -> str:
    lines = ["### Fig. 7: time per batch, sublinear (sqrt) vs sharing, CPU", "", made, "",
             "Median of timed forward+backward steps, both executors in one process, steps "
             "alternating (the order flips every round). The machine was shared: its 1-minute "
             f"load average was {load[0]:.1f} at the start and {load[1]:.1f} at the end of "
             f"this {seconds / 60:.0f}-minute run on {os.cpu_count()} cores, so the seconds "
             "per batch are those of a loaded machine; the ratios compare steps that ran "
             "side by side under the same load.", "",
             "| network | sharing s/batch | sqrt s/batch | time ratio | predicted recompute "
             "(extra fwd FLOPs / fwd) | sharing MB | sqrt MB |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['network']} | {r['sharing_s']:.3f} | {r['sqrt_s']:.3f} | "
                     f"{r['time_ratio']:.2f}x | {r['sqrt_recompute']:.2f} | "
                     f"{r['sharing_mb']:.0f} | {r['sqrt_mb']:.0f} |")
    return "\n".join(lines) + "\n"


def time_plot(rows: list[dict], path: Path, stamp: str) -> None:
    kinds = [k for k in ("resnet", "lstm") if any(r["kind"] == k for r in rows)]
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 4.2), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        rs = [r for r in rows if r["kind"] == kind]
        x = np.arange(len(rs))
        ax.bar(x - 0.2, [r["sharing_s"] for r in rs], 0.4, label="sharing")
        ax.bar(x + 0.2, [r["sqrt_s"] for r in rs], 0.4, label="sublinear (sqrt)")
        for i, r in enumerate(rs):
            ax.text(i + 0.2, r["sqrt_s"], f"{r['time_ratio']:.2f}x", ha="center",
                    va="bottom", fontsize=8)
        ax.set_xticks(x)
        ax.set_xticklabels([r["network"].split(",")[0] + ("" if kind == "resnet" else
                            f", {r['size']} steps") for r in rs], rotation=20, fontsize=7,
                           ha="right")
        ax.set_ylabel("seconds per batch (CPU)")
        ax.set_title(f"Fig. 7 ({kind}): time per batch", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    save_figure(fig, path, stamp)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    ap.add_argument("--out", default=str(ROOT / "docs" / "figures"))
    ap.add_argument("--figs", default="5,6,7", help="which figures, e.g. 5,6")
    given = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(given)
    cfg = QUICK if args.quick else FULL
    figs = {int(f) for f in args.figs.split(",")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # What made each figure: summary.json keeps one record per figure, so figures run
    # separately into one directory each name their own command and commit.
    run = {"command": command("scripts/paper_figures.py", given), "commit": commit(),
           "quick": args.quick, "mxnet": mx.__version__, "machine": platform.platform(),
           "cpus": os.cpu_count(), "started_utc": time.strftime("%Y-%m-%d %H:%M:%S",
                                                                time.gmtime()),
           "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    made = generated_by("scripts/paper_figures.py", given)
    made += " The .csv and .png beside it come from the same run (summary.json: its record)."
    stamp = f"{run['command']}  @ {run['commit']}"
    summary: dict = {"runs": {}}
    t0 = time.perf_counter()

    def record(fig: str, rows: list[dict], started: float) -> None:
        summary[fig] = rows
        summary["runs"][fig] = {**run, "config": cfg,
                                "seconds": round(time.perf_counter() - started, 1),
                                "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}

    # MXNet's binds run one at a time in child processes while this one simulates.
    with ThreadPoolExecutor(max_workers=1) as binds:
        if 5 in figs:
            t5 = time.perf_counter()
            rows = fig5(cfg, binds)
            write_csv(out / "fig5_resnet_memory.csv", rows, ["depth", "units", *MEM_COLS],
                      made)
            size = f"batch {cfg['resnet_batch']}, " + "x".join(map(str, cfg["resnet_image"]))
            (out / "fig5_resnet_memory.md").write_text(memory_markdown(
                rows, "depth", f"Fig. 5: ResNet (bottleneck, ReLU), {size}", made))
            memory_plot(rows, "depth", "ResNet depth (layers)", f"Fig. 5: ResNet, {size}",
                        out / "fig5_resnet_memory.png", stamp)
            record("fig5", rows, t5)
        if 6 in figs:
            t6 = time.perf_counter()
            rows = fig6(cfg, binds)
            write_csv(out / "fig6_lstm_memory.csv", rows, ["steps", *MEM_COLS], made)
            (out / "fig6_lstm_memory.md").write_text(memory_markdown(
                rows, "steps", f"Fig. 6: LSTM 4x1024, batch {LSTM_BATCH}, by unrolled steps",
                made))
            memory_plot(rows, "steps", "sequence length (unrolled steps)",
                        f"Fig. 6: LSTM 4x1024, batch {LSTM_BATCH}",
                        out / "fig6_lstm_memory.png", stamp)
            record("fig6", rows, t6)
    if 7 in figs:
        t7 = time.perf_counter()
        rows = fig7(cfg, args.quick)
        write_csv(out / "fig7_time.csv", rows,
                  ["network", "kind", "size", "sharing_s", "sqrt_s", "time_ratio",
                   "sqrt_recompute", "sharing_mb", "sqrt_mb"], made)
        record("fig7", rows, t7)
        load = (run["load_average_at_start"][0], summary["runs"]["fig7"]
                ["load_average_at_end"][0])
        (out / "fig7_time.md").write_text(time_markdown(
            rows, made, load, summary["runs"]["fig7"]["seconds"]))
        time_plot(rows, out / "fig7_time.png", stamp)
    path = out / "summary.json"
    if path.exists():
        # Keep the other figures' rows and records (from earlier runs into this directory).
        old = json.loads(path.read_text())
        if isinstance(old.get("runs"), dict):
            for fig in ("fig5", "fig6", "fig7"):
                if fig not in summary and fig in old and fig in old["runs"]:
                    summary[fig] = old[fig]
                    summary["runs"][fig] = old["runs"][fig]
    path.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(f"wrote {out} in {time.perf_counter() - t0:.1f} s")
    for key in ("fig5", "fig6"):
        for r in summary.get(key, []):
            print(key, {k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items()
                        if k in ("depth", "steps", "sharing", "sqrt", "sharing_over_sqrt",
                                 "mxnet_sharing", "mxnet_sqrt", "mxnet_sharing_over_sqrt")})
    for r in summary.get("fig7", []):
        print("fig7", r["network"], f"{r['time_ratio']:.2f}x")
    return summary


if __name__ == "__main__":
    main()
