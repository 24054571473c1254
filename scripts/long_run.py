"""Long run (not CI): N training steps planned vs unplanned from the same seed.

Trains the same network twice with Module + SGD (momentum): once plain, once inside
``mxmirror.enabled(policy)``. Both start from the same parameters, see the same batches and
the same MXNet random seed (Dropout masks), so the parameters and losses after N steps
must be identical (exit code 1 otherwise). BatchNorm running statistics (auxiliary states,
not trained parameters) are compared and reported too.

    python scripts/long_run.py --steps 200 --policy sqrt --policy search --policy cheap \
        [--out docs/figures/long_run.md]

With --out the table is also written there, after the command and commit that made it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import _bootstrap  # noqa: F401 (this checkout importable)
import mxnet as mx
import numpy as np
from provenance import generated_by

import mxmirror


def network(blocks: int = 6, hidden: int = 256, classes: int = 10) -> mx.sym.Symbol:
    """Residual MLP: FC-BN-ReLU blocks with skip connections, Dropout, one softmax head."""
    x = mx.sym.Activation(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=hidden,
                                                name="stem"), act_type="relu", name="stem_relu")
    for i in range(blocks):
        y = mx.sym.FullyConnected(x, num_hidden=hidden, name=f"b{i}_fc1")
        y = mx.sym.Activation(mx.sym.BatchNorm(y, fix_gamma=False, name=f"b{i}_bn1"),
                              act_type="relu", name=f"b{i}_relu1")
        y = mx.sym.FullyConnected(y, num_hidden=hidden, name=f"b{i}_fc2")
        y = mx.sym.BatchNorm(y, fix_gamma=False, name=f"b{i}_bn2")
        x = mx.sym.Activation(x + y, act_type="relu", name=f"b{i}_out")
        if i % 2 == 1:
            x = mx.sym.Dropout(x, p=0.1, name=f"b{i}_drop")
    x = mx.sym.FullyConnected(x, num_hidden=classes, name="head")
    return mx.sym.SoftmaxOutput(x, name="softmax")


def train(policy: str | None, steps: int, batch: int, features: int, seed: int):
    sym = network()
    rng = np.random.RandomState(seed)
    centers = rng.normal(0, 1, (10, features)).astype("float32")
    shapes = {"data": (batch, features), "softmax_label": (batch,)}
    arg_shapes, _, aux_shapes = sym.infer_shape(**shapes)
    init_rng = np.random.RandomState(seed + 1)
    args = {n: mx.nd.array(init_rng.uniform(-0.07, 0.07, s))
            for n, s in zip(sym.list_arguments(), arg_shapes) if n not in shapes}
    mod = mx.mod.Module(sym, context=mx.cpu())
    if policy:
        with mxmirror.enabled(policy):
            mod.bind(data_shapes=[("data", shapes["data"])],
                     label_shapes=[("softmax_label", shapes["softmax_label"])])
    else:
        mod.bind(data_shapes=[("data", shapes["data"])],
                 label_shapes=[("softmax_label", shapes["softmax_label"])])
    bound = mod._exec_group.execs[0]._symbol.attr_dict()
    mirrored = sum(1 for a in bound.values() if a.get("__force_mirroring__") == "True")
    mod.init_params(arg_params=args, aux_params=None, allow_missing=True,
                    initializer=mx.init.Zero())
    mod.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 0.05,
                                                          "momentum": 0.9, "wd": 1e-4})
    data_rng = np.random.RandomState(seed + 2)
    mx.random.seed(seed)
    losses = []
    t0 = time.perf_counter()
    for _ in range(steps):
        label = data_rng.randint(0, 10, batch)
        data = centers[label] + data_rng.normal(0, 2.0, (batch, features)).astype("float32")
        mod.forward_backward(mx.io.DataBatch([mx.nd.array(data)],
                                             [mx.nd.array(label.astype("float32"))]))
        mod.update()
        prob = mod.get_outputs()[0].asnumpy()
        losses.append(float(-np.log(prob[np.arange(batch), label] + 1e-12).mean()))
    seconds = time.perf_counter() - t0
    # MXNet 1.9.1 updates BatchNorm's running statistics inside its backward op but does not
    # register them as written (FMutateInputs inputs are only read dependencies), so a copy
    # pushed right after training may read them before the last backward ran: wait first.
    mx.nd.waitall()
    arg, aux = mod.get_params()
    return ({k: v.asnumpy() for k, v in arg.items()}, {k: v.asnumpy() for k, v in aux.items()},
            losses, mirrored, seconds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=1024)  # cheap's plan pays beside its nodes
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policy", action="append", help="repeatable; default sqrt")
    ap.add_argument("--out", help="also write the table, with command and commit, here")
    given = sys.argv[1:] if argv is None else argv
    a = ap.parse_args(given)
    policies = a.policy or ["sqrt"]
    base, base_aux, base_losses, _, base_s = train(None, a.steps, a.batch, a.features, a.seed)
    lines = [f"Residual MLP (stem + 6 FC-BN-ReLU-FC-BN blocks, Dropout 0.1), batch {a.batch}, "
             f"{a.features} features, SGD with momentum, {a.steps} steps, seed {a.seed}, "
             f"MXNet {mx.__version__}. Unplanned: loss {base_losses[0]:.4f} -> "
             f"{base_losses[-1]:.4f}, {base_s:.1f} s.", "",
             "| policy | mirrored nodes | seconds | parameters bit-identical | max abs diff "
             "| per-step losses identical | BatchNorm running statistics identical |",
             "|---|---|---|---|---|---|---|"]
    print(lines[0], flush=True)
    ok = True
    for policy in policies:
        got, aux, losses, mirrored, secs = train(policy, a.steps, a.batch, a.features, a.seed)
        same = all(np.array_equal(got[k], base[k]) for k in base)
        diff = max(float(np.abs(got[k] - base[k]).max()) for k in base)
        aux_bad = [k for k in base_aux if not np.array_equal(aux[k], base_aux[k])]
        ok &= same and losses == base_losses and mirrored > 0
        lines.append(f"| {policy} | {mirrored} | {secs:.1f} | {'yes' if same else 'no'} "
                     f"({len(base)}) | {diff:.3g} | {'yes' if losses == base_losses else 'no'} "
                     f"| " + ("yes" if not aux_bad else f"no ({', '.join(aux_bad)})") + " |")
        print(lines[-1], flush=True)
    lines += ["", f"Exit code {0 if ok else 1} (1 when any parameter or loss differs or a "
              "policy mirrors nothing)."]
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text("\n".join([generated_by("scripts/long_run.py", given) +
                                           " Seconds are wall time on a shared machine.",
                                           "", *lines]) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
