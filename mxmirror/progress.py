"""Progress of long work: planning, and mxmirror's own MXNet binds in child processes.

On a terminal, one status line redrawn in place from the first second (DELAY): what is
being done, how far, a bar and the time left where the total is known. Anywhere else (a
log file, CI, a pipe), one line at least every INTERVAL seconds on stderr saying the same
(pieces of work that follow each other within GAP seconds count as one stretch), and a last
line when the work is done. Work that ends sooner prints nothing. Tasks nest
(planning > learning templates in a child): a line names them all, outermost first.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

DELAY = 0.5  # seconds before the terminal line shows (and between redraws)
INTERVAL = 10.0  # seconds between lines when stderr is not a terminal
BAR = 12  # characters of a bar
GAP = 1.0  # seconds between two pieces of work that make them one stretch of work


class Task:
    """One piece of work under way: what, how much of how much, since when."""

    def __init__(self, what: str, total: int | None, unit: str) -> None:
        self.what, self.total, self.unit = what, total, unit
        self.done = 0
        self.start = time.monotonic()

    def advance(self, n: int = 1) -> None:
        self.done += n

    def status(self, end: str = "", bar: bool = False) -> str:
        """'what: 3/12 ops, 25 s' ('what: done, ...' with `end` 'done'; with `bar`, a bar
        and the time left, estimated from the rate so far)."""
        took = time.monotonic() - self.start
        parts = [end] if end else []
        if self.total:
            count = f"{self.done}/{self.total} {self.unit}".rstrip()
            if bar and not end:
                full = min(BAR, BAR * self.done // self.total)
                count = f"[{'#' * full}{'.' * (BAR - full)}] {count}"
            parts.append(count)
        elif self.done:
            parts.append(f"{self.done} {self.unit}".rstrip())
        parts.append(f"{took:.0f} s")
        if bar and self.total and 0 < self.done < self.total:
            parts.append(f"about {took * (self.total - self.done) / self.done:.0f} s left")
        return f"{self.what}: {', '.join(parts)}"


_active: list[Task] = []
_lock = threading.Lock()
# work that follows other work within GAP seconds continues its stretch: the first line
# comes INTERVAL after the stretch began or its last line (reading the graph for 8 s, then
# planning, is not 18 s without a word)
_quiet = {"since": 0.0, "ended": float("-inf")}


@contextlib.contextmanager
def task(what: str, total: int | None = None, unit: str = "") -> Iterator[Task]:
    """Report `what` while the block runs; ``Task.advance`` counts `unit`s done of `total`."""
    t = Task(what, total, unit)
    with _lock:
        outermost = not _active
        _active.append(t)
        if outermost and t.start - _quiet["ended"] > GAP:
            _quiet["since"] = t.start
    reporter = _Reporter(sys.stderr) if outermost else None
    end = "stopped"  # unless the block gets to its end
    try:
        yield t
        end = "done"
    finally:
        with _lock:
            _active.remove(t)
        if reporter is not None:
            reporter.stop(t, end)
            _quiet["ended"] = time.monotonic()


@contextlib.contextmanager
def scoring(analysis: Any, what: str) -> Iterator[None]:
    """Count the plans `analysis` (a planning Analysis: its ``on_score`` hook) simulates
    meanwhile, as the task `what`."""
    with task(what, unit="plans scored") as t:
        analysis.on_score = t.advance
        try:
            yield
        finally:
            analysis.on_score = None


def _line(tasks: list[Task], terminal: bool) -> str:
    """Every task, outermost first; on a terminal, whose width cuts the line, the innermost
    first with its bar, then the ones it is part of."""
    if not terminal:
        return " > ".join(t.status() for t in tasks)
    *outer, inner = tasks
    return inner.status(bar=True) + "".join(f" (in {t.status()})" for t in reversed(outer))


def _is_terminal(stream: Any) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class _Reporter:
    """A thread that reports every task under way: the terminal line every DELAY seconds,
    else a line every INTERVAL seconds; at the end it clears the terminal line, or writes
    a last line if it wrote any."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.wrote = stream, False
        self.terminal = _is_terminal(stream)
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="mxmirror-progress")
        self.thread.start()

    def _run(self) -> None:
        while True:
            wait = DELAY if self.terminal else _quiet["since"] + INTERVAL - time.monotonic()
            if self.halt.wait(max(wait, 0.0)):
                return
            with _lock:
                tasks = list(_active)
            if tasks:
                self._write(f"mxmirror: {_line(tasks, self.terminal)}")

    def stop(self, outer: Task, end: str) -> None:
        self.halt.set()
        self.thread.join()
        if self.wrote:
            self._write("" if self.terminal else f"mxmirror: {outer.status(end)}")

    def _write(self, line: str) -> None:
        if self.terminal:  # redraw in place, cut to the terminal's width
            width = shutil.get_terminal_size().columns - 1
            text = f"\r{line[:width]}\x1b[K"
        else:
            text = f"{line}\n"
        try:
            self.stream.write(text)
            self.stream.flush()
            self.wrote = bool(line)
            _quiet["since"] = time.monotonic()
        except (OSError, ValueError):  # a closed stream: progress is not worth an error
            pass
