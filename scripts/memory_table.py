"""Simulated vs MXNet 1.9.1 memory for paper-size networks (bind only, nothing runs).

For every row the graph is loaded once, the training graph built for the row's
mirror set and simulated with the three strategies (``none``: every entry its
own buffer, ``inplace``: in-place reuse only, ``sharing``: MXNet's default);
then MXNet binds the same symbol (mirror set written as ``__force_mirroring__``)
in a child process, once as is and once with ``NNVM_EXEC_MATCH_RANGE=0``
(in-place only), and its ``Total X MB allocated`` is read back.  MXNet prints
whole MB (floored), so an exact simulator is 0..1 MB above it.

    python scripts/memory_table.py [--out docs/memory_table.md]
        [--workers 2] [--only REGEX]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import mxnet as mx
from _bootstrap import ROOT
from provenance import generated_by

from mxmirror.adapter.figure import mxnet_mb
from mxmirror.adapter.reader import load_graph
from mxmirror.ir.symbol_json import annotate_json
from mxmirror.sim import memory_plan, training_graph
from symbols.lstm import input_shapes, paper_lstm
from symbols.resnet import resnet

IMAGENET_UNITS = {50: [3, 4, 6, 3], 152: [3, 8, 36, 3], 200: [3, 24, 36, 3],
                  1001: [3, 120, 207, 3]}
UNIT_RE = r"^stage(\d+)_unit(\d+)_"


@dataclass
class Row:
    network: str
    input: str
    build: Callable[[], tuple[mx.sym.Symbol, dict]]
    every_other: str | None = None  # regex whose groups name a block: mirror odd blocks


def _imagenet(depth: int, batch: int = 32) -> Callable:
    def build():
        sym = resnet(IMAGENET_UNITS[depth], act="leaky")
        return sym, {"data": (batch, 3, 224, 224), "softmax_label": (batch,)}
    return build


def _cifar110(batch: int) -> Callable:
    def build():
        sym = resnet([18, 18, 18], bottleneck=False, num_classes=10, image_shape=(3, 32, 32))
        return sym, {"data": (batch, 3, 32, 32), "softmax_label": (batch,)}
    return build


def _lstm(steps: int, batch: int = 64) -> Callable:
    def build():
        return paper_lstm(steps), input_shapes(steps, batch)
    return build


_GLUON_DIR = Path(tempfile.mkdtemp(prefix="memory_table_"))


def _gluon(name: str, batch: int, size: int) -> Callable:
    """Model-zoo net exported to a symbol (one batch-1 forward), SoftmaxOutput on top."""
    def build():
        from mxnet.gluon.model_zoo import vision

        prefix = _GLUON_DIR / name
        net = vision.get_model(name, pretrained=False)
        net.initialize()
        net.hybridize()
        net(mx.nd.zeros((1, 3, size, size)))
        net.export(str(prefix))
        sym = mx.sym.SoftmaxOutput(mx.sym.load(f"{prefix}-symbol.json"), name="softmax")
        return sym, {"data": (batch, 3, size, size), "softmax_label": (batch,)}
    return build


def _rnn_lm(steps: int = 35, batch: int = 64, hidden: int = 1024, layers: int = 2,
            vocab: int = 10000) -> Callable:
    """PTB-style LM from mx.rnn.LSTMCell, unrolled with merged outputs.

    Begin states are variables: unroll's default ``_zeros`` states cannot be
    loaded by mxmirror yet (no template for an op without inputs).
    """
    def build():
        stack = mx.rnn.SequentialRNNCell()
        for i in range(layers):
            stack.add(mx.rnn.LSTMCell(hidden, prefix=f"lstm_l{i}_"))
        begin = stack.begin_state(func=mx.sym.Variable)
        embed = mx.sym.Embedding(mx.sym.Variable("data"), input_dim=vocab,
                                 output_dim=hidden, name="embed")
        out, _ = stack.unroll(steps, inputs=embed, begin_state=begin, layout="NTC",
                              merge_outputs=True)
        pred = mx.sym.FullyConnected(mx.sym.Reshape(out, shape=(-1, hidden)),
                                     num_hidden=vocab, name="pred")
        label = mx.sym.Reshape(mx.sym.Variable("softmax_label"), shape=(-1,))
        sym = mx.sym.SoftmaxOutput(pred, label, name="softmax")
        shapes = {"data": (batch, steps), "softmax_label": (batch, steps)}
        shapes.update({s.name: (batch, hidden) for s in begin})
        return sym, shapes
    return build


ROWS = [
    *[Row(f"ResNet-{d} (bottleneck, leaky)", "32x3x224x224", _imagenet(d))
      for d in (50, 152, 200, 1001)],
    *[Row(f"ResNet-{d} (bottleneck, leaky), every other unit mirrored", "32x3x224x224",
          _imagenet(d), UNIT_RE) for d in (200, 1001)],
    *[Row("CIFAR ResNet-110 (basic)", f"{b}x3x32x32", _cifar110(b)) for b in (32, 64, 128)],
    *[Row(f"paper LSTM 4x1024, {t} steps", "batch 64", _lstm(t)) for t in (50, 100, 200)],
    Row("gluon resnet50_v1", "32x3x224x224", _gluon("resnet50_v1", 32, 224)),
    Row("gluon densenet121", "32x3x224x224", _gluon("densenet121", 32, 224)),
    Row("gluon inceptionv3", "32x3x299x299", _gluon("inceptionv3", 32, 299)),
    Row("mx.rnn LSTM LM 2x1024, 35 steps, vocab 10k", "batch 64", _rnn_lm()),
]


def mirror_set(symbol_json: str, block_re: str | None) -> set[int]:
    if block_re is None:
        return set()
    index: dict[tuple, int] = {}
    out = set()
    for i, node in enumerate(json.loads(symbol_json)["nodes"]):
        m = re.search(block_re, node["name"])
        if node["op"] != "null" and m:
            if index.setdefault(m.groups(), len(index)) % 2 == 1:
                out.add(i)
    return out


def measure(row: Row, pool: ThreadPoolExecutor) -> dict:
    sym, shapes = row.build()
    js = sym.tojson()
    ids = mirror_set(js, row.every_other)
    bind_json = annotate_json(js, ids)
    # MXNet's binds run in child processes while this process simulates
    sharing = pool.submit(mxnet_mb, bind_json, shapes)
    inplace = pool.submit(mxnet_mb, bind_json, shapes, env={"NNVM_EXEC_MATCH_RANGE": "0"})
    g = load_graph(sym, shapes)
    mx_sharing, mx_inplace = sharing.result(), inplace.result()
    start = time.perf_counter()  # timed with the binds done: no other work on the cores
    tg = training_graph.build(g, ids)
    sim = {s: memory_plan.simulate(tg, s).mb for s in memory_plan.STRATEGIES}
    seconds = time.perf_counter() - start
    return {"sim": sim, "mx_sharing": mx_sharing, "mx_inplace": mx_inplace,
            "seconds": seconds, "mirrored": len(ids)}


def table(rows: list[Row], workers: int) -> str:
    head = ("| network | input | sim none MB | sim inplace MB | sim sharing MB "
            "| MXNet sharing MB | MXNet inplace MB | diff sharing % | diff inplace % "
            "| build+simulate s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    print("\n".join(lines), flush=True)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for row in rows:
            r = measure(row, pool)
            s, ms, mi = r["sim"], r["mx_sharing"], r["mx_inplace"]
            line = (f"| {row.network} | {row.input} | {s['none']:.1f} | {s['inplace']:.1f} "
                    f"| {s['sharing']:.1f} | {ms} | {mi} "
                    f"| {100 * (s['sharing'] - ms) / ms:+.3f} "
                    f"| {100 * (s['inplace'] - mi) / mi:+.3f} | {r['seconds']:.2f} |")
            print(line, flush=True)
            lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "memory_table.md",
                    help="markdown file to write (default docs/memory_table.md)")
    ap.add_argument("--workers", type=int, default=2, help="MXNet bind children at once")
    ap.add_argument("--only", default=None, help="regex: only rows whose network matches")
    args = ap.parse_args(argv)
    rows = [r for r in ROWS if args.only is None or re.search(args.only, r.network)]
    start = time.perf_counter()
    text = table(rows, args.workers)
    total = time.perf_counter() - start
    given = sys.argv[1:] if argv is None else argv
    doc = f"""# Simulated vs MXNet {mx.__version__} planned memory

{generated_by("scripts/memory_table.py", given)} {total:.0f} s on this machine.

Bind only: nothing runs forward.  *sim* is `mxmirror.sim.memory_plan.simulate` on the
training graph `mxmirror.sim.training_graph.build` makes; *MXNet* is the
`Total X MB allocated` of `Executor.debug_str()` after `simple_bind` on CPU
(`NNVM_EXEC_MATCH_RANGE=0` for the in-place-only column), every bind in its
own child process.  MXNet floors to whole MB, so an exact simulator is
0..1 MB above it.  Arguments, their gradients and workspace are not in these
figures (MXNet does not count them either).  The ImageNet ResNets use
LeakyReLU like the paper's memonger example; "every other unit mirrored" sets
`__force_mirroring__` on every op of the 2nd, 4th, ... residual unit.
Gradients: none for the inputs given shapes (data, labels, begin states),
'write' for every other argument (Module's rule).
*build+simulate s*: `training_graph.build` + the three `memory_plan.simulate` calls.

{text}
"""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(doc)
    print(f"\nwrote {args.out} ({total:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
