"""A network with Dropout, 200 Trainer steps: plain hybridized vs PlannedBlock, 5 seeds.

MXNet's executor and the CachedOp draw the same Dropout masks from one seed (measured,
tests/test_gluon.py), and a recomputation never draws a new one, so every loss of the 200
steps is the same, bit for bit (a recomputation that drew a fresh mask would train a
different, noisier network). The default policy, cheap, recomputes the BatchNorm and ReLU
right before each Dropout; the table says whether the plan was used. Prints the final
loss (mean of the last 20 steps) per seed and mode.

    python scripts/gluon_dropout.py [--steps 200] [--seeds 5] [--policy cheap]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import _bootstrap  # noqa: F401 - this checkout's mxmirror first
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from provenance import generated_by, write_section

from mxmirror.gluon import PlannedBlock


def network() -> gluon.HybridBlock:
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(16, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            gluon.nn.Dropout(0.3), gluon.nn.Conv2D(16, 3, padding=1, strides=2),
            gluon.nn.BatchNorm(), gluon.nn.Activation("relu"), gluon.nn.Dropout(0.3),
            gluon.nn.Dense(64, activation="relu"), gluon.nn.Dropout(0.5), gluon.nn.Dense(10))
    return net


def data(n: int = 512):
    """A learnable synthetic task: the class is which quadrant-channel is brightest."""
    rs = np.random.RandomState(0)
    x = rs.rand(n, 3, 16, 16).astype("float32")
    y = rs.randint(0, 10, n)
    for i, c in enumerate(y):
        x[i, c % 3, (c // 3) * 4:(c // 3) * 4 + 4, :] += 1.0
    return mx.nd.array(x), mx.nd.array(y)


def final_loss(policy: str | None, seed: int, steps: int, batch: int = 32) -> tuple:
    """The final loss (mean of the last 20 steps), every step's losses, the plan used."""
    mx.random.seed(seed)
    net = network()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    run = net if policy is None else PlannedBlock(net, policy=policy)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05,
                                                          "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = data()
    losses = []
    for step in range(steps):
        i = (step * batch) % x.shape[0]
        with autograd.record():
            loss = loss_fn(run(x[i:i + batch]), y[i:i + batch])
        loss.backward()
        trainer.step(batch)
        losses.append(loss.asnumpy())
    used = policy is None or all(u for _, u in run.decisions)
    return float(np.mean([v.mean() for v in losses[-20:]])), losses, used


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--policy", default="cheap")
    ap.add_argument("--out", help="page whose marked dropout section is rewritten")
    args = ap.parse_args()
    plain = [final_loss(None, s, args.steps) for s in range(args.seeds)]
    planned = [final_loss(args.policy, s, args.steps) for s in range(args.seeds)]
    lines = [generated_by("scripts/gluon_dropout.py", sys.argv[1:]) + f" Final loss (mean of "
             f"the last 20 of {args.steps} steps) per seed.", "",
             f"| seed | plain hybridized | PlannedBlock({args.policy}), plan used | every "
             f"step's losses bit-identical |", "|---|---|---|---|"]
    lines += [f"| {s} | {a[0]:.4f} | {b[0]:.4f}, {'yes' if b[2] else 'no'} | "
              f"{'yes' if all(np.array_equal(u, v) for u, v in zip(a[1], b[1])) else 'NO'} |"
              for s, (a, b) in enumerate(zip(plain, planned))]
    plain, planned = [a[0] for a in plain], [b[0] for b in planned]
    spread = max(plain) - min(plain)
    gap = abs(statistics.mean(planned) - statistics.mean(plain))
    lines += ["", f"plain: mean {statistics.mean(plain):.4f}, spread over seeds {spread:.4f}; "
              f"planned: mean {statistics.mean(planned):.4f}, spread "
              f"{max(planned) - min(planned):.4f}; difference of the means {gap:.4f} "
              f"({'within' if gap <= spread else 'OUTSIDE'} the plain spread)."]
    write_section(args.out, "gluon_dropout", lines)


if __name__ == "__main__":
    main()
