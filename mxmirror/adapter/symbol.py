"""MXNet itself, and a Symbol from what a user gives (a Symbol, JSON text or a file)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from mxmirror.adapter.children import LEARNER, error_line, start_early
from mxmirror.errors import PlanError
from mxmirror.planning.cache import templates_kept


def learner_ahead() -> None:
    """On a new user's first run (no template kept yet), before this process imports MXNet:
    start the template learner now, so that its own import of MXNet overlaps this one."""
    if "mxnet" not in sys.modules and not templates_kept():
        start_early(LEARNER[0], **LEARNER[1])


def load_mxnet():
    """MXNet, imported (the learner started ahead of it on a first run)."""
    learner_ahead()
    try:
        import mxnet as mx
    except ImportError as exc:  # pragma: no cover - install problem
        raise PlanError("MXNet is not installed: pip install 'mxmirror[cpu]'") from exc
    return mx


# the first 8 bytes of a file of NDArrays (mx.nd.save, and so every .params file):
# kMXAPINDArrayListMagic, little-endian (src/c_api/c_api.cc)
NDARRAY_FILE_MAGIC = (0x112).to_bytes(8, "little")


def load_symbol(source: Any):
    """An mx.sym.Symbol from a Symbol, a JSON string or a path to a JSON file (a file or
    text that is no symbol is refused before MXNet is imported)."""
    if not isinstance(source, (str, bytes, Path)):
        mx = load_mxnet()
        if isinstance(source, mx.sym.Symbol):
            return source
        raise PlanError(f"expected an mx.sym.Symbol, symbol JSON text or a path to a "
                        f"-symbol.json file, not {type(source).__name__}")
    if isinstance(source, bytes):
        try:
            source = source.decode()
        except UnicodeDecodeError:
            raise PlanError("symbol JSON bytes are not UTF-8 text") from None
    if not str(source).strip():
        raise PlanError("the symbol is empty: give an mx.sym.Symbol, its JSON text or a path")
    text = None
    if isinstance(source, Path) or not str(source).lstrip().startswith(("{", "[")):
        path = Path(source)
        if not path.exists():
            raise PlanError(f"symbol file not found: {path}")
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise PlanError(f"cannot read symbol file {path}: {exc}") from None
        if raw[:8] == NDARRAY_FILE_MAGIC or path.suffix == ".params":
            raise PlanError(f"{path} is an MXNet parameter file (arrays saved by "
                            f"save_checkpoint, save_parameters or nd.save), not a symbol: give "
                            f"the symbol JSON saved beside it (PREFIX-symbol.json)")
        try:
            text = raw.decode()
        except UnicodeDecodeError as exc:
            raise PlanError(f"cannot read symbol file {path}: {exc}") from None
    else:
        text = str(source)
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or "nodes" not in data or "heads" not in data:
            raise ValueError("no 'nodes'/'heads'")
        if not isinstance(data["nodes"], list) or not data["nodes"]:
            raise ValueError("no nodes")
        if not isinstance(data["heads"], list) or not data["heads"]:
            raise ValueError("no heads: the symbol has no output")
    except ValueError as exc:
        raise PlanError(f"not an MXNet symbol JSON ({exc}); save one with sym.save()") from None
    mx = load_mxnet()
    try:
        return mx.sym.load_json(text)
    except Exception as exc:  # MXNetError
        raise PlanError(f"MXNet cannot load the symbol: {error_line(exc)}") from None


# Ops whose body is a subgraph (mx.sym.contrib.foreach / while_loop / cond). mxmirror
# learns every op's backward by binding it alone in a child process; a subgraph op
# cannot be learned that way, so such symbols are refused (they are never split).
CONTROL_FLOW = {"_foreach", "_while_loop", "_cond"}


def check_supported(data: dict) -> None:
    """Refuse graphs mxmirror cannot simulate (`data`: a symbol's JSON, read): control flow
    and other subgraph ops."""
    for node in data["nodes"]:
        if node.get("op") in CONTROL_FLOW or node.get("subgraphs"):
            raise PlanError(
                f"node {node.get('name')!r} is a control-flow op ({node.get('op')}, from "
                f"mx.sym.contrib.foreach/while_loop/cond) with a subgraph; mxmirror cannot "
                f"plan through it. Bind this symbol without mxmirror, or unroll the loop")
