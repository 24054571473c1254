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


def mb_text(mb: float, digits: int | None = None) -> str:
    """A size in MB as a person reads it. Up to 10240 MB: MB with `digits` decimals (whole
    KB where that would read 0 MB), or by default one decimal below 100 MB, none from 100 MB
    and KB below 0.1 MB. Above: GB, or TB above 10240 GB, one decimal below 100 and none
    from 100 (44.9 GB, 113 TB)."""
    unit = "MB"
    for bigger in ("GB", "TB"):
        if mb > 10240:
            mb, unit = mb / 1024, bigger
    if unit == "MB" and digits is not None:
        if 0 < mb < 0.5 / 10**digits:  # would read 0 MB
            return f"{mb * 1024:.0f} KB"
        return f"{mb:.{digits}f} MB"
    if mb < 0.1:
        return f"{mb * 1024:.1f} KB"
    return f"{mb:.0f} {unit}" if mb >= 100 else f"{mb:.1f} {unit}"


def size(nbytes: float, digits: int = 1) -> str:
    """Bytes as a log line writes them: MB, or KB below 0.1 MB (a tiny budget is not 0 MB)."""
    if abs(nbytes) >= 0.1 * 2**20 or not nbytes:
        return f"{nbytes / 2**20:.{digits}f} MB"
    return f"{nbytes / 2**10:.{digits}f} KB"
