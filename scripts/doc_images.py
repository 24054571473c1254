#!/usr/bin/env python
"""The pictures of docs/quickstart.md, into docs/images/: the sqrt plans of ResNet-50 (batch
32, 224x224) and of the paper's LSTM unrolled 20 steps (batch 64), one box per block and per
segment, their memory timelines, every node of ResNet-50 and its cheap plan by block.

Usage::

    python scripts/doc_images.py [--out docs/images]

The figures change when the planners do: run it again after a change that moves a plan.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import _bootstrap  # noqa: F401  (this checkout's mxmirror and symbols)

from mxmirror.api import prepare
from mxmirror.tools.timeline import plot_timeline
from mxmirror.tools.viz import plot_plan
from symbols import lstm, resnet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(_bootstrap.ROOT / "docs" / "images"))
    out = Path(parser.parse_args().out)
    nets = {"resnet50": (resnet.resnet_by_depth(50), {"data": (32, 3, 224, 224)}),
            "lstm20": (lstm.paper_lstm(20), lstm.input_shapes(20, 64))}
    for name, (sym, shapes) in nets.items():
        prepared = prepare(sym, **shapes)
        p = prepared.plan("sqrt")
        plot_plan(p, out / f"{name}_sqrt_blocks.png", collapse="block")
        plot_plan(p, out / f"{name}_sqrt_segments.png", collapse="segment")
        plot_timeline(p, out / f"{name}_timeline.png")
        if name == "resnet50":
            plot_plan(p, out / "resnet50_sqrt_full.svg")
            plot_plan(prepared.plan("cheap"), out / "resnet50_cheap_blocks.png",
                      collapse="block")
        print(f"wrote the pictures of {name} into {out}")


if __name__ == "__main__":
    main()
