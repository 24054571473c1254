"""Progress: planning and mxmirror's own MXNet binds say they are alive. On a terminal one
line redrawn in place (a bar and the time left where the total is known) from the first
second; with stderr a pipe or a file, a line at least every INTERVAL seconds; nothing for
quick work."""

from __future__ import annotations

import io
import subprocess
import sys
import time

import pytest

from mxmirror import progress
from mxmirror.api import prepare
from mxmirror.planning import cache
from symbols.resnet import resnet, resnet_by_depth
from tests.helpers import child_env, cli_child

SHAPES = {"data": (4, 3, 32, 32), "softmax_label": (4,)}


@pytest.fixture(autouse=True)
def _a_new_stretch_of_work(monkeypatch) -> None:
    """Each test starts its own stretch (not within GAP of the test before)."""
    monkeypatch.setitem(progress._quiet, "ended", float("-inf"))


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _plan(monkeypatch, stream, delay: float = 0.0) -> str:
    monkeypatch.setattr(cache, "plans_dir", lambda: None)  # plan, do not read a kept plan
    monkeypatch.setattr(progress, "DELAY", delay)
    monkeypatch.setattr(sys, "stderr", stream)
    sym = resnet([2, 2, 2], bottleneck=False, num_classes=10, image_shape=(3, 32, 32))
    prep = prepare(sym, **SHAPES)
    prep.plan("search")
    assert prep.analysis.on_score is None  # the count is gone with the planning
    return stream.getvalue()


def test_terminal_line_counts_the_plans_scored(monkeypatch) -> None:
    """Each plan scored takes 5 ms more here, so the planning outlasts the 10 ms DELAY on any
    machine (CI once planned this network in less than that, and no line was drawn)."""
    advance = progress.Task.advance

    def slow_advance(self, n: int = 1) -> None:
        time.sleep(0.005)
        advance(self, n)

    monkeypatch.setattr(progress.Task, "advance", slow_advance)
    out = _plan(monkeypatch, _Terminal(), delay=0.01)
    drawn = [d for d in out.split("\r") if d.startswith("mxmirror: planning (search, ")]
    assert drawn and "plans scored" in drawn[-1], out[-300:]
    assert out.endswith("\r\x1b[K")  # the line is cleared once planning is done


def test_quick_work_prints_nothing(monkeypatch) -> None:
    assert _plan(monkeypatch, _Terminal(), delay=30.0) == ""
    assert _plan(monkeypatch, io.StringIO()) == ""  # INTERVAL (10 s) not reached


def test_a_line_at_every_interval_and_when_done(monkeypatch) -> None:
    """Nested tasks, outermost first; the total where it is known; a last line."""
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(progress, "INTERVAL", 0.05)
    with progress.task("planning") as outer:
        outer.advance(7)
        with progress.task("learning", total=4, unit="ops") as inner:
            inner.advance()
            time.sleep(0.3)
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 3, lines
    assert lines[0] == "mxmirror: planning: 7, 0 s > learning: 1/4 ops, 0 s", lines
    assert lines[-1] == "mxmirror: planning: done, 7, 0 s", lines


def test_work_that_follows_work_keeps_the_rhythm(monkeypatch) -> None:
    """Two pieces of work of 0.6 intervals each, one straight after the other (reading the
    graph, then planning): a line comes within the second."""
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(progress, "INTERVAL", 0.5)
    for what in ("reading", "planning"):
        with progress.task(what):
            time.sleep(0.3)
    lines = stream.getvalue().splitlines()
    assert lines and lines[0].startswith("mxmirror: planning: "), lines


def test_work_that_fails_is_not_called_done(monkeypatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(progress, "INTERVAL", 0.05)
    with pytest.raises(KeyboardInterrupt), progress.task("planning", unit="plans") as t:
        t.advance(3)
        time.sleep(0.2)
        raise KeyboardInterrupt
    assert stream.getvalue().splitlines()[-1] == "mxmirror: planning: stopped, 3 plans, 0 s"


def test_terminal_bar_and_time_left(monkeypatch) -> None:
    t = progress.Task("learning backward templates from MXNet", 12, "ops")
    t.start -= 6.0
    t.advance(3)
    assert t.status(bar=True) == ("learning backward templates from MXNet: [###.........] "
                                  "3/12 ops, 6 s, about 18 s left")


def test_progress_lines_with_stderr_a_pipe(tmp_path) -> None:
    """A real run of `mxmirror plan` with stderr a pipe (a fresh cache: the templates are
    learned in a child): lines of the command, naming the reading of the graph and the
    learning (with its total) and the planning (plans scored) under way, each within the
    interval of the one before."""
    sym_file = tmp_path / "resnet20-symbol.json"
    resnet_by_depth(20, bottleneck=False, num_classes=10, image_shape=(3, 32, 32)).save(
        str(sym_file))
    # planning here takes well over 0.2 s (100+ plans scored), learning some 0.05 s (the
    # learner child answers, then ends without MXNet's teardown)
    interval = 0.01
    proc = subprocess.Popen([*cli_child(interval), "plan", str(sym_file), "--shape",
                             "data=8,3,32,32", "--policy", "budget", "--budget", "8MB"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(MXMIRROR_CACHE=str(tmp_path / "cache")))
    lines, at = [], []
    for line in proc.stderr:
        lines.append(line.rstrip("\n"))
        at.append(time.monotonic())
    assert proc.wait(timeout=300) == 0, "\n".join(lines)
    progress_lines = [ln for ln in lines if "policy=" not in ln]
    # the command is the outermost task from its start; what it does is nested in it
    assert all(ln.startswith("mxmirror: plan: ") for ln in progress_lines), lines
    assert any("> reading and analysing the graph: " in ln and
               "> learning backward templates from MXNet: " in ln and "ops, " in ln
               for ln in progress_lines), lines
    assert any("> planning (budget, " in ln and "plans scored" in ln
               for ln in progress_lines), lines
    assert progress_lines[-1].startswith("mxmirror: plan: done, "), lines
    gaps = [b - a for a, b in zip(at, at[1:len(progress_lines)])]
    assert max(gaps) < interval + 2.0, gaps  # slack: two shared cores


def test_plan_time_counts_reading_and_analysing(monkeypatch) -> None:
    monkeypatch.setattr(cache, "plans_dir", lambda: None)
    prep = prepare(resnet_by_depth(8, bottleneck=False, num_classes=10,
                                   image_shape=(3, 32, 32)), **SHAPES)
    assert prep.seconds > 0
    start = time.perf_counter()
    p = prep.plan("sqrt")
    assert prep.seconds < p.plan_seconds <= prep.seconds + time.perf_counter() - start
