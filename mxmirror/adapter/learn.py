"""Learn backward templates from MXNet itself.

For each op signature we bind a one-op graph in a child process with
``MXNET_MEM_PLAN_VERBOSE_LOGGING=1`` (read once per process, so it cannot be
switched on inside the user's process) and read back the training graph MXNet
built: the backward nodes, their inputs and control dependencies, the number
of outputs (hidden ones too) and their shapes. That is the ground truth the
simulator reuses, so we never guess an op's backward needs.

Templates are cached on disk per MXNet version (``~/.cache/mxmirror``;
``MXMIRROR_CACHE=DIR`` moves it, ``MXMIRROR_CACHE=off`` turns every disk cache off).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

from mxmirror.adapter.children import (
    LEARNER,
    ChildFailed,
    error_line,
    finish,
    last_json,
    one_more_done,
    run_child,
)
from mxmirror.adapter.symbol import mxnet_version
from mxmirror.errors import PlanError
from mxmirror.ir.graph import INPUT, Graph, Node
from mxmirror.ir.symbol_json import to_json
from mxmirror.ir.templates import Template, TemplateNode, hidden_ref, shape_ref
from mxmirror.planning.cache import TEMPLATES, templates_dir, write_atomic


def learned_by() -> dict[str, str]:
    """What decides the templates learned here: the MXNet version and the MKL-DNN switch
    (a plan made with them is only reused under the same)."""
    return {"mxnet": mxnet_version(),
            "mkldnn": os.environ.get("MXNET_MKLDNN_ENABLED", "")}


class TemplateStore:
    """In-memory + on-disk cache of learned templates, keyed by signature; on disk one file
    per op, read when a graph has that op (``load``): a process reads the templates of its
    own ops, not every one learned on the machine (472 of them, 0.9 MB of JSON, parsed into
    a planning process cost it 8 MB of resident memory, measured on MobileNetV2)."""

    def __init__(self, mxnet_version: str, path: Path | None = None) -> None:
        self.dir = (path / TEMPLATES.format(mxnet_version) if path is not None
                    else templates_dir(mxnet_version))
        self.data: dict[str, Template] = {}
        self._loaded: set[str] = set()

    def _file(self, op: str) -> Path | None:
        return None if self.dir is None else self.dir / (re.sub(r"[^\w.-]", "_", op) + ".json")

    def _read(self, op: str) -> dict[str, Template]:
        file = self._file(op)
        if file is None or not file.exists():
            return {}
        try:
            raw = json.loads(file.read_text())
            return {k: Template.from_json(v) for k, v in raw.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}  # a corrupt cache is only a cache: relearn

    def load(self, ops: set[str]) -> None:
        """Read the templates of these ops kept on disk (each op once a process)."""
        for op in sorted(ops - self._loaded):
            for key, tpl in self._read(op).items():
                self.data.setdefault(key, tpl)
            self._loaded.add(op)

    def get(self, key: str) -> Template | None:
        return self.data.get(key)

    def put_many(self, items: dict[str, Template]) -> None:
        """Keep `items`, and on disk merged with what other processes wrote meanwhile."""
        self.data.update(items)
        if self.dir is None:
            return
        by_op: dict[str, dict[str, Template]] = {tpl.op: {} for tpl in items.values()}
        for key, tpl in self.data.items():
            if tpl.op in by_op:
                by_op[tpl.op][key] = tpl
        for op, mine in by_op.items():
            file = self._file(op)
            merged = {**self._read(op), **mine}
            try:
                write_atomic(file, json.dumps({k: v.to_json() for k, v in merged.items()}))
            except OSError:
                pass  # read-only home: keep the in-memory cache


def learn(specs: list[dict]) -> list[Template]:
    """Learn templates for op specs in one child process.

    A spec: {"op", "attrs", "shapes": [[...] per input], "dtypes": [...], "aux": [positions]}.
    """
    if not specs:
        return []
    if any(not spec["shapes"] for spec in specs):  # source ops (zeros, ones): no backward
        sources = {i: _source_template(spec) for i, spec in enumerate(specs)
                   if not spec["shapes"]}
        rest = learn([spec for spec in specs if spec["shapes"]])
        it = iter(rest)
        return [sources[i] if i in sources else next(it) for i in range(len(specs))]
    what = ", ".join(sorted({s["op"] for s in specs}))
    try:
        out = last_json(run_child(LEARNER[0], stdin=json.dumps(specs),
                                  what="learning backward templates from MXNet",
                                  total=len(specs), unit="ops", **LEARNER[1]))
    except ChildFailed as exc:
        raise PlanError(f"could not learn the backward structure of {what} from MXNet (child "
                        f"process exit code {exc.returncode}): {exc.tail}") from None
    except ValueError:
        out = None
    if not isinstance(out, list) or len(out) != len(specs):
        raise PlanError(f"could not learn the backward structure of {what} from MXNet: its "
                        f"child process gave no answer")
    result = []
    for spec, item in zip(specs, out):
        if "error" in item:
            hint = ""
            if spec["op"] == "Custom":
                hint = ("; custom operators registered in your process (mx.operator.register) "
                        "cannot be learned in mxmirror's child process")
            raise PlanError(f"MXNet cannot bind operator {spec['op']} alone for training, "
                            f"so mxmirror cannot learn its backward: {item['error']}{hint}")
        result.append(Template.from_json(item))
    return result


def _source_template(spec: dict) -> Template:
    """An op with no inputs has no backward: nothing to learn."""
    n = spec["num_visible"]
    return Template(op=spec["op"], num_outputs=n, num_visible=n, nodes=[], input_grads=[],
                    fwd_out_shapes=[("out", k) for k in range(n)])


# ----------------------------------------------------------------- child side

_NODE_RE = re.compile(r"node (\d+) (\S+)$")
_IO_RE = re.compile(r"(input|output) (\d+): \[([0-9,]*)\]")


def _parse_memlog(text: str) -> list[dict]:
    """Nodes of MXNet's LogMemoryPlan: op, input entry ids, (entry id, shape) outputs."""
    nodes: list[dict] = []
    for line in text.splitlines():
        m = _NODE_RE.search(line)
        if m and "exec_utils" in line:
            nodes.append({"op": m.group(2), "inputs": [], "outputs": []})
            continue
        m = _IO_RE.search(line)
        if m and nodes and "exec_utils" in line:
            shape = tuple(int(x) for x in m.group(3).split(",") if x)
            if m.group(1) == "input":
                nodes[-1]["inputs"].append(int(m.group(2)))
            else:
                nodes[-1]["outputs"].append((int(m.group(2)), shape))
    return nodes


