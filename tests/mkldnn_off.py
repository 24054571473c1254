"""Run tests again in a child process with MKL-DNN off.

MXNet reads ``MXNET_MKLDNN_ENABLED`` once, at process start, so the MKL-DNN-off runs of a test
file happen in a child. Each file keeps its own assertions; this module only starts the child
and reads its verdict.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MKLDNN = os.environ.get("MXNET_MKLDNN_ENABLED") != "0"
QUIET = {"MXNET_MKLDNN_ENABLED": "0", "MXNET_SUBGRAPH_VERBOSE": "0",
         "MXNET_STORAGE_FALLBACK_LOG_VERBOSE": "0"}


def run_pytest(test_file: str, select: str, passed: int | None = None,
               timeout: int = 900) -> None:
    """Run the tests of `test_file` chosen by ``-k select`` with MKL-DNN off; they must all
    pass (exactly `passed` of them when given) and none may be skipped."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:warnings",
                           "-p", "no:cacheprovider", test_file, "-k", select],
                          capture_output=True, text=True, env=dict(os.environ, **QUIET),
                          cwd=ROOT, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, summary
    if passed is not None:
        assert f"{passed} passed" in summary, summary


def run_code(code: str, timeout: int = 900) -> None:
    """Run `code` (given the repository root as argv[1]) with MKL-DNN off; its last line of
    output must be ``ok``."""
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True,
                          text=True, env=dict(os.environ, **QUIET), timeout=timeout)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
