#!/usr/bin/env python
"""The whole `mxmirror plan` command as a new user runs it, this checkout against an older one.

Each command runs in its own child process with a fresh cache folder (``MXMIRROR_CACHE``: no
template, no plan), as a new user's first run: ``import mxnet``, template learning and
planning included ("cold"); then the same command again with that folder ("warm": the plan
is kept). Old and new run back to back per row. Wall time is the child's, start to exit;
CPU is the child's user + system time with every process it waited for (the learning
child). Both plans are printed (MB, recompute, a digest of the recomputed nodes and the
checkpoints): they must be the same. On a machine shared with other jobs wall times swing
with the load, so the load average is printed along the run; the targets (issue 25) are
for a quiet machine.

Usage::

    git worktree add /tmp/mxmirror-old 8e71a17
    python scripts/plan_speed.py --old /tmp/mxmirror-old [--only NAME,...] [--repeat N]
        [--out docs/plan_speed.md]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import _bootstrap  # noqa: F401 (this checkout importable)
from _timed import timed_run

ROOT = Path(__file__).resolve().parents[1]

# name -> (network, policy, budget, target wall seconds cold, warm)
ROWS = {
    "ResNet-1001 search": ("ResNet-1001", "search", None, 10, 2),
    "ResNet-1001 budget 3GB": ("ResNet-1001", "budget", "3GB", 15, 2),
    "ResNet-1001 auto 3GB": ("ResNet-1001", "auto", "3GB", 15, 2),
    "LSTM 4x1024x200 budget 1GB": ("LSTM 4x1024x200", "budget", "1GB", 15, 2),
}

# runs the command line of the checkout at argv[1] (its own mxmirror first on the path)
CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); sys.argv = sys.argv[1:]; "
         "from mxmirror.frontends.cli import main; sys.exit(main(sys.argv[1:]))")


def networks() -> dict:
    """name -> (symbol, shapes)."""
    from symbols.lstm import input_shapes, paper_lstm
    from symbols.resnet import resnet

    return {"ResNet-1001": (resnet([3, 120, 207, 3], act="leaky"),
                            {"data": (32, 3, 224, 224), "softmax_label": (32,)}),
            "LSTM 4x1024x200": (paper_lstm(200), input_shapes(200, 64))}


def command(root: Path, symbol_file: Path, shapes: dict, policy: str, budget) -> list[str]:
    args = [sys.executable, "-c", CHILD, str(root), "plan", str(symbol_file), "--json",
            "--policy", policy]
    for name, shape in shapes.items():
        args += ["--shape", f"{name}={','.join(map(str, shape))}"]
    return args + (["--budget", budget] if budget else [])


def timed(args: list[str], cache: Path) -> dict:
    """Wall and CPU seconds of one command in a child, and its JSON answer."""
    env = dict(os.environ, MXMIRROR_CACHE=str(cache), MXNET_SUBGRAPH_VERBOSE="0")
    env.pop("MXMIRROR_POLICY", None)
    out, wall, cpu = timed_run(args, env=env, cwd=tempfile.gettempdir())
    if out.returncode:
        raise SystemExit(f"{' '.join(args[:6])} ... failed:\n{out.stderr[-2000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    what = json.dumps([got["mirrored"], got["checkpoints"], got.get("segmented")])
    return {"wall": wall, "cpu": cpu, "mb": got["planned_mb"], "ratio": got["recompute_ratio"],
            "digest": hashlib.sha1(what.encode()).hexdigest()[:8]}


def cold_and_warm(root: Path, args: list[str]) -> tuple[dict, dict]:
    cache = Path(tempfile.mkdtemp(prefix="mxmirror-speed-"))
    try:
        return timed(args, cache), timed(args, cache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def commit_of(root: Path) -> str:
    got = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                         capture_output=True, text=True)
    return got.stdout.strip() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="a checkout of the older commit")
    ap.add_argument("--only", help="comma-separated row names (default: every row)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = ap.parse_args()
    from provenance import write_results

    old = Path(args.old).resolve()
    names = args.only.split(",") if args.only else list(ROWS)
    nets = networks()
    folder = Path(tempfile.mkdtemp(prefix="mxmirror-symbols-"))
    files = {}
    for net, (sym, _) in nets.items():
        files[net] = folder / f"{net.replace(' ', '_')}-symbol.json"
        sym.save(str(files[net]))
    lines = ["| command | old MB | new MB | same plan | old cold s (CPU) | new cold s (CPU) "
             "| target | old warm s (CPU) | new warm s (CPU) | target | load |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    loads = [os.getloadavg()[0]]
    for name in names:
        net, policy, budget, cold_target, warm_target = ROWS[name]
        shapes = nets[net][1]
        for _ in range(args.repeat):
            a_cold, a_warm = cold_and_warm(old, command(old, files[net], shapes, policy, budget))
            b_cold, b_warm = cold_and_warm(ROOT, command(ROOT, files[net], shapes, policy,
                                                         budget))
            loads.append(os.getloadavg()[0])
            same = all(a[k] == b[k] for a, b in ((a_cold, b_cold), (a_warm, b_warm),
                                                 (a_cold, a_warm), (b_cold, b_warm))
                       for k in ("mb", "ratio", "digest"))

            def cell(r: dict) -> str:
                return f"{r['wall']:.1f} ({r['cpu']:.1f})"

            lines.append(
                f"| {name} | {a_cold['mb']:.1f} | {b_cold['mb']:.1f} | "
                f"{'yes' if same else '**no**'} | {cell(a_cold)} | {cell(b_cold)} | "
                f"<= {cold_target} {'met' if b_cold['wall'] <= cold_target else '**not met**'}"
                f" | {cell(a_warm)} | {cell(b_warm)} | <= {warm_target} "
                f"{'met' if b_warm['wall'] <= warm_target else '**not met**'} | "
                f"{loads[-1]:.1f} |")
            print(lines[-1], file=sys.stderr, flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    write_results("The plan command's time against an older commit", "scripts/plan_speed.py",
                  sys.argv[1:], [
        f"Old: commit {commit_of(old)}; new: this commit. Each command is the whole "
        f"`mxmirror plan SYMBOL.json ... --json` in a child of its own: cold with an empty "
        f"`MXMIRROR_CACHE` (import mxnet, learning the templates in a child, planning), warm "
        f"the same command again (the plan kept). Seconds are wall time, CPU in brackets "
        f"(user + system, the learning child included); targets are for the new commit's "
        f"wall time on a quiet machine."],
        lines, args.out, loads)


if __name__ == "__main__":
    main()
