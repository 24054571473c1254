"""`mxmirror fit` checked against MXNet: the batch found per policy, and MXNet's measured total
at that batch (fits) and at the next one (does not).

For ResNet-50 and ResNet-1001 (224x224) and the paper's LSTM (4 x 1024, 200 steps), at each
memory size, the search of ``mxmirror fit`` (mxmirror.fitting, the same code the command runs)
finds the largest batch per policy on the simulator. Then each plan is bound by MXNet in a
child process (not stepped) at that batch and the next. Mirror plans: measured total = MXNet's
``Total X MB allocated`` (whole MB, rounded down) + the arguments, argument gradients and aux
states simple_bind allocates. Segmented plans (recursive, multilevel) run on several executors:
their measured total is every array the bound SegmentedExecutor holds
(mxmirror.runtime.segmented.measure: pool, statistics, slots, outputs, masks, kept states)
plus the user's arguments, argument gradients and aux states it was bound with.

    python scripts/fit_table.py [--memory 4GB 8GB 12GB] [--networks resnet50 ...]
        [--policies none cheap ...] [--jobs N] [--out docs/fit_table.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _bootstrap  # noqa: F401 (this checkout importable)

NETWORKS = ("resnet50", "resnet1001", "lstm")


def _network(name: str):
    from symbols import lstm, resnet

    if name == "resnet50":
        return "ResNet-50, N x 3 x 224 x 224", resnet.resnet_by_depth(50), {
            "data": ("N", 3, 224, 224)}
    if name == "resnet1001":
        return "ResNet-1001, N x 3 x 224 x 224", resnet.resnet([3, 120, 207, 3], act="leaky"), {
            "data": ("N", 3, 224, 224)}
    shapes = lstm.input_shapes(200, 1)
    return "LSTM 4 x 1024, 200 steps, batch N", lstm.paper_lstm(200), {
        k: ("N", *v[1:]) for k, v in shapes.items()}


def _child() -> None:
    """Bind one planned symbol; print MXNet's planned MB and the bytes of its arrays."""
    import mxnet as mx

    from mxmirror.adapter.children import allocated_mb

    job = json.loads(sys.stdin.read())
    sym = mx.sym.load_json(job["symbol"])
    ex = sym.simple_bind(mx.cpu(), grad_req=job["grad_req"],
                         **{k: tuple(v) for k, v in job["shapes"].items()})
    planned = allocated_mb(ex)[0]
    arrays = ex.arg_arrays + [g for g in ex.grad_arrays if g is not None] + ex.aux_arrays
    print(json.dumps({"planned_mb": planned,
                      "resident_bytes": sum(a.size * a.dtype(0).itemsize for a in arrays)}))


