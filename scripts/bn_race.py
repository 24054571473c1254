"""BatchNorm running statistics after Module.fit: plain MXNet vs mxmirror, without and with
the engine ordering of mxmirror.runtime.aux_order (not CI; prints Markdown tables).

MXNet 1.9.1's BatchNorm backward updates moving_mean/moving_var without the engine
knowing it writes them, so Module.fit's epoch-end get_params/set_params can read them
stale and write the stale copy back (docs/long_run.md). For each policy this script runs
`fit` `--repeats` times with the ordering switched off and on and compares every
parameter and auxiliary state with the true values: a plain run (no mxmirror) that waits
for the engine after every batch. Then it times one training step with and without the
ordering in the same process (interleaved), and, for the segmented kind, with the global
waitall the segmented executor used before.

    MXNET_EXEC_BULK_EXEC_TRAIN=0 python scripts/bn_race.py [--out docs/figures/bn_race.md]

MXNET_EXEC_BULK_EXEC_TRAIN=0 (read at bind) gives every backward op its own engine op;
with MXNet's default bulking the window is narrower, but the race is the same.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import _bootstrap  # noqa: F401 (this checkout importable)
import mxnet as mx
import numpy as np
from provenance import generated_by

import mxmirror
from mxmirror.runtime import aux_order
from mxmirror.runtime.segmented import runner


def network(layers: int, filters: int, classes: int = 10) -> mx.sym.Symbol:
    """conv-BN-ReLU blocks, a classifier: BatchNorm's backward at every depth."""
    x = mx.sym.var("data")
    for i in range(layers):
        x = mx.sym.Convolution(x, num_filter=filters, kernel=(3, 3), pad=(1, 1), name=f"conv{i}")
        x = mx.sym.BatchNorm(x, fix_gamma=False, name=f"bn{i}")
        x = mx.sym.Activation(x, act_type="relu", name=f"relu{i}")
    x = mx.sym.FullyConnected(mx.sym.flatten(x), num_hidden=classes, name="fc")
    return mx.sym.SoftmaxOutput(x, name="softmax")


@contextmanager
def ordering(mode: str):
    """mode 'on' (mxmirror's), 'off' (no ordering), 'waitall' (the old global wait)."""
    real = aux_order.settle
    fake = {"on": real, "off": lambda arrays: None,
            "waitall": lambda arrays: mx.nd.waitall() if arrays else None}[mode]
    aux_order.settle = runner.settle = fake
    try:
        yield
    finally:
        aux_order.settle = runner.settle = real


def _iters(a) -> tuple[mx.io.NDArrayIter, mx.io.NDArrayIter]:
    rng = np.random.RandomState(0)
    n = a.batch * a.batches
    x = rng.uniform(-1, 1, (n, 3, a.size, a.size)).astype(np.float32)
    y = rng.randint(0, 10, n).astype(np.float32)
    return (mx.io.NDArrayIter(x, y, a.batch, label_name="softmax_label"),
            mx.io.NDArrayIter(x[:a.batch], y[:a.batch], a.batch, label_name="softmax_label"))


def _contexts(n: int) -> list:
    return [mx.cpu(i) for i in range(n)]


def fit(a, policy: str | None, wait: bool) -> tuple[dict, dict]:
    """One Module.fit (eval data, accuracy); the parameters and aux states after it."""
    train, val = _iters(a)
    mod = mx.mod.Module(network(a.layers, a.filters), context=_contexts(a.contexts))
    kw = dict(eval_data=val, eval_metric="acc", num_epoch=1, initializer=mx.init.Xavier(),
              optimizer_params={"learning_rate": 0.1},
              batch_end_callback=(lambda _: mx.nd.waitall()) if wait else None)
    mx.random.seed(1)
    with mxmirror.enabled(policy) if policy is not None else contextlib.nullcontext():
        mod.fit(train, **kw)
    mx.nd.waitall()
    args, aux = mod.get_params()
    return ({k: v.asnumpy() for k, v in args.items()}, {k: v.asnumpy() for k, v in aux.items()})


def _diff(a: dict, b: dict) -> float:
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def _first_line(exc: Exception) -> str:
    lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
    return lines[-1] if lines else type(exc).__name__


