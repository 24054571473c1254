"""Shared pytest set-up: the repository root on sys.path and the ``slow`` marker."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "slow: takes more than ~20 s (big binds in child processes); "
        "deselect with -m 'not slow'",
    )
