"""The one place the planner core meets MXNet: Symbol -> Graph, and MXNet's own figure.

Arguments, inputs and auxiliary states are told apart from how the symbol is
bound (list_arguments / list_auxiliary_states and which inputs were given
shapes or a grad_req), never from name suffixes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from math import prod
from pathlib import Path
from typing import Any

from . import learn, ops
from .child import allocated_mb, child_env
from .errors import PlanError
from .graph import AUX, INPUT, OP, PARAM, Graph, Node

_store: learn.TemplateStore | None = None
# Symbol.simple_bind / Symbol.bind as MXNet defines them, saved by the bind hook before it
# wraps them: mxmirror's own binds (sub-executors, fallbacks) must not be planned again
UNHOOKED: dict[str, Any] = {}


def load_mxnet():
    try:
        import mxnet as mx
    except ImportError as exc:  # pragma: no cover - install problem
        raise PlanError("MXNet is not installed: pip install 'mxmirror[cpu]'") from exc
    return mx


def unhooked(name: str) -> Any:
    """MXNet's own ``Symbol.<name>`` (simple_bind or bind), whether or not the hook is on."""
    return UNHOOKED.get(name) or getattr(load_mxnet().sym.Symbol, name)


def store() -> learn.TemplateStore:
    global _store
    if _store is None:
        _store = learn.TemplateStore(load_mxnet().__version__)
    return _store


def load_symbol(source: Any):
    """An mx.sym.Symbol from a Symbol, a JSON string or a path to a JSON file."""
    mx = load_mxnet()
    if isinstance(source, mx.sym.Symbol):
        return source
    if not isinstance(source, (str, bytes, Path)):
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
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
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
    try:
        return mx.sym.load_json(text)
    except Exception as exc:  # MXNetError
        raise PlanError(f"MXNet cannot load the symbol: {_first_line(exc)}") from None


# Ops whose body is a subgraph (mx.sym.contrib.foreach / while_loop / cond). mxmirror
# learns every op's backward by binding it alone in a child process; a subgraph op
# cannot be learned that way, so such symbols are refused (they are never split).
CONTROL_FLOW = {"_foreach", "_while_loop", "_cond"}


def check_supported(symbol_json: str) -> None:
    """Refuse graphs mxmirror cannot simulate: control flow and other subgraph ops."""
    data = json.loads(symbol_json)
    for node in data["nodes"]:
        if node.get("op") in CONTROL_FLOW or node.get("subgraphs"):
            raise PlanError(
                f"node {node.get('name')!r} is a control-flow op ({node.get('op')}, from "
                f"mx.sym.contrib.foreach/while_loop/cond) with a subgraph; mxmirror cannot "
                f"plan through it. Bind this symbol without mxmirror, or unroll the loop")


def _first_line(exc: Exception) -> str:
    return learn.error_line(exc)


def normalize_grad_req(sym, shapes: dict[str, tuple], grad_req: Any) -> dict[str, str]:
    """Module's rule: given-shape inputs get no gradient, other arguments 'write'."""
    args = sym.list_arguments()
    if grad_req is None:
        req = {a: ("null" if a in shapes else "write") for a in args}
    elif isinstance(grad_req, str):
        req = {a: grad_req for a in args}
    elif isinstance(grad_req, (list, tuple)):
        if len(grad_req) != len(args):
            raise PlanError(f"grad_req has {len(grad_req)} entries for {len(args)} arguments")
        req = dict(zip(args, grad_req))
    else:
        unknown = set(grad_req) - set(args)
        if unknown:
            raise PlanError(f"grad_req names unknown arguments: {sorted(unknown)}")
        req = {a: grad_req.get(a, "null" if a in shapes else "write") for a in args}
    bad = {v for v in req.values() if v not in ("null", "write", "add", "inplace")}
    if bad:
        raise PlanError(f"grad_req must be 'null', 'write' or 'add', not {sorted(bad)}")
    return req


def _parse_shapes(sym, shapes: dict[str, Any]) -> dict[str, tuple]:
    inputs = set(sym.list_arguments()) | set(sym.list_auxiliary_states())
    out = {}
    for name, shape in shapes.items():
        if name not in inputs:
            raise PlanError(f"--shape {name}: the symbol has no input {name!r}; its inputs "
                            f"are {', '.join(sorted(inputs)[:12])}")
        try:
            if isinstance(shape, (str, bytes)) or any(
                    isinstance(d, bool) or int(d) != d for d in shape):
                raise TypeError
            t = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise PlanError(f"shape of {name!r} must be a tuple of integers such as "
                            f"(32, 3, 224, 224), got {shape!r}") from None
        if not t or any(d <= 0 for d in t):
            raise PlanError(f"shape of {name!r} must be positive integers, got {shape!r}")
        out[name] = t
    return out


