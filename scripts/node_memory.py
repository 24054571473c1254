"""What a bound executor holds per node of its graph, outside MXNet's figure, against plain
Gluon's CachedOp: the constants mxmirror counts for it (adapter/executor_memory.NODE_BYTES,
by op: HEAVY_OPS or not; CONV_WEIGHT_SHARE).

Chains of one layer kind repeated (elementwise `tanh(x * w)`, Dense + relu, Conv + BatchNorm
+ relu) on tiny arrays, so that what grows with the chain's length is the graph, not its
values. Each child process trains 3 steps of a chain of `--short` and of `--long` layers,
plain hybridized, through PlannedBlock with policy none (MXNet's executor, unplanned) and
through PlannedBlock(sqrt) with its plan bound whatever it saves (mirror copies), and
prints its growth over the steps; the difference between the two lengths, per layer and per
forward op node or mirrored node, is what one node costs. Then the same on a block that
unrolls an LSTM cell in hybrid_forward (the pattern where a plan saving little bound
more than plain Gluon held): the measured growth beside what the constant predicts.
Last, the other way round: chains of 4 Convolutions (or Dense layers) with large weights on
tiny inputs, plain hybridized against PlannedBlock with policy none, the growth after each of
4 steps as a share of the weights' bytes (with MKL-DNN on the CachedOp holds more).

    python scripts/node_memory.py [--short 300] [--long 1200] [--out docs/gluon.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from _bootstrap import ROOT
from provenance import generated_by, write_section

FAMILIES = {  # layer kind: its forward op nodes, as the table names it
    "ew": "tanh(x * w)",
    "fc": "Dense(4) + relu",
    "conv": "Conv2D(4, 3x3) + BatchNorm + relu",
}
MODES = ["plain", "executor", "mirrored"]


def chain(family: str, n: int):
    from mxnet import gluon

    class Chain(gluon.HybridBlock):
        def __init__(self, **kw):
            super().__init__(**kw)
            with self.name_scope():
                self.layers = gluon.nn.HybridSequential()
                for _ in range(n):
                    if family == "fc":
                        self.layers.add(gluon.nn.Dense(4, activation="relu", in_units=4))
                    elif family == "conv":
                        self.layers.add(gluon.nn.Conv2D(4, 3, padding=1, in_channels=4),
                                        gluon.nn.BatchNorm(in_channels=4),
                                        gluon.nn.Activation("relu"))
                if family == "ew":
                    self.w = self.params.get("w", shape=(4,))

        def hybrid_forward(self, F, x, w=None):
            if family != "ew":
                return self.layers(x)
            for _ in range(n):
                x = F.tanh(x * w)
            return x

    return Chain(), {"ew": (4,), "fc": (2, 4), "conv": (1, 4, 4, 4)}[family]


def unrolled_lstm(steps: int):
    from mxnet import gluon

    class Unrolled(gluon.HybridBlock):
        """An LSTM cell unrolled over `steps` in hybrid_forward, Dense on every output."""

        def __init__(self, **kw):
            super().__init__(**kw)
            with self.name_scope():
                self.cell = gluon.rnn.LSTMCell(64, input_size=32)
                self.out = gluon.nn.Dense(32, flatten=False, in_units=64)

        def hybrid_forward(self, F, x):
            out, _ = self.cell.unroll(steps, x, layout="NTC", merge_outputs=True)
            return self.out(out)

    return Unrolled(), (8, steps, 32)


WEIGHTS = {  # 4 layers of each: (label, layer, input shape)
    "conv3": ("Conv2D(512, 3x3)", lambda nn: nn.Conv2D(512, 3, padding=1, in_channels=512),
              (1, 512, 4, 4)),
    "conv1": ("Conv2D(1024, 1x1)", lambda nn: nn.Conv2D(1024, 1, in_channels=1024),
              (1, 1024, 4, 4)),
    "cbr": ("Conv2D(512, 3x3) + BatchNorm + relu", lambda nn: [
        nn.Conv2D(512, 3, padding=1, in_channels=512, use_bias=False),
        nn.BatchNorm(in_channels=512), nn.Activation("relu")], (2, 512, 4, 4)),
    "depthwise": ("Conv2D(2048, 3x3, groups=2048)", lambda nn: nn.Conv2D(
        2048, 3, padding=1, groups=2048, in_channels=2048), (1, 2048, 4, 4)),
    "dense": ("Dense(1536)", lambda nn: nn.Dense(1536, in_units=1536), (2, 1536)),
}


def weights_chain(kind: str):
    from mxnet import gluon

    net = gluon.nn.HybridSequential()
    for _ in range(4):
        layer = WEIGHTS[kind][1](gluon.nn)
        net.add(*(layer if isinstance(layer, list) else [layer]))
    return net, WEIGHTS[kind][2]


def child(case: str, mode: str) -> None:
    """Train 3 steps (4 for 'weights KIND') of `case` ('FAMILY N', 'lstm T' or 'weights
    KIND') in `mode`; print the growth as JSON."""
    import mxnet as mx
    from mxnet import autograd, gluon

    kind, n = case.split()
    net, shape = unrolled_lstm(int(n)) if kind == "lstm" else weights_chain(n) \
        if kind == "weights" else chain(kind, int(n))
    net.initialize()
    net.hybridize()
    x = mx.nd.ones(shape)
    run, blocks = net, None
    if mode != "plain":
        import mxmirror.gluon.block as block_module
        from mxmirror.gluon import PlannedBlock

        if mode == "mirrored":  # bound whatever it saves: what its nodes cost is measured
            decide = block_module.choose_plan
            block_module.choose_plan = lambda *a, **k: (decide(*a, **k)[0], True, True, False)
        run = blocks = PlannedBlock(net, "none" if mode == "executor" else "sqrt")
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    mx.nd.waitall()
    before = _rss()
    growth = []
    for _ in range(4 if kind == "weights" else 3):
        with autograd.record():
            y = run(x)
        y.backward()
        trainer.step(1)
        mx.nd.waitall()
        growth.append(_rss() - before)
    found = {"growth_mb": growth[-1], "growth_by_step_mb": growth,
             "weights_mb": sum(p.data().size * 4 for name, p in net.collect_params().items()
                               if name.endswith("weight")) / 2**20}
    if blocks is not None:
        from mxmirror.adapter.executor_memory import beyond_cached_op

        plans = [ex.plan for ex in blocks.executors]
        found["executors"] = len(plans)
        if plans and plans[0] is not None:
            found["mirrored"] = len(plans[0].recomputed_ids)
            found["predicted_mb"] = beyond_cached_op(plans[0]).structures / 2**20
    if mode == "plain":
        found["op_nodes"] = sum(1 for node in json.loads(
            net(mx.sym.var("data")).tojson())["nodes"] if node["op"] != "null")
    print(json.dumps(found))


def _rss() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_child(case: str, mode: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("MXMIRROR_POLICY", None)
    proc = subprocess.run([sys.executable, __file__, "--child", case, mode],
                          capture_output=True, text=True, env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", type=int, default=300)
    ap.add_argument("--long", type=int, default=1200)
    ap.add_argument("--steps", default="35,200", help="LSTM steps of the unrolled rows")
    ap.add_argument("--out", help="page whose node_memory section is rewritten")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(*args.child)
        return
    from mxmirror.adapter.executor_memory import HEAVY_OPS, NODE_BYTES

    argv = sys.argv[1:] if argv is None else argv
    mkldnn = "off" if os.environ.get("MXNET_MKLDNN_ENABLED") == "0" else "on"
    lines = [generated_by("scripts/node_memory.py", argv) + f" MKL-DNN {mkldnn}; load "
             f"average {os.getloadavg()[0]:.1f} at the start (2 cores, shared).", "",
             f"Growth of the process over 3 training steps, chains of {args.short} and "
             f"{args.long} layers on tiny arrays, per layer added (KB), and per forward op "
             f"node (the executor, unplanned, beyond the CachedOp) or per mirrored node (the "
             f"mirror plan beyond the unplanned executor):", "",
             "| layer | forward op nodes per layer | CachedOp KB per layer | executor KB per "
             "layer | mirror plan KB per layer | mirrored nodes per layer | executor beyond "
             "CachedOp, KB per forward op node | mirror plan beyond executor, KB per mirrored "
             "node |", "|---" * 8 + "|"]
    light, heavy = 0.0, 0.0  # the most per node of an op outside HEAVY_OPS, and of one in it
    per_node = {}
    for family, label in FAMILIES.items():
        found = {m: {n: run_child(f"{family} {n}", m) for n in (args.short, args.long)}
                 for m in MODES}
        layers = args.long - args.short
        per_layer = {m: (found[m][args.long]["growth_mb"] - found[m][args.short]["growth_mb"])
                     * 1024 / layers for m in MODES}
        ops = (found["plain"][args.long]["op_nodes"] - found["plain"][args.short]["op_nodes"]) \
            / layers
        mirrored = (found["mirrored"][args.long]["mirrored"]
                    - found["mirrored"][args.short]["mirrored"]) / layers
        per_op = (per_layer["executor"] - per_layer["plain"]) / ops
        per_mirror = (per_layer["mirrored"] - per_layer["executor"]) / mirrored
        per_node[family] = (per_op, per_mirror)
        if family != "conv":
            light = max(light, per_op, per_mirror)
        else:  # Convolution and BatchNorm, their relu counted as the Dense layer's
            fc_op, fc_mirror = per_node["fc"]
            heavy = max((per_op * ops - fc_op) / (ops - 1),
                        (per_mirror * mirrored - fc_mirror) / (mirrored - 1))
        lines.append(f"| {label} | {ops:.0f} | {per_layer['plain']:.1f} | "
                     f"{per_layer['executor']:.1f} | {per_layer['mirrored']:.1f} | "
                     f"{mirrored:.2f} | {per_op:.1f} | {per_mirror:.1f} |")
        print(lines[-1], flush=True)
    lines += ["", f"The most per node: {light:.1f} KB for the ops of the elementwise and "
              f"Dense rows, {heavy:.1f} KB for a Convolution or BatchNorm (the third row, its "
              f"relu counted as the Dense row's). mxmirror counts "
              f"{NODE_BYTES['light'] / 1024:.0f} KB for every forward op node and every "
              f"mirrored node, {NODE_BYTES['heavy'] / 1024:.0f} KB where its op is one of "
              f"{', '.join(sorted(HEAVY_OPS))}, of a planned executor beyond plain Gluon's "
              f"CachedOp, and for every mirrored node beyond an unplanned executor (the bind "
              f"hook).", "",
              "An LSTM cell (64 hidden, batch 8) unrolled in hybrid_forward, with a Dense on "
              "its outputs, 3 steps: the growth beyond plain Gluon's of the sqrt plan bound "
              "whatever it saves, beside the node count times the constant:", "",
              "| steps T | plain MB | mirror plan MB | beyond plain MB | predicted MB "
              "(nodes x constant) |", "|---|---|---|---|---|"]
    for steps in args.steps.split(","):
        plain, planned = (run_child(f"lstm {steps}", m) for m in ("plain", "mirrored"))
        lines.append(f"| {steps} | {plain['growth_mb']:.1f} | {planned['growth_mb']:.1f} | "
                     f"{planned['growth_mb'] - plain['growth_mb']:.1f} | "
                     f"{planned.get('predicted_mb', 0):.1f} |")
        print(lines[-1], flush=True)
    lines += ["", "4 layers with large weights on tiny inputs, 4 Trainer steps: the growth after "
              "each step (MB), and what the CachedOp holds beyond the executor as a share of "
              "the weights' bytes (the least over the steps first):", "",
              "| layers | weights MB | CachedOp MB by step | executor MB by step | CachedOp "
              "beyond executor, share of the weights, least / last step |", "|---" * 5 + "|"]
    least = None
    for kind, (label, _, _) in WEIGHTS.items():
        plain, executor = (run_child(f"weights {kind}", m) for m in ("plain", "executor"))
        shares = [(p - e) / plain["weights_mb"] for p, e in
                  zip(plain["growth_by_step_mb"], executor["growth_by_step_mb"])]
        if kind != "dense" and "depthwise" not in kind:  # the weights that count
            least = min(shares) if least is None else min(least, min(shares))
        lines.append(f"| 4 x {label} | {plain['weights_mb']:.1f} | "
                     + " / ".join(f"{g:.1f}" for g in plain["growth_by_step_mb"]) + " | "
                     + " / ".join(f"{g:.1f}" for g in executor["growth_by_step_mb"])
                     + f" | {min(shares):.2f} / {shares[-1]:.2f} |")
        print(lines[-1], flush=True)
    from mxmirror.adapter.executor_memory import CONV_WEIGHT_SHARE

    lines += ["", f"The least share for dense Convolutions: {least:.2f}; mxmirror credits "
              f"{CONV_WEIGHT_SHARE:.2f} of every Convolution's weight to an executor that "
              f"stands in for the CachedOp (MKL-DNN on only; the depthwise weights are too "
              f"small to tell, the Dense ones show none)."]
    write_section(args.out, "node_memory", lines)


if __name__ == "__main__":
    main()
