"""Child Python processes that run mxmirror: the one runner, and what their output says.

mxmirror binds in children whenever the parent must not pay for it: learning backward
templates (MXNET_MEM_PLAN_VERBOSE_LOGGING is read once per process), MXNet's figure of a
big graph (a bind leaves ~0.5 GB resident), a switch such as MXNET_BACKWARD_DO_MIRROR.
A child can be started early (``start_early``), before it is asked anything: its own
start-up (``import mxnet``, over a second) then overlaps the parent's.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

# the template learner: its module and settings (adapter/learn.py)
LEARNER = ("mxmirror.adapter.learn", {"MXNET_MEM_PLAN_VERBOSE_LOGGING": "1"})

_TOTAL_RE = re.compile(r"Total (\d+) MB allocated")
_PKG_PARENT = str(Path(__file__).resolve().parents[2])


class ChildFailed(Exception):
    """A child process exited with an error; ``tail`` is its last line of stderr."""

    def __init__(self, returncode: int, tail: str) -> None:
        super().__init__(tail)
        self.returncode, self.tail = returncode, tail


def run_child(module: str, *args: str, stdin: str = "", **settings: str) -> str:
    """Run ``python -m module args`` with `stdin` in child_env(**settings) and return its
    stdout; ChildFailed (with its last stderr line) if it fails. A child of the same module
    and settings started early (no arguments) is used, once."""
    early = None if args else _early.pop(_key(module, settings), None)
    if early is not None and early.poll() is None:
        stdout, stderr = early.communicate(stdin)
        code = early.returncode
    else:
        proc = subprocess.run([sys.executable, "-m", module, *args], input=stdin,
                              capture_output=True, text=True, env=child_env(**settings))
        stdout, stderr, code = proc.stdout, proc.stderr, proc.returncode
    if code != 0:
        raise ChildFailed(code, _tail(stderr))
    return stdout


_early: dict[tuple, subprocess.Popen] = {}


def _key(module: str, settings: dict[str, str]) -> tuple:
    return (module, tuple(sorted(settings.items())))


def start_early(module: str, **settings: str) -> None:
    """Start ``python -m module`` now, reading its input only when run_child asks with the
    same module and settings; one never asked is stopped when this process exits."""
    key = _key(module, settings)
    if key in _early:
        return
    if not _early:
        atexit.register(_stop_early)
    _early[key] = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=child_env(**settings))


def _stop_early() -> None:
    while _early:
        proc = _early.popitem()[1]
        proc.kill()
        proc.communicate()


def last_json(stdout: str) -> Any:
    """The JSON value on a child's last line of output (ValueError if there is none)."""
    lines = stdout.strip().splitlines()
    if not lines:
        raise ValueError("no output")
    return json.loads(lines[-1])


def _tail(stderr: str) -> str:
    return (stderr.strip().splitlines() or ["no output"])[-1][:300]


def child_env(**settings: str) -> dict[str, str]:
    """The environment of a child running mxmirror: this package importable, MXNet's
    subgraph chatter off, the mirror switch off unless given, the bind hook off (a child's
    own binds, a learner's one-op graphs, are never planned: planning them would learn in a
    child again), plus `settings`."""
    env = dict(os.environ, MXNET_SUBGRAPH_VERBOSE="0")
    for key in ("MXNET_BACKWARD_DO_MIRROR", "MXNET_MEM_PLAN_VERBOSE_LOGGING",
                "MXMIRROR_POLICY", "MXMIRROR_BUDGET"):
        env.pop(key, None)
    env.update(settings)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PKG_PARENT, env.get("PYTHONPATH")) if p)
    return env


def allocated_mb(debug_str: Any) -> list[int]:
    """Every ``Total X MB allocated`` in an executor's debug_str (or its text), in MB."""
    text = debug_str if isinstance(debug_str, str) else debug_str.debug_str()
    return [int(m) for m in _TOTAL_RE.findall(text)]


# MXNet's "[09:38:08] ../src/operator/nn/convolution.cc:151: " inside its messages
_LOG_PREFIX = re.compile(r"\[\d\d:\d\d:\d\d\]\s*\S+:\d+:\s*")


def error_line(exc: BaseException | str) -> str:
    """The one informative line of an MXNet error (no stack trace, no log prefix)."""
    text = exc if isinstance(exc, str) else str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if "Stack trace" not in ln and not ln.startswith(
        ("Traceback", "File ", "simple_bind error", "infer_type error", "infer_shape error"))]
    for ln in lines:
        if "Check failed" in ln or "Error" in ln:
            return _LOG_PREFIX.sub("", ln)[:300]
    name = exc if isinstance(exc, str) else type(exc).__name__
    return _LOG_PREFIX.sub("", lines[0] if lines else name)[:300]
