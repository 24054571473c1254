#!/usr/bin/env python
"""MXNet's own bucketing language model, unchanged, plain and under `mxmirror run`: first-run times.

The script is MXNet 1.9.1's example/rnn/bucketing/lstm_bucketing.py (a BucketingModule, six
buckets of 10-60 steps, 2 x 200 LSTM); it is not part of mxmirror: give its path (from a
checkout of MXNet's source at tag 1.9.1). It runs from a temporary folder with generated text
in its data/ folder (sentences of random words of a small vocabulary, 2-60 words; the test
text a sample of the training text, so every word is known), for one epoch: plainly, then
under ``mxmirror run --policy P`` for each policy, each in a child of its own with a fresh
``MXMIRROR_CACHE`` (a new user's first run: templates learned, every bucket planned). The
planned runs also time each bind's planning (the bind hook's plan call; the first bucket
learns the templates, the further ones reuse them), and sqrt runs once more with every
bucket whose plan pays planned (the bind hook's shared-pool rule off), its effect side by
side. Wall and CPU
seconds (the child's user
+ system, every process it waited for included), the epoch's own time as the example logs
it, and the load average; the target (issue 25) is for a quiet machine.

Usage::

    python scripts/bucketing_lm.py --example PATH/lstm_bucketing.py [--policies sqrt search]
        [--lines 800] [--vocab 1000] [--repeat N] [--out docs/bucketing_lm.md]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import tempfile
from pathlib import Path

import _bootstrap  # noqa: F401 (this checkout importable)
from _timed import timed_run

ROOT = Path(__file__).resolve().parents[1]
TARGET = 1.5  # planned first run's wall time / plain's, sqrt (issue 25)
BUCKET_TARGET = 1.0  # seconds to plan each further bucket

# the process's peak RSS, printed at exit (plain and planned runs alike)
PEAK = """
import atexit, resource, sys
atexit.register(lambda: print("mxmirror-peak-rss-mb %.1f" % (
    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), file=sys.stderr))
"""
PLAIN = PEAK + """
import runpy
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
# `mxmirror run` with the bind hook's plan calls timed (printed as one JSON line at exit);
# {every}: each bucket planned, the rule that binds a bucket fitting the shared pool off
PLANNED = PEAK + """
import json, time
sys.path.insert(0, {root!r})
import mxmirror.frontends.hook as hook
if {every}:
    hook._fits_shared_pool = lambda plan, pool: ""
seconds, plan = [], hook.plan
def timed(*args, **kwargs):
    start = time.perf_counter()
    try:
        return plan(*args, **kwargs)
    finally:
        seconds.append(time.perf_counter() - start)
hook.plan = timed
atexit.register(lambda: print("mxmirror-plan-seconds " + json.dumps(seconds), file=sys.stderr))
from mxmirror.frontends.cli import main
sys.exit(main(["run", "--policy", {policy!r}, *sys.argv[1:]]))
"""