def race_table(a) -> list[str]:
    true_args, true_aux = fit(a, None, wait=True)
    rows = ["| run | ordering | repeats differing (aux) | max abs diff aux | max abs diff "
            "params |", "|---|---|---|---|---|"]
    for policy in [None, *a.policy]:
        for mode in ("off", "on"):
            if policy is None and mode == "on":
                continue  # plain MXNet has no ordering
            bad, worst, worst_p = 0, 0.0, 0.0
            name = "plain MXNet" if policy is None else f"mxmirror `{policy}`"
            try:
                with ordering(mode):
                    for _ in range(a.repeats):
                        args, aux = fit(a, policy, wait=False)
                        d = _diff(aux, true_aux)
                        bad += d > 0
                        worst, worst_p = max(worst, d), max(worst_p, _diff(args, true_args))
            except mx.base.MXNetError as exc:
                rows.append(f"| {name} | {mode} | fit fails: {_first_line(exc)} | | |")
                continue
            rows.append(f"| {name} | {mode if policy else '-'} | {bad} of {a.repeats} | "
                        f"{worst:.3g} | {worst_p:.3g} |")
    return rows


def step_table(a) -> list[str]:
    """Median seconds of one step (forward_backward, update, waitall), variants interleaved."""
    train, _ = _iters(a)
    batch = next(iter(train))
    rows = ["| policy | ordering | median step (ms) | vs off | ordering ops per step x one op |",
            "|---|---|---|---|---|"]
    for policy in a.policy:
        mod = mx.mod.Module(network(a.layers, a.filters), context=_contexts(a.contexts))
        with mxmirror.enabled(policy):
            mod.bind(data_shapes=train.provide_data, label_shapes=train.provide_label)
        mod.init_params(mx.init.Xavier())
        mod.init_optimizer(optimizer_params={"learning_rate": 0.1})
        modes = ["off", "on"] + (["waitall"] if policy in ("recursive", "multilevel") else [])
        times: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(a.steps + 1):
            for m in modes:
                with ordering(m):
                    mx.nd.waitall()
                    t = time.perf_counter()
                    mod.forward_backward(batch)
                    mod.update()
                    mx.nd.waitall()
                    if r:  # the first round warms up
                        times[m].append(time.perf_counter() - t)
        off = float(np.median(times["off"]))
        calls, call_s = _op_cost(mod, batch)
        for m in modes:
            med = float(np.median(times[m]))
            op = (f"{calls} x {1e6 * call_s:.0f} us = {100 * calls * call_s / off:.2f}% of "
                  f"the step" if m == "on" else "")
            rows.append(f"| {policy} | {m} | {1e3 * med:.2f} | {med / off:.3f}x | {op} |")
    return rows


def _op_cost(mod, batch) -> tuple[int, float]:
    """The ordering ops one step pushes, and the median seconds of one (push to done)."""
    pushed: list[list] = []
    real = aux_order.settle

    def counting(arrays: list) -> None:
        pushed.append(list(arrays))
        real(arrays)

    aux_order.settle = runner.settle = counting
    try:
        mod.forward_backward(batch)
        mod.update()
    finally:
        aux_order.settle = runner.settle = real
    mx.nd.waitall()
    arrays = max(pushed, key=len)
    samples = []
    for _ in range(200):
        t = time.perf_counter()
        real(arrays)
        mx.nd.waitall()
        samples.append(time.perf_counter() - t)
    return len(pushed), float(np.median(samples))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", action="append",
                    help="repeatable; default none, sqrt, search, recursive")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--steps", type=int, default=40, help="timed steps per variant")
    ap.add_argument("--contexts", type=int, default=2)
    ap.add_argument("--batches", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--filters", type=int, default=16)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--out", help="also write the tables, with command and commit, here")
    given = sys.argv[1:] if argv is None else argv
    a = ap.parse_args(given)
    a.policy = a.policy or ["none", "sqrt", "search", "recursive"]
    logging.getLogger("mxmirror").setLevel(logging.WARNING)
    env = {k: os.environ.get(k, "default") for k in ("MXNET_EXEC_BULK_EXEC_TRAIN",
                                                     "MXNET_MKLDNN_ENABLED")}
    lines = [f"MXNet {mx.__version__}, " + ", ".join(f"{k}={v}" for k, v in env.items())
             + f"; {a.layers} conv-BN-ReLU layers, {a.filters} filters, {a.size}x{a.size}, "
             f"batch {a.batch} over {a.contexts} contexts, {a.batches} batch(es) per fit.", "",
             "BatchNorm statistics and parameters after `Module.fit`, vs the true values "
             "(plain MXNet, waitall after every batch):", ""]
    print("\n".join(lines), flush=True)
    lines += race_table(a)
    lines += ["", "One training step (forward_backward, update, waitall), the ordering off/on "
              f"interleaved in one process, median of {a.steps}:", ""]
    lines += step_table(a)
    print("\n".join(lines[4:]))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        made = generated_by("scripts/bn_race.py", given,
                            {k: v for k, v in env.items() if v != "default"})
        Path(a.out).write_text("\n".join([made +
                                           " Step times: a shared 2-core machine.", "",
                                           *lines]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