def _parse_debug_str(text: str) -> tuple[list[dict], list[tuple[str, int]]]:
    """Node names/control deps and the graph outputs from Executor.debug_str()."""
    nodes: list[dict] = []
    outputs: list[tuple[str, int]] = []
    section = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("Variable:"):
            nodes.append({"name": s[len("Variable:"):], "op": "var", "cdeps": []})
        elif s.startswith("Op:"):
            op, name = s[3:].split(", Name=", 1)
            nodes.append({"name": name, "op": op, "cdeps": []})
            section = None
        elif s in ("Inputs:", "Attrs:", "Control deps:", "Symbol Outputs:"):
            section = s
        elif section == "Control deps:" and s.startswith("cdep["):
            nodes[-1]["cdeps"].append(s.split("=", 1)[1])
        elif section == "Symbol Outputs:" and s.startswith("output["):
            ref = s.split("=", 1)[1]
            name, idx = ref.rsplit("(", 1)
            outputs.append((name, int(idx.rstrip(")"))))
        elif s.startswith("Total"):
            section = None
    return nodes, outputs


def _template_from_bind(spec: dict, memlog: list[dict], dbg_nodes: list[dict],
                        dbg_outputs: list[tuple[str, int]], num_heads: int,
                        grad_inputs: list[int]) -> Template:
    if len(memlog) != len(dbg_nodes):
        raise RuntimeError("memory log and debug_str disagree on the node count")
    # entry ids in IndexedGraph order: each node's outputs are consecutive
    entry_of: dict[tuple[int, int], int] = {}
    eid = 0
    for i, m in enumerate(memlog):
        n_out = 1 if m["op"] == "var" else len(m["outputs"])
        for k in range(n_out):
            entry_of[(i, k)] = eid
            eid += 1
    ref_of: dict[int, tuple] = {}
    names = [d["name"] for d in dbg_nodes]
    fwd = names.index("fwd")
    in_shapes = [tuple(s) for s in spec["shapes"]]
    for i, d in enumerate(dbg_nodes):
        if d["op"] == "var" and re.fullmatch(r"in\d+", d["name"]):
            ref_of[entry_of[(i, 0)]] = ("in", int(d["name"][2:]))
    out_shapes = [shape for _, shape in memlog[fwd]["outputs"]]
    for k, (e, _) in enumerate(memlog[fwd]["outputs"]):
        ref_of[e] = ("out", k)
    bwd_index: dict[int, int] = {}
    tnodes: list[TemplateNode] = []
    skipped_copy: dict[int, tuple] = {}
    for i, (m, d) in enumerate(zip(memlog, dbg_nodes)):
        if i <= fwd or d["op"] == "var":
            continue
        if d["op"] == "_identity_with_attr_like_rhs" and d["name"].startswith("_head_grad_"):
            k = ref_of[m["inputs"][1]][1]
            ref_of[m["outputs"][0][0]] = ("ograd", k)
            continue
        if d["op"] == "_copy" and re.search(r"_\d+_copy$", d["name"]):
            skipped_copy[m["outputs"][0][0]] = ref_of[m["inputs"][0]]
            continue
        t = len(tnodes)
        bwd_index[i] = t
        outs = []
        for k, (e, shape) in enumerate(m["outputs"]):
            ref_of[e] = ("node", t, k)
            outs.append(shape_ref(shape, in_shapes, out_shapes, prefer_in=k))
        cdeps = [names.index(c) if c in names else -1 for c in d["cdeps"]]
        tnodes.append(TemplateNode(
            op=d["op"], inputs=[ref_of[e] for e in m["inputs"]], out_shapes=outs,
            control_fwd=fwd in cdeps,
            control_nodes=[bwd_index[c] for c in cdeps if c in bwd_index]))
    # graph outputs after the heads are the input gradients, in argument order
    last_of = {n: i for i, n in enumerate(names)}
    input_grads: list[tuple | None] = [None] * len(in_shapes)
    for j, (name, idx) in zip(grad_inputs, dbg_outputs[num_heads:]):
        e = entry_of[(last_of[name], idx)]
        input_grads[j] = skipped_copy.get(e, ref_of.get(e))
    literal = any(s[0] == "lit" for n in tnodes for s in n.out_shapes)
    hidden = [hidden_ref(s, k, in_shapes, out_shapes) for k, s in enumerate(out_shapes)]
    literal = literal or any(s[0] == "lit" for s in hidden[spec["num_visible"]:])
    return Template(op=spec["op"], num_outputs=len(out_shapes),
                    num_visible=spec["num_visible"], nodes=tnodes, input_grads=input_grads,
                    literal=literal, fwd_out_shapes=hidden)


