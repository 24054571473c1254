"""What a Gluon training process holds, plain hybridized vs PlannedBlock: peak RSS over
real Trainer steps.

For every network and input size, child processes (one at a time, so that no two heavy
runs share the machine) each train 3 Trainer steps (SGD with momentum) of the same
initialized network: plain hybridized, PlannedBlock(sqrt) and PlannedBlock(search). Each
prints its peak RSS (ru_maxrss), whether the plan was used (a plan whose saving does not
cover PlannedBlock's own copies is not, and the block trains itself), MXNet's own
figure for the planned executor (``Total X MB allocated``) beside the prediction, and
PlannedBlock's own arrays (input and output copies, gradient buffers). The language
model is MXNet's word-level LM example in small form (symbols/gluon_lm.WordLM:
Embedding, ``rnn.LSTM(256, 2, dropout)``, Dense decoder, ``net(x, state)``), and its
variant with two stacked one-layer LSTMs, at T=35 and T=200.

    python scripts/gluon_table.py [--sizes small,large,lm] [--networks N,...] [--out docs/gluon.md]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from _bootstrap import ROOT
from provenance import generated_by, write_section

NETWORKS = ["resnet50_v1", "resnet101_v1", "resnet152_v1", "resnet50_v2", "resnet101_v2",
            "resnet152_v2", "densenet121", "densenet201", "mobilenetv2_1.0", "inceptionv3"]
MODES = ["plain", "sqrt", "search"]
SIZES = {"small": (8, 32, 10), "large": (16, 224, 1000)}  # batch, image side, classes
LM = {"vocab": 10000, "emb": 256, "hidden": 256, "batch": 32}


def image_model(name: str, size: int, classes: int):
    from mxnet.gluon.model_zoo import vision

    return vision.get_model(name, pretrained=False, classes=classes), \
        (299 if "inception" in name and size > 32 else size)


def language_model(stacked: bool):
    sys.path.insert(0, str(ROOT))
    from mxnet import gluon
    from mxnet.gluon import nn, rnn

    from symbols.gluon_lm import WordLM

    if not stacked:
        return WordLM(LM["vocab"], LM["emb"], LM["hidden"], 2, 0.2)

    class Stacked(gluon.HybridBlock):
        """Two one-layer LSTM blocks with Dropout between them: a plan may cut there."""

        def __init__(self, **kw):
            super().__init__(**kw)
            with self.name_scope():
                self.drop = nn.Dropout(0.2)
                self.encoder = nn.Embedding(LM["vocab"], LM["emb"])
                self.rnn1 = rnn.LSTM(LM["hidden"], 1, input_size=LM["emb"])
                self.rnn2 = rnn.LSTM(LM["hidden"], 1, input_size=LM["hidden"])
                self.decoder = nn.Dense(LM["vocab"], in_units=LM["hidden"])

        def hybrid_forward(self, F, inputs, hidden):
            h, c = hidden
            layer = [[F.slice_axis(s, axis=0, begin=i, end=i + 1) for s in (h, c)]
                     for i in range(2)]
            out, first = self.rnn1(self.drop(self.encoder(inputs)), layer[0])
            out, second = self.rnn2(self.drop(out), layer[1])
            out = self.drop(out).reshape((-1, LM["hidden"]))
            return self.decoder(out), [F.concat(first[0], second[0], dim=0),
                                       F.concat(first[1], second[1], dim=0)]

        def begin_state(self, *args, **kw):
            return [self.rnn1.begin_state(*args, **kw)[0].tile((2, 1, 1)),
                    self.rnn1.begin_state(*args, **kw)[1].tile((2, 1, 1))]

    return Stacked()


def child(case: str, mode: str, steps: int) -> None:
    """Train `steps` steps of `case` ('image NAME BATCH SIZE CLASSES' or 'lm T STACKED');
    print what it held as JSON."""
    import mxnet as mx
    from mxnet import autograd, gluon

    mx.random.seed(0)
    kind, *spec = case.split()
    if kind == "image":
        name, batch, size, classes = spec[0], *map(int, spec[1:])
        net, side = image_model(name, size, classes)
        x = mx.nd.random.uniform(shape=(batch, 3, side, side))
        y = mx.nd.array([i % classes for i in range(batch)])
        inputs = lambda: (x,)  # noqa: E731
    else:
        T, stacked = int(spec[0]), spec[1] == "stacked"
        net = language_model(stacked)
        batch = LM["batch"]
        x = mx.nd.array(mx.nd.random.randint(0, LM["vocab"], (T, batch)))
        y = mx.nd.array(mx.nd.random.randint(0, LM["vocab"], (T * batch,)))
        state = [s for s in net.begin_state(func=mx.nd.zeros, batch_size=batch)]
        inputs = lambda: (x, [s.detach() for s in state])  # noqa: E731
    net.initialize(mx.init.Xavier())
    net.hybridize()
    if mode == "plain":  # mxmirror not even imported: its own cost is in the other modes
        run = net
    else:
        from mxmirror.gluon import PlannedBlock

        run = PlannedBlock(net, policy=mode)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01,
                                                          "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        with autograd.record():
            out = run(*inputs())
            loss = loss_fn(out[0] if isinstance(out, (list, tuple)) else out, y)
        loss.backward()
        trainer.step(batch)
        mx.nd.waitall()
        times.append(time.perf_counter() - t)
    found = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
             "step_seconds": times}
    if mode != "plain":
        from mxmirror.adapter.children import allocated_mb

        executors = run.executors
        (plan, used), = run.decisions
        found.update(used=used, predicted_mb=plan.planned_mb, baseline_mb=plan.baseline_mb,
                     recompute=plan.recompute_ratio)
        if executors:
            found["mxnet_mb"] = sum(allocated_mb(executors[0].exec.debug_str()))
            found["own_mb"] = sum(ex.own_bytes for ex in executors) / 2**20
    print(json.dumps(found))


def run_child(case: str, mode: str, steps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("MXMIRROR_POLICY", None)
    proc = subprocess.run([sys.executable, __file__, "--child", case, mode, str(steps)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"failed": tail[:120]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median(values: list[float]) -> float:
    rest = sorted(values[1:]) or values
    return rest[len(rest) // 2]


def rows(cases: list[tuple[str, str]], steps: int) -> list[str]:
    head = ["| network | plain peak RSS MB | "
            + " | ".join(f"{m}: peak RSS MB (x plain), plan used?" for m in MODES[1:])
            + " | planned executor predicted / MXNet MB (sqrt; unplanned) | own arrays MB"
            " | step time x plain (sqrt) |", "|---" * 7 + "|"]
    out = list(head)
    for label, case in cases:
        found = {m: run_child(case, m, steps) for m in MODES}
        plain = found["plain"]
        if "failed" in plain:
            out.append(f"| {label} | plain Gluon fails: {plain['failed']} | | | | | |")
            print(out[-1], flush=True)
            continue
        cells = [label, f"{plain['peak_rss_mb']:.0f}"]
        for m in MODES[1:]:
            f = found[m]
            if "failed" in f:
                cells.append(f"failed: {f['failed']}")
                continue
            ratio = f["peak_rss_mb"] / plain["peak_rss_mb"]
            cells.append(f"{f['peak_rss_mb']:.0f} ({ratio:.2f}x), "
                         + ("yes" if f["used"] else "no: trained unplanned"))
        sq = found["sqrt"]
        figure = "" if "failed" in sq else (
            f"{sq['predicted_mb']:.0f} / {sq.get('mxnet_mb', '-')}; {sq['baseline_mb']:.0f}")
        own = "" if "failed" in sq else f"{sq.get('own_mb', 0):.1f}"
        time_ratio = "" if "failed" in sq else \
            f"{median(sq['step_seconds']) / median(plain['step_seconds']):.2f}"
        out.append("| " + " | ".join(cells + [figure, own, time_ratio]) + " |")
        print(out[-1], flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="small,large,lm")
    ap.add_argument("--networks", default=",".join(NETWORKS))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", help="page whose marked table section is rewritten")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        case, mode, steps = args.child
        child(case, mode, int(steps))
        return
    import mxnet as mx

    argv = sys.argv[1:] if argv is None else argv
    mkldnn = "off" if os.environ.get("MXNET_MKLDNN_ENABLED") == "0" else "on"
    load = os.getloadavg()
    lines = [generated_by("scripts/gluon_table.py", argv) + f" MXNet {mx.__version__}, CPU, "
             f"MKL-DNN {mkldnn}; load average {load[0]:.1f} at the start (2 cores, shared).",
             ""]
    networks = args.networks.split(",")
    for size in args.sizes.split(","):
        if size == "lm":
            lines += [f"Word-level LM (vocab {LM['vocab']}, Embedding {LM['emb']}, "
                      f"LSTM {LM['hidden']} x 2 layers, Dropout 0.2, Dense decoder; batch "
                      f"{LM['batch']}; the loss outside the block, as in MXNet's example):", ""]
            cases = [(f"LM fused rnn.LSTM(256, 2), T={T}", f"lm {T} fused") for T in (35, 200)]
            cases += [(f"LM 2 x rnn.LSTM(256, 1), T={T}", f"lm {T} stacked") for T in (35, 200)]
        else:
            batch, side, classes = SIZES[size]
            lines += [f"Batch {batch}, {side}x{side} (Inception-V3 299x299 at the large size), "
                      f"{classes} classes:", ""]
            cases = [(n, f"image {n} {batch} {side} {classes}") for n in networks]
        lines += rows(cases, args.steps) + [""]
    write_section(args.out, "gluon_table", lines)


if __name__ == "__main__":
    main()