def load_graph(source: Any, shapes: dict[str, Any], type_dict: dict[str, str] | None = None,
               grad_req: Any = None) -> Graph:
    """Read a Symbol (object, JSON text or file) with input shapes into the Graph IR."""
    load_mxnet()
    sym = load_symbol(source)
    shapes = _parse_shapes(sym, shapes)
    type_dict = {name: _dtype_name(dt) for name, dt in (type_dict or {}).items()}
    inputs = set(sym.list_arguments()) | set(sym.list_auxiliary_states())
    for name, dt in type_dict.items():
        if name not in inputs:
            raise PlanError(f"dtype given for {name!r}, but the symbol has no input "
                            f"{name!r}; its inputs are {', '.join(sorted(inputs)[:12])}")
        if dt not in _DTYPES:
            raise PlanError(f"unknown dtype {dt!r} for {name!r}; use one of "
                            f"{', '.join(sorted(_DTYPES))}")
    req = normalize_grad_req(sym, shapes, grad_req)
    js = json.loads(sym.tojson())
    check_supported(sym.tojson())
    internals = sym.get_internals()
    ijs = json.loads(internals.tojson())
    if [n["name"] for n in ijs["nodes"]] != [n["name"] for n in js["nodes"]]:
        raise PlanError("internal error: node order of the symbol and its internals differ")
    try:
        _, out_shapes, _ = internals.infer_shape_partial(**shapes)
    except Exception as exc:
        raise PlanError(f"shape inference failed: {_first_line(exc)}") from None
    # as simple_bind: the given dtypes only, float32 for the inputs when none is given
    types = dict(type_dict) if type_dict else {k: "float32" for k in shapes}
    try:
        _, out_types, _ = internals.infer_type_partial(**types)
    except Exception as exc:
        raise PlanError(f"dtype inference failed (type_dict / --dtype): "
                        f"{_first_line(exc)}") from None
    vis: dict[tuple[int, int], int] = {(h[0], h[1]): i for i, h in enumerate(ijs["heads"])}
    unknown = [internals.list_outputs()[i] for i, s in enumerate(out_shapes)
               if not s or 0 in s]
    if unknown:
        raise PlanError(f"cannot infer the shape of {', '.join(unknown[:5])}: give --shape "
                        f"for every data input (given: {', '.join(shapes) or 'none'})")
    aux = set(sym.list_auxiliary_states())
    visible = Counter(nid for nid, _ in vis)  # visible outputs per node
    nodes: list[Node] = []
    for i, jn in enumerate(js["nodes"]):
        attrs = dict(jn.get("attrs", jn.get("attr", jn.get("param", {}))) or {})
        n_vis = visible[i]
        shp = [tuple(out_shapes[vis[(i, k)]]) for k in range(n_vis)]
        dts = [_dtype_name(out_types[vis[(i, k)]])
               if out_types and out_types[vis[(i, k)]] is not None else "float32"
               for k in range(n_vis)]
        node = Node(id=i, name=jn["name"], op=None if jn["op"] == "null" else jn["op"],
                    attrs=attrs, inputs=[(e[0], e[1]) for e in jn["inputs"]],
                    shapes=shp, dtypes=dts, visible=n_vis)
        if node.is_variable:
            node.kind = AUX if node.name in aux else (
                PARAM if req.get(node.name, "null") != "null" else INPUT)
            node.grad_req = req.get(node.name, "null")
        else:
            node.kind = OP
        nodes.append(node)
    graph = Graph(nodes=nodes, heads=[(h[0], h[1]) for h in js["heads"]],
                  templates=attach_templates)
    attach_templates(graph)
    for n in graph.op_nodes:
        n.flops = ops.flops(n.op, n.attrs, [graph.nodes[s].shapes[k] for s, k in n.inputs],
                            n.shapes)
    return graph


_DTYPES = {"float16", "float32", "float64", "uint8", "int8", "int32", "int64", "bool",
           "bfloat16"}


def _dtype_name(t: Any) -> str:
    import numpy as np

    try:
        return np.dtype(t).name
    except TypeError:
        return str(getattr(t, "__name__", t))


def _spec(graph: Graph, n: Node) -> dict:
    """What the learner needs to bind this node alone, and what its template depends on."""
    return {"op": n.op, "attrs": {k: v for k, v in n.attrs.items() if not k.startswith("__")},
            "shapes": [list(graph.nodes[s].shapes[k]) for s, k in n.inputs],
            "dtypes": [graph.nodes[s].dtypes[k] for s, k in n.inputs],
            "aux": [j for j, (s, _) in enumerate(n.inputs)
                    if graph.nodes[s].kind == AUX],
            "num_visible": len(n.shapes), "out_shapes": [list(x) for x in n.shapes]}


