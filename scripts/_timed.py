"""A command run in a child, timed: wall seconds and the CPU seconds of the child and every
process it waited for (a learning child too)."""

from __future__ import annotations

import resource
import subprocess
import time


def timed_run(argv: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, float, float]:
    """(the finished process, its output captured as text; wall s; CPU s, user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return proc, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
