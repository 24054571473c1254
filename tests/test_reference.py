"""The distance to the limit (planning/reference.py): the live peak under ideal allocation is
below MXNet's figure for every plan, the DP finds the chain model's optimum (every cut set
of a small chain tried), and `mxmirror memory --json` reports both figures.

How close the model is to the simulated live peak on the reference networks is tabulated by
scripts/reference_table.py (docs/reference.md), not asserted here: those graphs are big.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys

import mxnet as mx

from mxmirror.api import prepare
from mxmirror.planning.algorithm3 import segment_mirror
from mxmirror.planning.reference import NO_CUT, RESOLUTION, ChainModel, live_peak_bytes, reference
from symbols.resnet import resnet

SHAPES = {"data": (8, 3, 32, 32), "softmax_label": (8,)}


def _analysis():
    sym = resnet([3, 3, 3], bottleneck=False, num_classes=10, image_shape=(3, 32, 32))
    return prepare(sym, **SHAPES).analysis


def test_live_peak_is_below_mxnets_figure() -> None:
    """MXNet's figure is the live peak plus its free list's slack: never below it."""
    a = _analysis()
    ids = [n.id for n in a.order]
    rng = random.Random(3)
    for rate in (0.0, 0.3, 0.7, 1.0):
        mirror = a.drop_unread(frozenset(i for i in ids if rng.random() < rate))
        assert 0 < live_peak_bytes(a, mirror) <= a.score(mirror).planned_bytes


def test_the_dp_finds_the_models_optimum() -> None:
    a = _analysis()
    model = ChainModel(a)
    assert 8 <= len(a.cuts) <= 14  # every subset below is tried
    least = min(model.peak([c for c, keep in zip(a.cuts, bits) if keep])
                for bits in itertools.product((False, True), repeat=len(a.cuts)))
    assert least <= model.peak(model.best()) <= least * (1 + RESOLUTION)
    ref = reference(a)
    mirror = a.drop_unread(frozenset(segment_mirror(a, list(ref.cuts))))
    assert ref.mirror == mirror
    assert ref.reference_bytes == live_peak_bytes(a, mirror)
    assert ref.planned_bytes == a.score(mirror).planned_bytes


def test_memory_json_reports_the_live_peak_and_the_reference(tmp_path) -> None:
    sym = resnet([3, 3, 3], bottleneck=False, num_classes=10, image_shape=(3, 32, 32))
    sym.save(str(tmp_path / "net.json"))
    out = subprocess.run([sys.executable, "-m", "mxmirror", "memory", str(tmp_path / "net.json"),
                          "--shape", "data=8,3,32,32", "--policy", "search", "--json",
                          "--no-bind"], capture_output=True, text=True, check=True).stdout
    got = json.loads(out)
    prep = prepare(sym, data=(8, 3, 32, 32))  # as the command: only data given a shape
    p = prep.plan("search")
    assert got["live_peak_mb"] == round(live_peak_bytes(prep.analysis, p.recomputed_ids)
                                        / 2**20, 3)
    assert got["live_peak_mb"] <= got["simulated_mb"]["planned"]
    assert got["reference_mb"] == round(reference(prep.analysis).reference_bytes / 2**20, 3)
    assert "reference_note" not in got


def test_memory_says_why_there_is_no_reference(tmp_path, capfd) -> None:
    """A graph with no candidate cut has no one-recompute plan: null with a note in the JSON,
    the note in the text."""
    from mxmirror.frontends.cli import main

    x = mx.sym.Activation(mx.sym.Convolution(mx.sym.var("data"), num_filter=8, kernel=(3, 3)),
                          act_type="relu")
    sym = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(x, num_hidden=10), name="softmax")
    assert not prepare(sym, data=(16, 3, 64, 64)).analysis.cuts
    sym.save(str(tmp_path / "net.json"))
    argv = ["memory", str(tmp_path / "net.json"), "--shape", "data=16,3,64,64", "--no-bind"]
    assert main([*argv, "--json"]) == 0
    got = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert got["reference_mb"] is None and got["reference_note"] == NO_CUT, got
    assert main(argv) == 0
    assert f"no reference: {NO_CUT}" in capfd.readouterr().out
