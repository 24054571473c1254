#!/usr/bin/env python
"""Side-by-side memory / time benchmark of mirror plans on MXNet 1.9.1 (CPU).

For every network one markdown table with the rows

* no plan (plain bind),
* ``MXNET_BACKWARD_DO_MIRROR=1`` (MXNet's built-in mirroring),
* memonger ``search_plan`` (the paper's own planner, loaded at run time by
  ``scripts/memonger_compat.py``; a "not installed" row when it cannot be),
* mxmirror ``cheap`` / ``sqrt`` / ``optimal`` / ``budget`` (budget = 1.25x
  the sqrt plan's predicted bytes),

and the columns MXNet's own ``Total X MB allocated`` (bind in a child
process), mxmirror's predicted MB and its error, plan time, recompute ratio
(extra forward FLOPs / forward FLOPs, mxmirror's estimate for every row),
MB relative to memonger, and -- on the small, CPU-steppable configurations
only -- the training-step time relative to no plan and the peak RSS of a
child process that binds that one variant and runs a few steps.

Every figure uses ``grad_req='write'`` for every argument (data and labels
included), memonger's convention, so all rows compare like with like.  The
ImageNet ResNets carry memonger's tags as its ``example_resnet.py`` places
them (``memonger_tags="example"``), the LSTMs the tags of symbols/lstm.py.

Every bind happens in a child process (one per figure), so this process
never holds a big executor.  Step times are taken in one child per network
that binds all variants and interleaves their steps (round robin, rotating
the order every round): median of ``--steps`` timed steps after
``--warmup`` warm-up steps, each step ``forward(is_train=True)`` +
``backward()`` + ``wait_to_read`` on every output and gradient.

Usage::

    python scripts/benchmark_plans.py [--quick] [--out docs/benchmark.md]

``--quick`` runs only the small configurations (about two minutes).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _bootstrap import ROOT

from mxmirror.adapter.children import allocated_mb, child_env
from mxmirror.adapter.figure import mxnet_mb
from mxmirror.adapter.reader import load_graph

GRAD_REQ = "write"
MIRROR_ENV = {"MXNET_BACKWARD_DO_MIRROR": "1"}
BUDGET_FACTOR = 1.25
TARGET_VS_MEMONGER = 0.8
PAPER_STEP_RATIO = 1.3

# memonger's figures for the two ImageNet ResNets with its example tags
# (leaky, batch 32, 224x224): the check that "example" reproduces them.
MEMONGER_REFERENCE_MB = {"ResNet-200": 2520, "ResNet-1001": 4242}


# ------------------------------------------------------------------ networks
@dataclass
class Config:
    name: str
    kind: str  # "resnet" | "lstm"
    kwargs: dict[str, Any]
    batch: int
    steppable: bool
    note: str = ""
    shapes: dict[str, tuple] = field(default_factory=dict)


def configs(quick: bool) -> list[Config]:
    big = [
        Config("ResNet-200", "resnet",
               dict(units=[3, 24, 36, 3], act="leaky", image_shape=(3, 224, 224)),
               32, False, "bottleneck [3,24,36,3], leaky, batch 32, 3x224x224, bind only"),
        Config("ResNet-1001", "resnet",
               dict(units=[3, 120, 207, 3], act="leaky", image_shape=(3, 224, 224)),
               32, False, "bottleneck [3,120,207,3], leaky, batch 32, 3x224x224, bind only"),
        Config("LSTM 4x1024, 200 steps", "lstm",
               dict(seq_len=200, num_layers=4, num_hidden=1024, num_embed=1024),
               64, False, "paper LSTM 4 layers x 1024, 200 steps, batch 64, bind only"),
    ]
    small = [
        Config("ResNet-80 (96x96)", "resnet",
               dict(units=[3, 8, 12, 3], act="leaky", image_shape=(3, 96, 96)),
               8, True, "bottleneck [3,8,12,3], leaky, batch 8, 3x96x96"),
        Config("CIFAR ResNet-110", "resnet",
               dict(units=[18, 18, 18], bottleneck=False, act="relu", num_classes=10,
                    image_shape=(3, 32, 32)),
               32, True, "basic-block [18,18,18], relu, 10 classes, batch 32, 3x32x32"),
        Config("LSTM 4x256, 30 steps", "lstm",
               dict(seq_len=30, num_layers=4, num_hidden=256, num_embed=256),
               16, True, "paper LSTM 4 layers x 256, 30 steps, batch 16"),
    ]
    if quick:  # same networks, smaller batches / sequence, so --quick stays near 2 min
        small[0].batch, small[0].note = 4, small[0].note.replace("batch 8", "batch 4")
        small[1].batch, small[1].note = 16, small[1].note.replace("batch 32", "batch 16")
        small[2].kwargs["seq_len"] = 20
        small[2].name, small[2].note = "LSTM 4x256, 20 steps", small[2].note.replace(
            "30 steps", "20 steps")
    out = small if quick else big + small
    for c in out:
        c.shapes = shapes_of(c)
    return out


def build(kind: str, kwargs: dict[str, Any], tags: bool):
    """The network; with ``tags`` memonger's hints (example placement for ResNets)."""
    if kind == "resnet":
        from symbols.resnet import resnet

        return resnet(memonger_tags="example" if tags else False, **kwargs)
    from symbols.lstm import paper_lstm

    return paper_lstm(memonger_tags=tags, **kwargs)


