"""Child Python processes that run mxmirror, and MXNet's own memory figure they print.

mxmirror binds in children whenever the parent must not pay for it: learning backward
templates (MXNET_MEM_PLAN_VERBOSE_LOGGING is read once per process), MXNet's figure of a
big graph (a bind leaves ~0.5 GB resident), a switch such as MXNET_BACKWARD_DO_MIRROR.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

_TOTAL_RE = re.compile(r"Total (\d+) MB allocated")
_PKG_PARENT = str(Path(__file__).resolve().parent.parent)


def child_env(**settings: str) -> dict[str, str]:
    """The environment of a child running mxmirror: this package importable, MXNet's
    subgraph chatter off, the mirror switch off unless given, plus `settings`."""
    env = dict(os.environ, MXNET_SUBGRAPH_VERBOSE="0")
    for key in ("MXNET_BACKWARD_DO_MIRROR", "MXNET_MEM_PLAN_VERBOSE_LOGGING"):
        env.pop(key, None)
    env.update(settings)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PKG_PARENT, env.get("PYTHONPATH")) if p)
    return env


def allocated_mb(debug_str: Any) -> list[int]:
    """Every ``Total X MB allocated`` in an executor's debug_str (or its text), in MB."""
    text = debug_str if isinstance(debug_str, str) else debug_str.debug_str()
    return [int(m) for m in _TOTAL_RE.findall(text)]
