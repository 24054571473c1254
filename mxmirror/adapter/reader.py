"""Symbol -> Graph: a user's symbol and input shapes read into the Graph IR, with the
backward templates its planning needs (learned from MXNet where the cache lacks them).

Arguments, inputs and auxiliary states are told apart from how the symbol is
bound (list_arguments / list_auxiliary_states and which inputs were given
shapes or a grad_req), never from name suffixes.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from mxmirror.adapter.children import error_line
from mxmirror.adapter.learn import TemplateStore, learn
from mxmirror.adapter.symbol import check_supported, load_mxnet, load_symbol, symbol_json
from mxmirror.errors import PlanError
from mxmirror.ir import arity, backward, ops
from mxmirror.ir.graph import (
    AUX,
    DTYPE_BYTES,
    INPUT,
    OP,
    PARAM,
    Graph,
    Node,
    module_default,
    normalize_grad_req,
)
from mxmirror.ir.symbol_json import MIRROR_KEY
from mxmirror.ir.templates import TemplateTable
from mxmirror.segments.subgraph import added_specs

_store: TemplateStore | None = None


def store() -> TemplateStore:
    """The templates learned so far (this MXNet version's disk cache)."""
    global _store
    if _store is None:
        _store = TemplateStore(load_mxnet().__version__)
    return _store


def parse_shapes(sym, shapes: dict[str, Any], arguments: list[str] | None = None
                 ) -> dict[str, tuple]:
    """The given input shapes as tuples of ints; PlanError for an unknown input or a bad
    shape. `arguments`: sym.list_arguments(), where the caller has it."""
    inputs = set(arguments or sym.list_arguments()) | set(sym.list_auxiliary_states())
    out = {}
    for name, shape in shapes.items():
        if name not in inputs:
            raise PlanError(f"--shape {name}: the symbol has no input {name!r}; "
                            f"{inputs_text(sym)}")
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


def inputs_text(sym) -> str:
    """The symbol's inputs as an error names them: those a user gives shapes to (data,
    labels, states: variables outside every parameter slot of the ops reading them) by
    name, then how many parameters and auxiliary states there are."""
    mx = load_mxnet()
    nodes = json.loads(symbol_json(sym))["nodes"]
    slots: dict[str, str] = {}  # op and attributes -> its input slot names
    params = set()
    for node in nodes:
        if node["op"] == "null":
            continue
        attrs = {k: v for k, v in (node.get("attrs") or {}).items() if not k.startswith("__")}
        key = json.dumps([node["op"], attrs], sort_keys=True)
        if key not in slots:
            try:
                creator = getattr(mx.sym, node["op"], None) or getattr(
                    mx.sym._internal, node["op"])
                slots[key] = [a[2:] for a in creator(name="n", **attrs).list_arguments()]
            except Exception:  # an op MXNet cannot make alone (Custom): no slot names
                slots[key] = []
        for k, (src, _, *_) in enumerate(node["inputs"]):
            if nodes[src]["op"] == "null" and k < len(slots[key]) \
                    and slots[key][k] in ops.PARAMETER_SLOTS:
                params.add(nodes[src]["name"])
    given = [a for a in sym.list_arguments() if a not in params]
    aux = sym.list_auxiliary_states()
    return (f"its inputs without a gradient (data, labels, states) are "
            f"{', '.join(given[:12]) or 'none'}{' ...' * (len(given) > 12)}; besides them it "
            f"has {len(sym.list_arguments()) - len(given)} parameters and {len(aux)} "
            f"auxiliary states")


def load_graph(source: Any, shapes: dict[str, Any], type_dict: dict[str, str] | None = None,
               grad_req: Any = None, strip: bool = False, text: str | None = None) -> Graph:
    """Read a Symbol (object, JSON text or file) with input shapes into the Graph IR.
    `strip`: leave out the mirror attributes a symbol may carry (the unplanned graph);
    `text`: the symbol's own tojson(), where the caller has it."""
    load_mxnet()
    sym = load_symbol(source)
    shapes = parse_shapes(sym, shapes)
    type_dict = {name: _dtype_name(dt) for name, dt in (type_dict or {}).items()}
    inputs = set(sym.list_arguments()) | set(sym.list_auxiliary_states())
    for name, dt in type_dict.items():
        if name not in inputs:
            raise PlanError(f"dtype given for {name!r}, but the symbol has no input "
                            f"{name!r}; {inputs_text(sym)}")
        if dt not in _DTYPES:
            raise PlanError(f"unknown dtype {dt!r} for {name!r}; use one of "
                            f"{', '.join(sorted(_DTYPES))}")
    req = normalize_grad_req(sym.list_arguments(), grad_req, module_default(shapes))
    js = json.loads(text or symbol_json(sym))
    check_supported(js)
    internals = sym.get_internals()
    ijs = json.loads(symbol_json(internals))
    if [n["name"] for n in ijs["nodes"]] != [n["name"] for n in js["nodes"]]:
        raise PlanError("internal error: node order of the symbol and its internals differ")
    try:
        _, out_shapes, _ = internals.infer_shape_partial(**shapes)
    except Exception as exc:
        raise PlanError(f"shape inference failed: {error_line(exc)}") from None
    # as simple_bind: the given dtypes only, float32 for the inputs when none is given
    types = dict(type_dict) if type_dict else {k: "float32" for k in shapes}
    try:
        _, out_types, _ = internals.infer_type_partial(**types)
    except Exception as exc:
        raise PlanError(f"dtype inference failed (type_dict / --dtype): "
                        f"{error_line(exc)}") from None
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
        if strip:
            attrs.pop(MIRROR_KEY, None)
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
    graph = Graph(nodes=nodes, heads=[(h[0], h[1]) for h in js["heads"]])
    graph.templates = learn_templates(graph)
    backward.attach(graph)
    for n in graph.op_nodes:
        n.flops = ops.flops(n.op, n.attrs, [graph.nodes[s].shapes[k] for s, k in n.inputs],
                            n.shapes)
    return graph


# the dtypes a user may give (graph.DTYPE_BYTES sizes them all)
_DTYPES = set(DTYPE_BYTES) - {"int16", "uint16", "uint32", "uint64"}


def _dtype_name(t: Any) -> str:
    try:
        return _DTYPE_NAMES[t]
    except (KeyError, TypeError):  # not seen yet, or not hashable
        pass
    import numpy as np

    try:
        name = np.dtype(t).name
    except TypeError:
        name = str(getattr(t, "__name__", t))
    try:
        _DTYPE_NAMES[t] = name
    except TypeError:
        pass
    return name


_DTYPE_NAMES: dict[Any, str] = {}  # what a dtype given as a type or name is called


def learn_templates(graph: Graph) -> TemplateTable:
    """The templates of every op node of `graph` and of every node the segment model may
    add to its sub-graphs (``segments.subgraph.added_specs``), learned from MXNet where the
    store lacks them (the second round learns literal templates at each node's shapes); a
    variadic op at a new arity (a further bucket's Concat) is rewritten from the store's
    (ir/arity.py), not learned."""
    st = store()
    specs = [backward.spec(graph, n) for n in graph.op_nodes] + added_specs(graph)
    st.load({sp["op"] for sp in specs})
    for _ in range(2):
        pending = backward.missing(st.data, specs)
        derived = arity.derive(st.data, pending)
        if derived:
            st.put_many(derived)
            pending = {k: sp for k, sp in pending.items() if k not in derived}
        if not pending:
            break
        new = {}
        for (key, sp), tpl in zip(pending.items(), learn(list(pending.values()))):
            new[key] = tpl
            if tpl.literal:
                new[backward.key(sp, literal=True)] = tpl
        st.put_many(new)
    table: TemplateTable = {}
    for sp in specs:
        k = backward.key(sp)
        tpl = table[k] = st.data[k]
        if tpl.literal:
            k = backward.key(sp, literal=True)
            table[k] = st.data[k]
    return table
