"""The "mxmirror" logger: one line per planned bind or planned Gluon shape."""

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
