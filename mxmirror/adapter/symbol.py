"""MXNet itself, and a Symbol from what a user gives (a Symbol, JSON text or a file)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import re
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from mxmirror.adapter.children import LEARNER, error_line, start_early
from mxmirror.errors import PlanError
from mxmirror.planning.cache import cache_path, keep, read_kept, templates_kept


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
    return _load_json(_json_text(source))


def _json_text(source: str | bytes | Path) -> str:
    """The symbol JSON text of a path or of the text itself, checked to be one."""
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
    return text


def _load_json(text: str):
    mx = load_mxnet()
    try:
        return mx.sym.load_json(text)
    except Exception as exc:  # MXNetError
        raise PlanError(f"MXNet cannot load the symbol: {error_line(exc)}") from None


def mxnet_version() -> str:
    """The installed MXNet's version, read from its files where it is not imported yet (a
    plan kept on disk is then found without importing MXNet)."""
    if "mxnet" not in sys.modules:
        spec = importlib.util.find_spec("mxnet")
        with contextlib.suppress(OSError, TypeError):
            found = re.search(r'^__version__ = "([^"]+)"$', (
                Path(spec.origin).parent / "libinfo.py").read_text(), re.M)
            if found:
                return found.group(1)
    return load_mxnet().__version__


def symbol_json(sym: Any) -> str:
    """A symbol's JSON as MXNet binds it. ``Symbol.tojson()`` leaves out the amp_cast and
    amp_multicast nodes by default (``remove_amp_cast=True``, for a model saved to run in
    float32), while a bind runs them: a plan read from that JSON would be one of another
    graph, and its bind would drop the casts."""
    if isinstance(sym, SymbolText):
        return sym.text
    return sym.tojson(remove_amp_cast=False)


@dataclass
class SymbolText:
    """A symbol as MXNet reads it: its own JSON (symbol_json), arguments and auxiliary
    states (what a
    plan's key and the checks of the inputs need), answering those as a Symbol does. Kept
    on disk per symbol text and MXNet version, so that a plan kept for a symbol file is
    found without importing MXNet; the Symbol itself is made on first use."""

    text: str
    arguments: list[str]
    auxiliary: list[str]

    @classmethod
    def of(cls, sym: Any) -> SymbolText:
        out = cls(symbol_json(sym), sym.list_arguments(), sym.list_auxiliary_states())
        out.__dict__["symbol"] = sym
        return out

    def tojson(self) -> str:
        return self.text

    def list_arguments(self) -> list[str]:
        return list(self.arguments)

    def list_auxiliary_states(self) -> list[str]:
        return list(self.auxiliary)

    @cached_property
    def symbol(self) -> Any:
        return _load_json(self.text)


def read_symbol(source: Any) -> SymbolText:
    """What MXNet reads from a Symbol, JSON text or file (as load_symbol takes them); for
    text, from the disk cache where MXNet read the same text before."""
    if isinstance(source, SymbolText):
        return source
    if not isinstance(source, (str, bytes, Path)):
        return SymbolText.of(load_symbol(source))
    text = _json_text(source)
    folder = cache_path()
    file = None if folder is None else folder / "symbols" / (hashlib.sha256(
        f"{mxnet_version()}\0{text}".encode()).hexdigest() + ".json")
    # a kept file that cannot be read: MXNet reads the symbol again, and it is kept anew
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        kept = None if file is None else read_kept(file)
        if kept is not None:
            kept = json.loads(kept)
            return SymbolText(str(kept["text"]), [str(a) for a in kept["arguments"]],
                              [str(a) for a in kept["auxiliary"]])
    read = SymbolText.of(_load_json(text))
    if file is not None:
        keep(file, json.dumps({"text": read.text, "arguments": read.arguments,
                               "auxiliary": read.auxiliary}))
    return read


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