def write_text(folder: Path, lines: int, vocab: int, seed: int = 0) -> None:
    """The example's data/sherlockholmes.{train,test}.txt, generated."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    train = [" ".join(rng.choice(words) for _ in range(min(60, max(2, int(rng.expovariate(
        1 / 20)))))) for _ in range(lines)]
    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "data" / "sherlockholmes.train.txt").write_text("\n".join(train) + "\n")
    test = rng.sample(train, max(1, lines // 8))
    (folder / "data" / "sherlockholmes.test.txt").write_text("\n".join(test) + "\n")


def run(folder: Path, example: Path, policy: str | None, epochs: int,
        every: bool = False) -> dict:
    cache = Path(tempfile.mkdtemp(prefix="mxmirror-bucketing-"))
    env = dict(os.environ, MXMIRROR_CACHE=str(cache), MXNET_SUBGRAPH_VERBOSE="0")
    env.pop("MXMIRROR_POLICY", None)
    args = [str(example), "--num-epochs", str(epochs)]
    if policy is None:
        argv = [sys.executable, "-c", PLAIN, *args]
    else:
        argv = [sys.executable, "-c", PLANNED.format(root=str(ROOT), policy=policy,
                                                     every=every), *args]
    out, wall, cpu = timed_run(argv, cwd=folder, env=env)
    shutil.rmtree(cache, ignore_errors=True)
    if out.returncode:
        raise SystemExit(f"{policy or 'plain'} run failed:\n{out.stderr[-3000:]}")
    epoch = re.findall(r"Epoch\[0\] Time cost=([0-9.]+)", out.stderr)
    found = re.findall(r"mxmirror-plan-seconds (.*)", out.stderr)
    peak = re.findall(r"mxmirror-peak-rss-mb ([0-9.]+)", out.stderr)
    return {"wall": wall, "cpu": cpu, "peak": float(peak[-1]) if peak else float("nan"),
            "epoch": float(epoch[0]) if epoch else float("nan"),
            "plans": json.loads(found[-1]) if found else [],
            "bound": len(re.findall(r"^mxmirror: .*policy=", out.stderr, re.M)) - len(
                re.findall(r"^mxmirror: .*policy=.*not used, binding unplanned", out.stderr,
                           re.M))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", type=Path, required=True,
                    help="MXNet 1.9.1's example/rnn/bucketing/lstm_bucketing.py")
    ap.add_argument("--policies", nargs="+", default=["sqrt", "search"])
    ap.add_argument("--lines", type=int, default=800, help="sentences of training text")
    ap.add_argument("--vocab", type=int, default=1000, help="words in the vocabulary")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = ap.parse_args()
    from provenance import write_results

    example = args.example.resolve()
    if not example.is_file():
        raise SystemExit(f"not a file: {example}")
    folder = Path(tempfile.mkdtemp(prefix="mxmirror-lm-"))
    write_text(folder, args.lines, args.vocab)
    lines = ["| run | wall s | CPU s | epoch 0 s | wall / plain | peak RSS MB | binds planned "
             "| first plan s | further plans s (max) | load |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    loads = [os.getloadavg()[0]]
    runs = [(p, False) for p in args.policies]
    if "sqrt" in args.policies:  # the shared-pool rule's own effect, side by side
        runs.insert(args.policies.index("sqrt") + 1, ("sqrt", True))
    for _ in range(args.repeat):
        plain = run(folder, example, None, args.epochs)
        loads.append(os.getloadavg()[0])
        lines.append(f"| plain | {plain['wall']:.1f} | {plain['cpu']:.1f} | "
                     f"{plain['epoch']:.1f} | 1.00 | {plain['peak']:.0f} | - | - | - | "
                     f"{loads[-1]:.1f} |")
        print(lines[-1], file=sys.stderr, flush=True)
        for policy, every in runs:
            r = run(folder, example, policy, args.epochs, every)
            loads.append(os.getloadavg()[0])
            ratio = r["wall"] / plain["wall"]
            mark = ""
            if policy == "sqrt" and not every:
                mark = f" (target <= {TARGET}: {'met' if ratio <= TARGET else '**not met**'})"
            rest = r["plans"][1:]
            further = (f"{max(rest):.2f} (target <= {BUCKET_TARGET}: "
                       f"{'met' if max(rest) <= BUCKET_TARGET else '**not met**'})"
                       if rest else "-")
            name = f"`mxmirror run --policy {policy}`" + (
                ", the shared-pool rule off" if every else "")
            lines.append(f"| {name} | {r['wall']:.1f} | "
                         f"{r['cpu']:.1f} | {r['epoch']:.1f} | {ratio:.2f}{mark} | "
                         f"{r['peak']:.0f} | {r['bound']} of {len(r['plans'])} | "
                         f"{r['plans'][0] if r['plans'] else float('nan'):.2f} | {further} | "
                         f"{loads[-1]:.1f} |")
            print(lines[-1], file=sys.stderr, flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    write_results("MXNet's bucketing LM, plain and planned: a new user's first run",
                  "scripts/bucketing_lm.py", sys.argv[1:], [
        f"MXNet 1.9.1's example/rnn/bucketing/lstm_bucketing.py, unchanged, {args.epochs} "
        f"epoch(s) on generated text ({args.lines} sentences, {args.vocab} words); every run "
        f"in a child of its own with an empty `MXMIRROR_CACHE`. Binds planned: of the bind "
        f"hook's plan calls (one per bucket bound; the first learns the templates), those "
        f"whose log line does not say `not used, binding unplanned` (a further bucket whose "
        f"unplanned storage fits the default bucket's pool as well as its plan's binds "
        f"unplanned: the plan would only add its recomputation; so does a plan that saves "
        f"less than its mirror copies' own structures hold). Peak RSS: the process's own "
        f"(`ru_maxrss`, the learner child not counted)."],
        lines, args.out, loads)


if __name__ == "__main__":
    main()
