"""Run the paper's own memory planner (dmlc/mxnet-memonger) on CPU.

memonger.py is the reference implementation of Chen et al. 2016's planner.
It is never shipped or committed with mxmirror: the user fetches it
(``git clone https://github.com/dmlc/mxnet-memonger``) and names the folder with
``MEMONGER_DIR`` (scripts: ``--memonger-dir``). The folder holds ``memonger.py``,
or is a git repository (bare, or a ``.git`` folder) that has it: then
``git show HEAD:memonger.py`` is extracted into ``~/.cache/mxmirror/memonger/``
(outside the repo) and imported from there.

memonger measures plans by binding on ``mx.gpu()``; ``search_plan_cpu`` and
``get_cost_cpu`` bind on ``mx.cpu()`` instead so the figures can be taken on
machines without a GPU.  Binding only plans memory: nothing is run forward.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import mxnet as mx

from mxmirror.adapter.children import allocated_mb

ENV = "MEMONGER_DIR"
CACHE_DIR = Path.home() / ".cache" / "mxmirror" / "memonger"


#: Why the last ``load_memonger`` call returned None, for messages and skips.
last_error: str | None = None


def _candidate_file() -> Path | None:
    """Locate memonger.py in MEMONGER_DIR, extracting it from git if needed."""
    global last_error
    folder = os.environ.get(ENV)
    if not folder:
        last_error = (f"memonger not found: set {ENV} (or --memonger-dir) to a clone of "
                      f"dmlc/mxnet-memonger")
        return None
    root = Path(folder).expanduser()
    if (root / "memonger.py").is_file():
        return root / "memonger.py"
    git_dir = next((d for d in (root / ".git", root) if (d / "HEAD").is_file()), None)
    if git_dir is None:
        last_error = f"{ENV}={folder} has no memonger.py and is not a git clone of it"
        return None
    try:
        source = subprocess.run(
            ["git", f"--git-dir={git_dir}", "show", "HEAD:memonger.py"],
            check=True,
            capture_output=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        last_error = f"could not extract memonger.py from {git_dir}: {err}"
        return None
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    path = CACHE_DIR / "memonger.py"
    if not path.is_file() or path.read_bytes() != source:
        path.write_bytes(source)
    return path


def load_memonger() -> ModuleType | None:
    """Import the user-fetched memonger module, or return None (see ``last_error``)."""
    global last_error
    last_error = None
    if "memonger" in sys.modules:
        return sys.modules["memonger"]
    path = _candidate_file()
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location("memonger", path)
    if spec is None or spec.loader is None:
        last_error = f"cannot import {path}"
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules["memonger"] = module
    try:
        spec.loader.exec_module(module)
    except (
        ImportError,
        SyntaxError,
        OSError,
    ) as err:  # a broken download must not crash
        del sys.modules["memonger"]
        last_error = f"importing {path} failed: {err!r}"
        return None
    return module


def get_cost_cpu(
    sym: mx.sym.Symbol, type_dict: dict[str, Any] | None = None, grad_req: Any = "write",
    **shapes: Any
) -> int:
    """MB MXNet plans for ``sym`` when bound on CPU (by default with a gradient for every
    argument, memonger's convention).

    Same measurement as memonger's ``get_cost`` (the ``Total X MB allocated``
    line of ``debug_str()``) but on ``mx.cpu()``, and parsed by pattern
    rather than by line position.
    """
    texec = sym.simple_bind(
        ctx=mx.cpu(), grad_req=grad_req, type_dict=type_dict, **shapes
    )
    mb = allocated_mb(texec)
    del texec
    if not mb:
        raise RuntimeError("debug_str() has no 'Total X MB allocated' line")
    return mb[0]


def search_plan_cpu(
    sym: mx.sym.Symbol,
    ntrial: int = 6,
    type_dict: dict[str, Any] | None = None,
    grad_req: Any = "write",
    **shapes: Any,
) -> tuple[mx.sym.Symbol, int]:
    """Run memonger's ``search_plan`` with costs measured on CPU (binding with
    ``grad_req``: memonger's own ``'write'`` for every argument by default).

    Returns the planned symbol and its cost in MB (the smallest cost seen
    during the search, which is the plan ``search_plan`` picks).
    """
    memonger = load_memonger()
    if memonger is None:
        raise RuntimeError(last_error or "memonger is not available")
    costs: list[int] = []

    def cost(s: mx.sym.Symbol, td: dict[str, Any] | None = None, **kw: Any) -> int:
        mb = get_cost_cpu(s, td, grad_req, **kw)
        costs.append(mb)
        return mb

    original = memonger.get_cost
    memonger.get_cost = cost
    try:
        planned = memonger.search_plan(
            sym, ntrial=ntrial, type_dict=type_dict, **shapes
        )
    finally:
        memonger.get_cost = original
    return planned, min(costs)