def measured_total_mb(prep, policy: str, budget: int | None) -> float:
    """The measured total of this policy's plan of `prep`, bound in a child."""
    p = prep.plan(policy, budget)
    if p.execution.kind != "mirror":  # every array the SegmentedExecutor holds, and the user's
        measured = p.execution.measure(p)
        return measured["measured_mb"]["total"] + measured["user_mb"]
    job = {"symbol": p.execution.symbol_json(p) if p.recomputed_ids else p.source_json,
           "grad_req": p.inputs.grad_req,
           "shapes": {k: list(v) for k, v in p.inputs.shapes.items()}}
    env = dict(os.environ, MXNET_SUBGRAPH_VERBOSE="0")
    env.pop("MXNET_BACKWARD_DO_MIRROR", None)
    proc = subprocess.run([sys.executable, __file__, "--child"], input=json.dumps(job),
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"bind failed: {tail[:200]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["planned_mb"] + out["resident_bytes"] / 2**20


def _budget(search, policy: str, k: int, memory: int) -> int | None:
    from mxmirror.ir.graph import resident_bytes
    from mxmirror.tools import fitting

    if policy not in fitting.BUDGETED:
        return None
    return memory - sum(resident_bytes(search.prepared(k).analysis.graph))


def network_rows(net: str, policies: tuple[str, ...], memories: list[str],
                 skip: list[str]) -> list[str]:
    """The table's rows for one network, by memory size, then policy."""
    from mxmirror.api import parse_budget
    from mxmirror.tools import fitting

    title, sym, template = _network(net)
    search = fitting.batch_search(sym, template)
    rows = []
    for policy in policies:  # policy outer: a policy's plans per batch serve every size
        if f"{net}:{policy}" in skip:
            continue
        for mem_text in memories:
            memory = parse_budget(mem_text)
            start = time.perf_counter()
            good, bad = search.largest(policy, memory)
            took = time.perf_counter() - start
            if good is None:
                row = [title, mem_text, policy, "0", "-", "-", "-", "-", "-", f"{took:.0f}"]
            else:
                at = measured_total_mb(search.prepared(good.size), policy,
                                       _budget(search, policy, good.size, memory))
                nxt = None
                if bad is not None and bad.planned_bytes:
                    nxt = measured_total_mb(search.prepared(bad.size), policy,
                                            _budget(search, policy, bad.size, memory))
                if bad is not None and not bad.planned_bytes:
                    verdict = (("yes" if at <= memory / 2**20 else "NO")
                               + " / no plan at batch+1")
                else:
                    verdict = (("yes" if at <= memory / 2**20 else "NO") + " / "
                               + ("yes" if nxt is not None and nxt > memory / 2**20
                                  else "NO"))
                row = [title, mem_text, policy, str(good.value),
                       f"{good.total_bytes / 2**20:.0f}", f"{at:.0f}",
                       "-" if nxt is None else f"{nxt:.0f}", verdict,
                       f"{good.recompute_ratio:.2f}x", f"{took:.0f}"]
            rows.append((memories.index(mem_text), "| " + " | ".join(row) + " |"))
            print(rows[-1][1], file=sys.stderr, flush=True)
    return [line for _, line in sorted(rows, key=lambda r: r[0])]


def _rows_in_child(net: str, args: argparse.Namespace) -> list[str]:
    """network_rows in a child process of its own (networks run side by side)."""
    cmd = [sys.executable, __file__, "--rows-of", net, "--memory", *args.memory]
    cmd += ["--policies", *args.policies] if args.policies else []
    cmd += ["--skip", *args.skip] if args.skip else []
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)  # progress: on stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{net}: the child exited with {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memory", nargs="+", default=["4GB", "8GB", "12GB"])
    ap.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=NETWORKS)
    ap.add_argument("--policies", nargs="+", default=None)
    ap.add_argument("--skip", nargs="+", default=[], metavar="NETWORK:POLICY",
                    help="pairs left out (e.g. slow plans on big graphs); listed below the table")
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    ap.add_argument("--jobs", type=int, default=1, help="networks planned side by side")
    ap.add_argument("--rows-of", choices=NETWORKS, help=argparse.SUPPRESS)  # a child's job
    args = ap.parse_args()
    if args.rows_of:
        from mxmirror.tools import fitting

        print(json.dumps(network_rows(args.rows_of, tuple(args.policies or fitting.POLICIES),
                                      args.memory, args.skip)))
        return 0

    from provenance import generated_by

    from mxmirror.tools import fitting

    policies = tuple(args.policies or fitting.POLICIES)
    fitting.check_policies(policies)
    lines = [
        "# `mxmirror fit` against MXNet's measured total",
        "",
        generated_by("scripts/fit_table.py", sys.argv[1:]) + " Do not edit by hand.",
        "",
        f"Memory counted: {fitting.COUNTED}. *batch*: the largest batch `mxmirror fit` finds "
        "on the simulator. *MXNet at batch / batch+1*: from a bind in a child process (not "
        "stepped); data and labels get no gradient, as Module binds them. Mirror plans: "
        "MXNet's own `Total X MB allocated` (whole MB, rounded down) + the argument, gradient "
        "and aux arrays `simple_bind` allocates. Segmented plans (recursive, multilevel): "
        "every array the bound SegmentedExecutor holds (`Plan.mxnet_mb()`, "
        "mxmirror.runtime.segmented.measure: "
        "its pool, the BatchNorm statistics its pool's owner holds, slot arrays incl. "
        "arguments, gradients and aux states, output copies, masks and the kept boundary "
        "values at their dry-run peak), which the prediction counts to the byte. "
        "*no plan at batch+1*: "
        "the budgeted policy refuses the next batch (its smallest plan does not fit).",
        "",
        "| network | memory | policy | batch | predicted total MB | MXNet at batch MB "
        "| MXNet at batch+1 MB | fits / next does not | recompute | search s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    if args.jobs > 1 and len(args.networks) > 1:  # one child per network, `jobs` at once
        with ThreadPoolExecutor(args.jobs) as pool:
            per_net = list(pool.map(lambda net: _rows_in_child(net, args), args.networks))
    else:
        per_net = [network_rows(net, policies, args.memory, args.skip)
                   for net in args.networks]
    for rows in per_net:
        lines += rows
    if args.skip:
        lines += ["", "Left out: " + ", ".join(args.skip) + "."]
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        _child()
    else:
        sys.exit(main())
