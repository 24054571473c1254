"""A hybridized decoder step called once per step in a Python loop (the seq2seq pattern,
T calls in one record()): plain hybridized vs `mxmirror.enabled(sqrt)`.

Each planned call waits for its backward with its own executor, so a planned loop binds
T executors (bound once, reused every batch); the hook plans a loop only where a call's
planned executor, its copies and their gradients and its Parameters' gradient buffers
hold less than plain Gluon keeps for a call, else the block trains itself (no executor;
a call it does not plan should cost plain Gluon's time). Per configuration and mode a child
process trains 3 batches (SGD; 10 for the small configurations, whose steps take a
fraction of a second, so that the best of them stands out of a shared machine's noise)
and prints: executors bound, peak RSS, the first step's wall time (planning and binding
included) and the later steps' wall and CPU time. The small configurations run 3 child
processes per mode, alternating (one process's speed differs from the next by more than
the hook's cost: 0.24 to 0.37 s CPU for the same plain step, measured), and the table
shows the largest peak RSS and the best later step of them.

    python scripts/gluon_step_loop.py [--out docs/gluon.md]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import time

from _bootstrap import ROOT
from provenance import generated_by, write_section

CONFIGS = [  # hidden, batch, Dense layers after the cell, BatchNorm, steps T, batches,
    # child processes per mode (alternating)
    (256, 32, 4, False, 50, 10, 3), (256, 32, 4, False, 200, 10, 3),
    (1024, 256, 8, True, 50, 3, 1)]


def child(hidden: int, batch: int, depth: int, bn: bool, steps: int, batches: int,
          mode: str) -> None:
    import mxnet as mx
    from mxnet import autograd, gluon
    from mxnet.gluon import nn, rnn

    import mxmirror

    class Step(gluon.HybridBlock):
        def __init__(self, **kw):
            super().__init__(**kw)
            with self.name_scope():
                self.cell = rnn.LSTMCell(hidden, input_size=hidden)
                self.body = nn.HybridSequential()
                for _ in range(depth):
                    self.body.add(nn.Dense(hidden, in_units=hidden))
                    if bn:
                        self.body.add(nn.BatchNorm(in_channels=hidden))
                    self.body.add(nn.Activation("tanh"))
                self.out = nn.Dense(50, in_units=hidden)

        def hybrid_forward(self, F, x, state):
            out, state = self.cell(x, state)
            return self.out(self.body(out)), state

    mx.random.seed(0)
    block = Step()
    block.initialize(mx.init.Xavier())
    block.hybridize()
    trainer = gluon.Trainer(block.collect_params(), "sgd", {"learning_rate": 0.01})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x = mx.nd.random.uniform(shape=(steps, batch, hidden))
    y = mx.nd.array(mx.nd.random.randint(0, 50, (steps, batch)))
    wall, cpu = [], []
    with mxmirror.enabled(mode) if mode != "plain" else contextlib.nullcontext():
        for _ in range(batches):
            t, c = time.perf_counter(), time.process_time()
            with autograd.record():
                state = block.cell.begin_state(batch_size=batch)
                loss = 0
                for k in range(steps):
                    out, state = block(x[k], state)
                    loss = loss + loss_fn(out, y[k])
            loss.backward()
            trainer.step(batch)
            mx.nd.waitall()
            wall.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
    from mxmirror.gluon import hook

    planned = hook.planned_for(block)
    print(json.dumps({"executors": len(planned.executors) if planned else 0,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "wall": wall, "cpu": cpu}))


def run_child(config: tuple, mode: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("MXMIRROR_POLICY", None)
    proc = subprocess.run([sys.executable, __file__, "--child", *map(str, config), mode],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"child {config} {mode} failed:\n{proc.stderr[-2000:]}")
    lines = proc.stdout.strip().splitlines()
    found = json.loads(lines[-1])
    found["said"] = [line for line in proc.stderr.splitlines() if line.startswith("mxmirror:")]
    return found


def _merged(runs: list[dict]) -> dict:
    """One mode's child processes: the first's executors, first step and lines, the
    largest peak RSS, the best later step of all."""
    first = runs[0]
    return dict(first, peak_rss_mb=max(r["peak_rss_mb"] for r in runs), first=first["wall"][0],
                w=min(w for r in runs for w in r["wall"][1:]),
                c=min(c for r in runs for c in r["cpu"][1:]))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="sqrt")
    ap.add_argument("--out", help="page whose marked section is rewritten")
    ap.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        h, b, d, bn, t, n, mode = args.child
        child(int(h), int(b), int(d), bn == "True", int(t), int(n), mode)
        return
    load = os.getloadavg()[0]
    lines = [generated_by("scripts/gluon_step_loop.py", sys.argv[1:] if argv is None else argv)
             + f" MKL-DNN {'off' if os.environ.get('MXNET_MKLDNN_ENABLED') == '0' else 'on'};"
             f" load average {load:.1f} at the start (2 cores, shared).", "",
             "| step block (LSTM cell + Dense layers), batch, steps T | mode | executors "
             "bound | peak RSS MB (x plain) | first step wall s | later steps (best) wall s "
             "/ CPU s (x plain) |", "|---|---|---|---|---|---|"]
    said = []
    for config in CONFIGS:
        hidden, batch, depth, bn, steps, _, repeats = config
        name = f"hidden {hidden}, {depth} Dense{'+BN' if bn else ''}, batch {batch}, T={steps}"
        runs: dict[str, list] = {"plain": [], args.policy: []}
        for _ in range(repeats):  # a process's speed varies by more than the hook's cost
            for mode in runs:
                runs[mode].append(run_child(config[:6], mode))
        found = {m: _merged(r) for m, r in runs.items()}
        plain = found["plain"]
        for mode, f in found.items():
            lines.append(f"| {name} | {mode} | {f['executors']} | {f['peak_rss_mb']:.0f} "
                         f"({f['peak_rss_mb'] / plain['peak_rss_mb']:.2f}x) | {f['first']:.1f} "
                         f"| {f['w']:.2f} / {f['c']:.2f} ({f['w'] / plain['w']:.2f}x / "
                         f"{f['c'] / plain['c']:.2f}x) |")
            print(lines[-1], flush=True)
        said += [f"- {name}: `{line}`" for line in found[args.policy]["said"]]
    lines += ["", "mxmirror's lines:", "", *said]
    write_section(args.out, "gluon_step_loop", lines)


if __name__ == "__main__":
    main()
