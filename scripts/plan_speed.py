#!/usr/bin/env python
"""Planning time (search by default), this checkout against an older one, back to back.

On a machine shared with other jobs wall-clock times swing with the load, so each plan
runs in its own child process, old and new alternately per network, and both the wall
time and the child's CPU time (``time.process_time``: what the planning itself used) are
reported, with the load average. The plan cache is off for the planning (a folder of
the child's own that starts empty; templates still come from the user's cache), and
the MB and recompute ratio of both plans are printed: they must be the same.

Usage::

    python scripts/plan_speed.py --old CHECKOUT [--only NAME,...] [--repeat N]
        [--policies P ...] [--budget-factor F] [--out docs/plan_speed.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BUDGETED = ("budget", "auto", "multilevel")

NETWORKS = {
    "ResNet-200": ("from symbols.resnet import resnet\n"
                   "sym = resnet([3, 24, 36, 3], act='leaky')\n"
                   "shapes = {'data': (32, 3, 224, 224), 'softmax_label': (32,)}\n"),
    "ResNet-1001": ("from symbols.resnet import resnet\n"
                    "sym = resnet([3, 120, 207, 3], act='leaky')\n"
                    "shapes = {'data': (32, 3, 224, 224), 'softmax_label': (32,)}\n"),
    "LSTM 4x1024x200": ("from symbols.lstm import input_shapes, paper_lstm\n"
                        "sym = paper_lstm(200)\nshapes = input_shapes(200, 64)\n"),
}

CHILD = """
import json, sys, tempfile, time
sys.path.insert(0, {root!r})
from pathlib import Path
import mxmirror.api
try:  # checkouts with a plan cache: an empty folder of this child
    from mxmirror.planning import cache
    folder = Path(tempfile.mkdtemp())
    cache.plans_dir = lambda: folder
except ImportError:
    pass
{network}
budget = None
if {factor!r} is not None:  # a share of the sqrt plan's bytes, as plan_table.py gives
    budget = int(mxmirror.api.prepare(sym, **shapes).plan("sqrt").planned_bytes * {factor!r})
prep = mxmirror.api.prepare(sym, **shapes)
wall, cpu = time.perf_counter(), time.process_time()
p = prep.plan({policy!r}, budget)
print(json.dumps({{"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
                  "planned_bytes": p.planned_bytes, "recompute_ratio": p.recompute_ratio}}))
"""


def run(root: Path, network: str, policy: str, factor: float | None = None) -> dict:
    code = CHILD.format(root=str(root), network=NETWORKS[network], policy=policy,
                        factor=factor)
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def commit_of(root: Path) -> str:
    got = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                         capture_output=True, text=True)
    return got.stdout.strip() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="a checkout of the older commit")
    ap.add_argument("--only", help="comma-separated network names")
    ap.add_argument("--policies", nargs="+", default=["search"],
                    help="planned in both checkouts under the same name (default: search)")
    ap.add_argument("--budget-factor", type=float, default=1.25,
                    help="budgeted policies get this times the sqrt plan's bytes (1.25, as "
                         "plan_table.py gives budget)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = ap.parse_args()
    from provenance import generated_by

    old = Path(args.old).resolve()
    names = args.only.split(",") if args.only else list(NETWORKS)
    lines = ["| network | policy | old MB | new MB | same plan | old wall s | new wall s "
             "| old CPU s | new CPU s | CPU speed-up |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    loads = [os.getloadavg()]
    for name in names:
        for policy in args.policies:
            factor = args.budget_factor if policy in BUDGETED else None
            for _ in range(args.repeat):
                a = run(old, name, policy, factor)
                b = run(ROOT, name, policy, factor)
                loads.append(os.getloadavg())
                same = (a["planned_bytes"] == b["planned_bytes"]
                        and abs(a["recompute_ratio"] - b["recompute_ratio"]) < 1e-12)
                lines.append(
                    f"| {name} | {policy} | {a['planned_bytes'] / 2**20:.1f} | "
                    f"{b['planned_bytes'] / 2**20:.1f} | {'yes' if same else '**no**'} | "
                    f"{a['wall']:.1f} | {b['wall']:.1f} | {a['cpu']:.1f} | {b['cpu']:.1f} | "
                    f"{a['cpu'] / max(b['cpu'], 1e-9):.1f}x |")
                print(lines[-1], file=sys.stderr, flush=True)
    text = "\n".join([
        "# Planning time against an older commit", "",
        generated_by("scripts/plan_speed.py", sys.argv[1:]) + " Do not edit by hand.", "",
        f"Old: commit {commit_of(old)}; new: this commit. Each plan runs in its own child, old "
        f"and new back to back per network and policy, plan cache empty; budgeted policies "
        f"({', '.join(BUDGETED)}) get {args.budget_factor}x the sqrt plan's bytes.", "",
        f"Machine: {os.cpu_count()} cores; load average (1 min) along the run: "
        f"{', '.join(f'{x[0]:.1f}' for x in loads)}. Wall: planning only (after "
        f"`prepare`); CPU: the child's process time over the same span.", "",
        *lines, ""])
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
