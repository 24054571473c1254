"""A progress bar for long planning, on a terminal only (never in logs or CI output)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

DELAY = 3.0  # seconds before the bar shows: quick plans print nothing


@contextlib.contextmanager
def scoring_bar(analysis: Any, desc: str) -> Iterator[None]:
    """Count the plans `analysis` (a planning Analysis: its ``on_score`` hook) simulates
    meanwhile, on stderr if it is a terminal."""
    if not sys.stderr.isatty():
        yield
        return
    from tqdm import tqdm

    with tqdm(desc=desc, unit=" plans", delay=DELAY, file=sys.stderr, leave=False) as bar:
        analysis.on_score = bar.update
        try:
            yield
        finally:
            analysis.on_score = None