def _key(spec: dict, literal: bool = False) -> str:
    return learn.signature(spec["op"], spec["attrs"], spec["shapes"], spec["aux"],
                           spec["dtypes"], literal=literal, out_shapes=spec["out_shapes"])


def attach_templates(graph: Graph) -> None:
    """Give every op node its backward template, learning unknown ones from MXNet."""
    st = store()
    specs = {n.id: _spec(graph, n) for n in graph.op_nodes}

    def lookup(spec: dict):
        tpl = st.get(_key(spec))
        return st.get(_key(spec, literal=True)) if tpl is not None and tpl.literal else tpl

    for _ in range(2):  # the second round relearns literal templates at each node's shapes
        pending: dict[str, dict] = {}
        for spec in specs.values():
            if lookup(spec) is None:
                key = _key(spec, literal=st.get(_key(spec)) is not None)
                pending.setdefault(key, spec)
        if not pending:
            break
        new = {}
        for (key, spec), tpl in zip(pending.items(), learn.learn(list(pending.values()))):
            new[key] = tpl
            if tpl.literal:
                new[_key(spec, literal=True)] = tpl
        st.put_many(new)
    for n in graph.op_nodes:
        tpl = lookup(specs[n.id])
        if tpl is None:
            raise PlanError(f"no backward template for {n.name} ({n.op})")
        n.template = tpl
        in_shapes = [graph.nodes[s].shapes[k] for s, k in n.inputs]
        for ref in tpl.fwd_out_shapes[len(n.shapes):]:
            if ref[0] == "in":
                n.shapes.append(tuple(in_shapes[ref[1]]))
            elif ref[0] == "out":
                n.shapes.append(tuple(n.shapes[ref[1]]))
            else:
                n.shapes.append(tuple(ref[1]))
            n.dtypes.append(n.dtypes[0] if n.dtypes else "float32")
        n.backward_sizes = [[_ref_size(s, in_shapes, n.shapes) for s in tn.out_shapes]
                            for tn in tpl.nodes]


def _ref_size(ref: tuple, in_shapes: list[tuple], out_shapes: list[tuple]) -> int:
    """Elements of a template shape reference: like input j, like output k, or literal."""
    if ref[0] == "in":
        return prod(in_shapes[ref[1]])
    if ref[0] == "out":
        return prod(out_shapes[ref[1]])
    return prod(ref[1])


# ------------------------------------------------------------ MXNet's own figure
def mxnet_mb_many(jobs: list[dict]) -> list[int]:
    """MXNet's ``Total X MB allocated`` for several binds, each in its own child process.

    A job: {"symbol": json text, "shapes": {...}, "type_dict": {...} | None,
    "grad_req": {...}, "env": {...}}. Binding happens in a child so that the
    memory it leaves behind (about 0.5 GB for ResNet-1001) and env switches such
    as MXNET_BACKWARD_DO_MIRROR never reach the caller's process.
    """
    out = []
    for job in jobs:
        proc = subprocess.run([sys.executable, "-m", "mxmirror.mxnet_adapter"],
                              input=json.dumps(job), capture_output=True, text=True,
                              env=child_env(**job.get("env", {})))
        mb = allocated_mb(proc.stdout)
        if proc.returncode != 0 or not mb:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise PlanError(f"MXNet could not bind the symbol: {tail[:300]}")
        out.append(mb[0])
    return out


def mxnet_mb(sym, shapes: dict[str, Any], type_dict: dict | None = None, grad_req: Any = None,
             env: dict[str, str] | None = None) -> int:
    """MXNet's own planned-intermediates figure (integer MB) for one bind."""
    sym = load_symbol(sym)
    req = normalize_grad_req(sym, _parse_shapes(sym, shapes), grad_req)
    return mxnet_mb_many([{"symbol": sym.tojson(), "shapes": {k: list(v) for k, v in
                                                              shapes.items()},
                           "type_dict": type_dict, "grad_req": req, "env": env or {}}])[0]


def _child_bind() -> None:
    import mxnet as mx

    job = json.loads(sys.stdin.read())
    sym = mx.sym.load_json(job["symbol"])
    ex = sym.simple_bind(mx.cpu(), grad_req=job["grad_req"], type_dict=job.get("type_dict"),
                         **{k: tuple(v) for k, v in job["shapes"].items()})
    lines = [ln for ln in ex.debug_str().splitlines() if ln.startswith("Total")]
    print("\n".join(lines))


if __name__ == "__main__":
    _child_bind()
