"""The planning progress bar: on a terminal only."""

from __future__ import annotations

import io
import sys

from mxmirror import progress
from mxmirror.api import prepare
from mxmirror.planning import cache
from symbols.resnet import resnet

SHAPES = {"data": (4, 3, 32, 32), "softmax_label": (4,)}


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _plan(monkeypatch, stream) -> str:
    monkeypatch.setattr(cache, "plans_dir", lambda: None)  # plan, do not read a kept plan
    monkeypatch.setattr(progress, "DELAY", 0.0)
    monkeypatch.setattr(sys, "stderr", stream)
    sym = resnet([2, 2, 2], bottleneck=False, num_classes=10, image_shape=(3, 32, 32))
    prep = prepare(sym, **SHAPES)
    prep.plan("search")
    assert prep.analysis.on_score is None  # the bar is gone with the planning
    return stream.getvalue()


def test_bar_on_a_terminal(monkeypatch) -> None:
    out = _plan(monkeypatch, _Terminal())
    assert "mxmirror: planning (search)" in out and "plans" in out


def test_no_bar_in_logs(monkeypatch) -> None:
    assert "planning" not in _plan(monkeypatch, io.StringIO())
