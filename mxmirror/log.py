"""The "mxmirror" logger: one line per planned bind or planned Gluon shape, and how its
lines write a size."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("mxmirror")
log.addHandler(logging.NullHandler())


def show() -> None:
    """Lines go to stderr, unless the application configured logging."""
    if not any(not isinstance(h, logging.NullHandler) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def size(nbytes: float, digits: int = 1) -> str:
    """Bytes as a log line writes them: MB, or KB below 0.1 MB (a tiny budget is not 0 MB)."""
    if abs(nbytes) >= 0.1 * 2**20 or not nbytes:
        return f"{nbytes / 2**20:.{digits}f} MB"
    return f"{nbytes / 2**10:.{digits}f} KB"