def shapes_of(c: Config) -> dict[str, tuple]:
    if c.kind == "resnet":
        return {"data": (c.batch, *c.kwargs["image_shape"]), "softmax_label": (c.batch,)}
    from symbols.lstm import input_shapes

    return input_shapes(c.kwargs["seq_len"], c.batch, num_layers=c.kwargs["num_layers"],
                        num_hidden=c.kwargs["num_hidden"])


# ------------------------------------------------------------------ children
def run_child(job: dict) -> dict:
    """Run one job of ``_child_main`` in a fresh interpreter; its JSON answer."""
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_child"],
                          input=json.dumps(job), capture_output=True, text=True,
                          env=child_env())
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"child job {job['kind']} failed (rc={proc.returncode}): {tail}")
    return json.loads(lines[-1][len("RESULT "):])


def _child_main() -> None:
    job = json.loads(sys.stdin.read())
    kind = job["kind"]
    if kind == "memonger":
        res = _child_memonger(job)
    elif kind == "step":
        res = _child_step(job)
    elif kind == "binds":
        res = _child_binds(job)
    elif kind == "rss":
        res = _child_rss(job)
    elif kind == "idle":
        import mxnet  # noqa: F401  the RSS floor of a process that only imports MXNet

        res = {}
    else:
        raise SystemExit(f"unknown job {kind}")
    res["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(res), flush=True)


def _child_memonger(job: dict) -> dict:
    import memonger_compat as mc

    if mc.load_memonger() is None:
        return {"error": mc.last_error or "memonger not available"}
    sym = build(job["net"], job["kwargs"], tags=True)
    shapes = {k: tuple(v) for k, v in job["shapes"].items()}
    buf = io.StringIO()
    start = time.perf_counter()
    with redirect_stdout(buf):  # memonger prints every trial
        planned, mb = mc.search_plan_cpu(sym, **shapes)
    seconds = time.perf_counter() - start
    return {"mb": mb, "seconds": seconds, "json": planned.tojson(),
            "trials": buf.getvalue().count("Search threshold")}


def _child_binds(job: dict) -> dict:
    """MXNet's MB for several small binds in one process (grad_req='write' everywhere)."""
    import mxnet as mx

    shapes = {k: tuple(v) for k, v in job["shapes"].items()}
    out = []
    for v in job["variants"]:
        _, total = _bind(mx, v["json"], shapes, v.get("env", {}), grad_req=GRAD_REQ,
                         fill=False)
        out.append(total)
    return {"mb": out}


def step_grad_req(sym, shapes: dict) -> dict[str, str]:
    """'write' for every argument but the labels: a step must be able to run backward
    (softmax_cross_entropy refuses a label gradient)."""
    return {a: ("null" if a in shapes and a.endswith("label") else "write")
            for a in sym.list_arguments()}


def _bind(mx, sym_json: str, shapes: dict, env: dict, grad_req=None, fill: bool = True):
    sym = mx.sym.load_json(sym_json)
    if grad_req is None:
        grad_req = step_grad_req(sym, shapes)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # MXNet reads MXNET_BACKWARD_DO_MIRROR at bind time
    try:
        ex = sym.simple_bind(mx.cpu(), grad_req=grad_req, **shapes)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    total = allocated_mb(ex)[0]
    if not fill:
        del ex
        return None, total
    rng = __import__("numpy").random.RandomState(0)
    for name, arr in ex.arg_dict.items():
        if name.endswith("label"):
            ncls = max(2, int(job_num_classes(sym)))
            arr[:] = rng.randint(0, ncls, size=arr.shape)
        elif name in shapes:
            arr[:] = rng.uniform(-1, 1, size=arr.shape)
        else:
            arr[:] = rng.normal(0, 0.01, size=arr.shape)
    for name, arr in ex.aux_dict.items():
        arr[:] = 1.0 if name.endswith("var") else 0.0
    return ex, total


def job_num_classes(sym) -> int:
    """Smallest classifier width, so random labels are valid class indices."""
    widths = []
    for attrs in sym.attr_dict().values():
        if "num_hidden" in attrs:
            widths.append(int(attrs["num_hidden"]))
    return min(widths) if widths else 2


def _step(ex) -> None:
    ex.forward(is_train=True)
    ex.backward()
    for a in ex.outputs:
        a.wait_to_read()
    for g in ex.grad_arrays:
        if g is not None:
            g.wait_to_read()


def _child_step(job: dict) -> dict:
    import mxnet as mx

    shapes = {k: tuple(v) for k, v in job["shapes"].items()}
    exes, mbs = [], {}
    for v in job["variants"]:
        ex, total = _bind(mx, v["json"], shapes, v.get("env", {}))
        exes.append((v["label"], ex))
        mbs[v["label"]] = total
    times: dict[str, list[float]] = {label: [] for label, _ in exes}
    n = len(exes)
    for rnd in range(job["warmup"] + job["steps"]):
        order = exes[rnd % n:] + exes[:rnd % n]  # rotate who goes first
        for label, ex in order:
            start = time.perf_counter()
            _step(ex)
            if rnd >= job["warmup"]:
                times[label].append(time.perf_counter() - start)
    return {"median": {k: statistics.median(t) for k, t in times.items()}, "times": times,
            "bind_mb": mbs}


def _child_rss(job: dict) -> dict:
    import mxnet as mx

    shapes = {k: tuple(v) for k, v in job["shapes"].items()}
    ex, total = _bind(mx, job["json"], shapes, job.get("env", {}))
    for _ in range(job["steps"]):
        _step(ex)
    return {"bind_mb": total}


# ------------------------------------------------------------------ predictions
def predict(sym_json: str, shapes: dict, do_mirror: bool = False):
    """mxmirror's simulated MB and recompute ratio for a symbol's own mirror attributes."""
    from mxmirror.planning.analysis import Analysis
    from mxmirror.sim import gradient_pass

    graph = load_graph(sym_json, shapes, grad_req=GRAD_REQ)
    mirror = gradient_pass.mirrored_by_mxnet(graph, do_mirror)
    s = Analysis(graph).score(mirror)
    return s.planned_bytes / 2**20, s.recompute_ratio


# ------------------------------------------------------------------ one network
@dataclass
class Row:
    label: str
    mxnet_mb: float | None = None  # whole MB from MXNet; a segmented plan's measured MB
    pred_mb: float | None = None
    plan_s: float | None = None
    recompute: float | None = None
    step_ratio: float | None = None
    step_s: float | None = None
    rss_mb: float | None = None
    step_bind_mb: int | None = None
    json: str | None = None
    env: dict = field(default_factory=dict)
    note: str = ""
    ours: bool = False


def bench_network(c: Config, args, bar) -> tuple[list[Row], dict]:
    import mxmirror
    from mxmirror.errors import PlanError

    info: dict[str, Any] = {"start": time.perf_counter()}
    shapes = c.shapes
    plain = build(c.kind, c.kwargs, tags=False)
    rows: list[Row] = []

    def step(msg: str) -> None:
        bar.set_postfix_str(f"{c.name}: {msg}")

    # no plan
    step("plan none")
    p_none = mxmirror.plan(plain, "none", grad_req=GRAD_REQ, **shapes)
    none_json = p_none.symbol.tojson()
    rows.append(Row("no plan", pred_mb=p_none.planned_mb, plan_s=None, recompute=0.0,
                    json=none_json))
    # MXNet's own mirroring
    step("predict DO_MIRROR")
    mpred, mrec = predict(none_json, shapes, do_mirror=True)
    rows.append(Row("MXNET_BACKWARD_DO_MIRROR=1", pred_mb=mpred, recompute=mrec,
                    json=none_json, env=dict(MIRROR_ENV)))
    # memonger
    step("memonger search_plan")
    try:
        mg = run_child({"kind": "memonger", "net": c.kind, "kwargs": c.kwargs,
                        "shapes": {k: list(v) for k, v in shapes.items()}})
    except RuntimeError as exc:
        mg = {"error": str(exc)}
    if "error" in mg:
        rows.append(Row("memonger search_plan", note=f"not installed ({mg['error']})"))
    else:
        gpred, grec = predict(mg["json"], shapes)
        rows.append(Row("memonger search_plan", mxnet_mb=mg["mb"], pred_mb=gpred,
                        plan_s=mg["seconds"], recompute=grec, json=mg["json"],
                        note=f"{mg['trials']} trial binds"))
    # ours
    plans = {}
    for policy in ("cheap", "sqrt", "optimal", "budget"):
        step(f"plan {policy}")
        budget, label, note = None, f"mxmirror {policy}", ""
        if policy == "budget":
            budget = int(plans["sqrt"].planned_bytes * BUDGET_FACTOR)
            label += f" ({budget / 2**20:.0f} MB = {BUDGET_FACTOR}x sqrt)"
        try:
            p = mxmirror.plan(plain, policy, budget=budget, grad_req=GRAD_REQ, **shapes)
        except PlanError as exc:
            if policy != "budget":
                raise
            # the budget planner cannot reach 1.25x sqrt: say so, and fall back to
            # 1.25x the optimal plan (its floor: one recomputation per node)
            info.setdefault("errors", []).append(f"budget {BUDGET_FACTOR}x sqrt: {exc}")
            budget = int(plans["optimal"].planned_bytes * BUDGET_FACTOR)
            label = (f"mxmirror budget ({budget / 2**20:.0f} MB = {BUDGET_FACTOR}x "
                     f"optimal; {BUDGET_FACTOR}x sqrt refused)")
            p = mxmirror.plan(plain, policy, budget=budget, grad_req=GRAD_REQ, **shapes)
        plans[policy] = p
        if p.execution.kind == "segmented":
            # only mxmirror's SegmentedExecutor runs it: every array it holds, measured
            # whole in a child (measure.py), stands for MXNet's figure; no step timed
            step(f"measure {policy} (segmented)")
            rows.append(Row(label + ", segmented", mxnet_mb=p.mxnet_mb(),
                            pred_mb=p.planned_mb, plan_s=p.plan_seconds,
                            recompute=p.recompute_ratio, ours=True, note=note))
            continue
        rows.append(Row(label, pred_mb=p.planned_mb, plan_s=p.plan_seconds,
                        recompute=p.recompute_ratio, json=p.symbol.tojson(), ours=True,
                        note=note))
    # MXNet's own figures: one child per bind for big nets, one child for all small ones
    todo = [r for r in rows if r.json is not None and r.mxnet_mb is None]
    if c.steppable:
        step(f"bind x{len(todo)}")
        mbs = run_child({"kind": "binds", "shapes": {k: list(v) for k, v in shapes.items()},
                         "variants": [{"json": r.json, "env": r.env} for r in todo]})["mb"]
        for r, mb in zip(todo, mbs):
            r.mxnet_mb = mb
    else:
        for r in todo:
            step(f"bind {r.label}")
            r.mxnet_mb = mxnet_mb(r.json, shapes, grad_req=GRAD_REQ, env=r.env or None)
    # step time and RSS (small configs only)
    if c.steppable and not args.no_step:
        variants = [r for r in rows if r.json is not None and "budget" not in r.label]
        step(f"step time x{len(variants)} interleaved")
        st = run_child({"kind": "step", "warmup": args.warmup, "steps": args.steps,
                        "shapes": {k: list(v) for k, v in shapes.items()},
                        "variants": [{"label": r.label, "json": r.json, "env": r.env}
                                     for r in variants]})
        base = st["median"]["no plan"]
        for r in variants:
            r.step_s = st["median"][r.label]
            r.step_ratio = r.step_s / base
            r.step_bind_mb = st["bind_mb"].get(r.label)
        info["step_child_rss_mb"] = st["maxrss_mb"]
        if not args.no_rss:
            for r in variants:
                step(f"rss {r.label}")
                rs = run_child({"kind": "rss", "json": r.json, "env": r.env,
                                "steps": args.rss_steps,
                                "shapes": {k: list(v) for k, v in shapes.items()}})
                r.rss_mb = rs["maxrss_mb"]
    info["seconds"] = time.perf_counter() - info["start"]
    info["baseline_mb"] = p_none.baseline_mb
    return rows, info


# ------------------------------------------------------------------ output
def _f(x, fmt: str, dash: str = "—") -> str:
    return dash if x is None else format(x, fmt)


def table(c: Config, rows: list[Row], info: dict) -> str:
    mg = next((r.mxnet_mb for r in rows if r.label.startswith("memonger")), None)
    head = ["plan", "MXNet MB (bind)", "mxmirror predicted MB", "pred. error %",
            "plan time (s)", "recompute ratio", "MB vs memonger", "step time vs no plan",
            "peak RSS MB"]
    out = [f"### {c.name}", "", f"{c.note}; shapes "
           + ", ".join(f"`{k}`={v}" for k, v in list(c.shapes.items())[:2])
           + (f" (+{len(c.shapes) - 2} more inputs)" if len(c.shapes) > 2 else "")
           + f"; grad_req='{GRAD_REQ}' for every argument.", "",
           "| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * 8) + "|"]
    for r in rows:
        if r.mxnet_mb is None and r.note.startswith("not installed"):
            out.append(f"| {r.label} | {r.note} |" + " |" * 7)
            continue
        err = None
        if r.pred_mb is not None and r.mxnet_mb:
            err = (r.pred_mb - r.mxnet_mb) / r.mxnet_mb * 100
        vs = r.mxnet_mb / mg if (mg and r.mxnet_mb is not None) else None
        step = "—" if r.step_ratio is None else f"{r.step_ratio:.2f}x ({r.step_s * 1e3:.0f} ms)"
        out.append("| " + " | ".join([
            r.label, _f(r.mxnet_mb, "d" if isinstance(r.mxnet_mb, int) else ".1f"),
            _f(r.pred_mb, ".1f"), _f(err, "+.2f"),
            _f(r.plan_s, ".2f"), _f(r.recompute, ".3f"),
            _f(vs, ".3f") + ("" if vs is None or not r.ours else
                             (" ✓" if vs <= TARGET_VS_MEMONGER else "")),
            step, _f(r.rss_mb, ".0f")]) + " |")
    notes = [f"network done in {info['seconds']:.0f} s"]
    if "step_child_rss_mb" in info:
        notes.append(f"step-time child (all variants bound at once) peak RSS "
                     f"{info['step_child_rss_mb']:.0f} MB")
    notes += [f"PlanError: {e}" for e in info.get("errors", [])]
    sb = [f"{r.label.replace('mxmirror ', '').replace(' search_plan', '')} "
          f"{r.step_bind_mb}" for r in rows if r.step_bind_mb is not None]
    if sb:
        notes.append("step/RSS children bind the labels without a gradient (a "
                     "softmax_cross_entropy backward refuses one); their MXNet MB: "
                     + ", ".join(sb))
    ref = MEMONGER_REFERENCE_MB.get(c.name)
    if ref is not None and mg is not None:
        notes.append(f"memonger 'example'-tag check: {mg} MB vs reference {ref} MB -> "
                     + ("reproduced" if mg == ref else "DIFFERENT"))
    out += ["", "_" + "; ".join(notes) + "._", ""]
    return "\n".join(out)


def summary(results: list[tuple[Config, list[Row], dict]]) -> str:
    lines = ["### Summary", "",
             f"Best mxmirror policy per network by MXNet's MB, against memonger "
             f"(target <= {TARGET_VS_MEMONGER}x) and step time against the paper's "
             f"~{PAPER_STEP_RATIO}x.", "",
             "| network | memonger MB | best mxmirror (MB) | vs memonger | "
             "sqrt step vs no plan | optimal step vs no plan | memonger step vs no plan |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for c, rows, _ in results:
        mg = next((r for r in rows if r.label.startswith("memonger")), None)
        ours = [r for r in rows if r.ours and r.mxnet_mb is not None
                and "budget" not in r.label]
        best = min(ours, key=lambda r: r.mxnet_mb) if ours else None
        get = {r.label: r for r in rows}
        mgmb = mg.mxnet_mb if mg else None

        def sr(label, get=get):
            r = get.get(label)
            return "—" if r is None or r.step_ratio is None else f"{r.step_ratio:.2f}x"

        lines.append("| " + " | ".join([
            c.name, _f(mgmb, "d"),
            f"{best.label.split()[1]} ({best.mxnet_mb})" if best else "—",
            _f(best.mxnet_mb / mgmb if best and mgmb else None, ".3f"),
            sr("mxmirror sqrt"), sr("mxmirror optimal"), sr("memonger search_plan")]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="only the small configurations")
    ap.add_argument("--out", help="also write the tables and the command to this file")
    ap.add_argument("--steps", type=int, default=None,
                    help="timed steps per variant (default 5; 3 with --quick)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="warm-up steps per variant (default 2; 1 with --quick)")
    ap.add_argument("--rss-steps", type=int, default=2,
                    help="steps run by each peak-RSS child")
    ap.add_argument("--no-step", action="store_true", help="skip step timing and RSS")
    ap.add_argument("--no-rss", action="store_true",
                    help="skip the per-variant RSS children (always skipped with --quick)")
    ap.add_argument("--only", help="comma-separated substrings of network names to run")
    ap.add_argument("--memonger-dir", default=os.environ.get("MEMONGER_DIR"),
                    help="a clone of dmlc/mxnet-memonger (default: $MEMONGER_DIR); without "
                         "it the memonger rows say 'not installed'")
    ap.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.steps is None:
        args.steps = 3 if args.quick else 5
    if args.warmup is None:
        args.warmup = 1 if args.quick else 2
    if args.quick:
        args.no_rss = True
    if args._child:
        _child_main()
        return 0
    if args.memonger_dir:  # read by memonger_compat in the child processes
        os.environ["MEMONGER_DIR"] = args.memonger_dir

    import mxnet as mx
    from provenance import generated_by
    from tqdm import tqdm

    cfgs = configs(args.quick)
    if args.only:
        keys = [k.strip().lower() for k in args.only.split(",")]
        cfgs = [c for c in cfgs if any(k in c.name.lower() for k in keys)]
    t0 = time.perf_counter()
    results = []
    idle = run_child({"kind": "idle"})["maxrss_mb"]
    with tqdm(cfgs, desc="networks", unit="net", file=sys.stderr) as bar:
        for c in bar:
            rows, info = bench_network(c, args, bar)
            results.append((c, rows, info))
            tqdm.write(table(c, rows, info), file=sys.stdout)
            sys.stdout.flush()
    total = time.perf_counter() - t0
    summ = summary(results)
    print(summ)
    print(f"_Total wall time {total:.0f} s._")
    if args.out:
        out = Path(args.out)
        if not out.is_absolute():
            out = ROOT / out
        out.parent.mkdir(parents=True, exist_ok=True)
        text = [
            "# Plan benchmark: MXNet mirroring, memonger and mxmirror", "",
            generated_by("scripts/benchmark_plans.py", sys.argv[1:] if argv is None else argv),
            "",
            f"MXNet {mx.__version__} (CPU), Python {platform.python_version()}, "
            f"{os.cpu_count()} CPU cores, {time.strftime('%Y-%m-%d %H:%M')}; "
            f"total wall time {total:.0f} s.", "",
            "Columns: *MXNet MB (bind)* is MXNet's own `Total X MB allocated` from "
            "`Executor.debug_str()` after `simple_bind` on CPU in a child process "
            "(memonger's figure is the smallest such figure its search saw); for a plan "
            "only mxmirror's SegmentedExecutor runs (a row marked *segmented*), every array "
            "that executor holds, measured after binding it in a child "
            "(`mxmirror.measure`). *mxmirror "
            "predicted MB* is mxmirror's simulation of MXNet's planner for that row's "
            "mirror set (for the MXNet-mirror and memonger rows too: the symbol's "
            "`__force_mirroring__` attributes, plus what `MXNET_BACKWARD_DO_MIRROR=1` "
            "mirrors). *recompute ratio* = extra forward FLOPs / forward FLOPs "
            "(mxmirror's estimate, every row). *MB vs memonger* = MXNet MB / memonger's "
            f"MXNet MB (✓ marks mxmirror plans at or below the {TARGET_VS_MEMONGER}x "
            "target). *step time vs no plan*: median of "
            f"{args.steps} steps after {args.warmup} warm-up steps, "
            "forward(is_train=True)+backward, all variants bound in one child "
            "process and stepped round robin. *peak RSS MB*: `ru_maxrss` of a "
            f"separate child that binds only that variant and runs {args.rss_steps} "
            f"steps (a child that only imports MXNet peaks at {idle:.0f} MB). "
            "All binds use grad_req='write' for every argument (memonger's "
            f"convention). Budget plan = {BUDGET_FACTOR}x the sqrt plan's predicted "
            "bytes.", "",
        ]
        text += [table(c, rows, info) for c, rows, info in results]
        text += [summ, f"_Total wall time {total:.0f} s._", ""]
        out.write_text("\n".join(text))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