def _child_main() -> None:
    import mxnet as mx

    text = sys.stdin.read()
    if not text.strip():  # started early and never asked
        return
    specs = json.loads(text)
    log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    results = []
    try:
        for spec in specs:
            try:
                results.append(_learn_one(mx, spec, log.name))
            except Exception as exc:  # report, the parent turns it into a PlanError
                results.append({"error": error_line(exc) or type(exc).__name__})
            one_more_done()
    finally:
        os.dup2(saved, 2)
        os.unlink(log.name)
    finish(json.dumps(results))


def _bind_once(mx, spec: dict, heads: list[int], logname: str):
    n = len(spec["shapes"])
    nodes = [Node(j, f"in{j}", None, kind=INPUT) for j in range(n)]
    nodes.append(Node(n, "fwd", spec["op"], attrs=spec["attrs"],
                      inputs=[(j, 0) for j in range(n)]))
    sym = mx.sym.load_json(to_json(Graph(nodes, [(n, k) for k in heads])))
    args = sym.list_arguments()
    shapes = {f"in{j}": tuple(s) for j, s in enumerate(spec["shapes"])}
    types = {f"in{j}": spec["dtypes"][j] for j in range(n)}
    grad_req = {a: ("write" if types.get(a, "float32").startswith(("float", "bfloat"))
                    else "null") for a in args}
    arg_shapes = {k: v for k, v in shapes.items() if k in args}
    aux_names = sym.list_auxiliary_states()
    with open(logname) as f:
        start = len(f.read())
    ex = sym.simple_bind(mx.cpu(), grad_req=grad_req,
                         type_dict={k: v for k, v in types.items() if k in args},
                         **arg_shapes)
    dbg = ex.debug_str()
    with open(logname) as f:
        text = f.read()[start:]
    grad_inputs = [int(a[2:]) for a in args if grad_req[a] == "write"]
    del ex
    return _parse_memlog(text), dbg, grad_inputs, aux_names


def _learn_one(mx, spec: dict, logname: str) -> dict:
    heads = list(range(spec["num_visible"]))
    memlog, dbg, grad_inputs, _ = _bind_once(mx, spec, heads, logname)
    fwd_i = next(i for i, m in enumerate(memlog) if m["op"] == spec["op"]
                 or (m["op"] != "var" and i >= len(spec["shapes"])))
    n_out = len(memlog[fwd_i]["outputs"])
    if n_out > len(heads):  # hidden outputs: bind again with every output as a head
        heads = list(range(n_out))
        memlog, dbg, grad_inputs, _ = _bind_once(mx, spec, heads, logname)
    dbg_nodes, dbg_outputs = _parse_debug_str(dbg)
    tpl = _template_from_bind(spec, memlog, dbg_nodes, dbg_outputs, len(heads), grad_inputs)
    return tpl.to_json()


if __name__ == "__main__":
    _child_main()
