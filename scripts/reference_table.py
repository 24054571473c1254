#!/usr/bin/env python
"""The distance to the limit: `search`'s plans against the best one-recompute plan under ideal
allocation (planning/reference.py), and how much of the rest is MXNet's allocator.

Simulator only (no bind; the simulator's figure is MXNet's to the MB, tests/
test_memory_vs_mxnet.py), Module's convention (inputs given shapes get no gradient).
Columns, per network: `search`'s MXNet figure and its live peak under ideal allocation (the
difference: MXNet's free list, never split, matched by size within a factor); the
reference: the DP's plan over the chain of candidate cuts, its model peak, its live peak
re-scored by the simulator (``reference_mb``) and its MXNet figure; search against it.
Where search's MXNet figure is more than 5% above the reference plan's, search is to be
improved (the last column says so).

Usage::

    python scripts/reference_table.py [--only NAME,...] [--out docs/reference.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import _bootstrap  # noqa: F401 (this checkout importable)

MB = 2**20
IMPROVE_ABOVE = 1.05  # search / the reference plan (MXNet figures) beyond which search is improved


def gluon(name: str):
    """A Gluon model-zoo network (pretrained=False) exported as a symbol with a softmax."""
    def build():
        import mxnet as mx
        from mxnet.gluon.model_zoo import vision

        net = vision.get_model(name, pretrained=False, classes=1000)
        net.initialize()
        net.hybridize()
        net(mx.nd.zeros((1, 3, 224, 224)))
        return mx.sym.SoftmaxOutput(net(mx.sym.var("data")), name="softmax")
    return build


def networks() -> dict:
    """name -> (symbol factory, shapes)."""
    from symbols.lstm import input_shapes, paper_lstm
    from symbols.resnet import resnet

    img = {"data": (32, 3, 224, 224), "softmax_label": (32,)}
    return {
        "ResNet-200": (lambda: resnet([3, 24, 36, 3], act="leaky"), img),
        "ResNet-1001": (lambda: resnet([3, 120, 207, 3], act="leaky"), img),
        "LSTM 4x1024x200": (lambda: paper_lstm(200), input_shapes(200, 64)),
        "Gluon resnet50_v2": (gluon("resnet50_v2"), img),
        "Gluon densenet121": (gluon("densenet121"), img),
        "Gluon mobilenetv2_1.0": (gluon("mobilenetv2_1.0"), img),
    }


def row(name: str, factory, shapes: dict) -> str:
    from mxmirror.api import prepare
    from mxmirror.planning.reference import live_peak_bytes, reference

    prep = prepare(factory(), **shapes)
    a = prep.analysis
    p = prep.plan("search")
    live = live_peak_bytes(a, p.recomputed_ids)
    start = time.process_time()
    ref = reference(a)
    seconds = time.process_time() - start
    if ref is None:
        return f"| {name} | {p.planned_mb:.1f} | {live / MB:.1f} | - | - | - | - | - | - | - |"
    over = p.planned_bytes / ref.planned_bytes
    return (f"| {name} | {p.planned_mb:.1f} | {live / MB:.1f} | "
            f"{(p.planned_bytes - live) / p.planned_bytes * 100:.0f}% | {len(ref.cuts)} | "
            f"{ref.model_bytes / MB:.1f} | {ref.reference_bytes / MB:.1f} | "
            f"{ref.planned_bytes / MB:.1f} | {(over - 1) * 100:+.1f}% | "
            f"{(live / ref.reference_bytes - 1) * 100:+.1f}% | {seconds:.1f} | "
            f"{'**yes**' if over > IMPROVE_ABOVE else 'no'} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated network names")
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = ap.parse_args()
    from provenance import write_results

    nets = networks()
    names = args.only.split(",") if args.only else list(nets)
    lines = ["| network | search MB (MXNet) | search live peak MB | allocator's share "
             "| reference cuts | reference model MB | reference MB (live peak) "
             "| reference plan MB (MXNet) | search vs reference plan (MXNet) "
             "| search vs reference (live) | reference CPU s | improve search |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name in names:
        factory, shapes = nets[name]
        lines.append(row(name, factory, shapes))
        print(lines[-1], file=sys.stderr, flush=True)
    write_results("The distance to the limit: search against the best plan under ideal "
                  "allocation", "scripts/reference_table.py", sys.argv[1:], [
        "Simulator only; inputs given shapes get no gradient. *Live peak*: the live bytes at "
        "the peak of a plan's schedule when every value has a block of its exact size, freed "
        "at its last use (MXNet's in-place reuse kept): what no allocator goes below. "
        "*Allocator's share*: (MXNet's figure - live peak) / MXNet's figure of search's plan. "
        "*Reference*: the best one-recompute plan over the chain of candidate cuts under "
        "ideal allocation, by a DP on a model of the peak (planning/reference.py; exact on "
        "chains of blocks, without the gradients of weights shared by every step of an "
        "unrolled LSTM), re-scored by the simulator: its live peak (`reference_mb` of "
        "`mxmirror memory --json`) and its MXNet figure. *Improve search*: search's MXNet "
        f"figure more than {(IMPROVE_ABOVE - 1) * 100:.0f}% above the reference plan's."],
        lines, args.out, [os.getloadavg()[0]])


if __name__ == "__main__":
    main()
