"""The package's shape: every module in one stage of the data path, imports only from its own
stage or earlier ones (module-level and lazy imports alike, so no cycle), MXNet reached only
at the edges, and the planning core planning a graph with MXNet unimportable."""

from __future__ import annotations

import ast
import gc
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "mxmirror"
# the stages in the order data flows (docs/how_it_works.md draws them)
STAGES = (
    ("base", ("mxmirror.errors", "mxmirror.log", "mxmirror.progress")),
    ("ir", ("mxmirror.ir",)),
    ("sim", ("mxmirror.sim",)),
    ("segments", ("mxmirror.segments",)),
    ("planning", ("mxmirror.planning",)),
    ("adapter", ("mxmirror.adapter",)),
    ("runtime", ("mxmirror.runtime",)),
    ("api", ("mxmirror.api",)),
    ("tools", ("mxmirror.tools",)),
    ("gluon", ("mxmirror.gluon",)),
    ("frontends", ("mxmirror.frontends",)),
    ("package", ("mxmirror", "mxmirror.__main__")),
)
CORE = ("base", "ir", "sim", "segments", "planning")  # plans a graph it is given, no MXNet
MXNET_STAGES = ("adapter", "runtime", "gluon", "frontends")  # where MXNet may be reached
MAX_LINES = 500
MAX_TOP_MODULES = 8


def _parsed(path: Path) -> ast.AST:
    """The module's syntax tree, parsed with the collector paused: CPython 3.11's ast
    misreads its recursion depth when a collection runs inside ast.parse (python/cpython
    #106905), and the MXNet tests before this one leave cycles enough for that to happen
    (SystemError: AST constructor recursion depth mismatch, measured)."""
    gc.disable()
    try:
        return ast.parse(path.read_text())
    finally:
        gc.enable()


def _modules(pkg: Path = PKG) -> dict[str, Path]:
    out = {}
    for path in pkg.rglob("*.py"):
        parts = path.relative_to(pkg.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of the package this module imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(_parsed(path)):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(node.level - 1, 0)):
                base = base.rsplit(".", 1)[0]
            mod = node.module or ""
            root = (f"{base}.{mod}" if mod else base) if node.level else mod
            # `from . import x` imports module x (the package itself is already loading)
            targets = ([root] if mod else []) + [f"{root}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rsplit(".", 1)[0] if "." in t else ""
            if t and t != name:
                found.add(t)
    return found


def _graph(pkg: Path = PKG) -> dict[str, set[str]]:
    mods = _modules(pkg)
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


def _stage(module: str) -> int | None:
    """Index of the module's stage in STAGES (the longest prefix that names it)."""
    best, length = None, -1
    for i, (_, prefixes) in enumerate(STAGES):
        for p in prefixes:
            inside = p != "mxmirror" and module.startswith(p + ".")  # a folder's modules
            if (module == p or inside) and len(p) > length:
                best, length = i, len(p)
    return best


def _violations(graph: dict[str, set[str]]) -> list[str]:
    """Modules in no stage, and imports of a later stage, reached transitively: a module of a
    stage may reach only modules of its own stage or earlier ones."""
    out = [f"{m} belongs to no stage" for m in sorted(graph) if _stage(m) is None]
    for m in sorted(graph):
        mine = _stage(m)
        if mine is None:
            continue
        seen, todo = set(), list(graph[m])
        while todo:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            todo.extend(graph.get(t, ()))
            theirs = _stage(t)
            if theirs is not None and theirs > mine:
                out.append(f"{m} ({STAGES[mine][0]}) reaches {t} ({STAGES[theirs][0]})")
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def _reaches_mxnet(path: Path) -> list[str]:
    """Where a module reaches MXNet itself: ``import mxnet``, the loader, a child runner."""
    found = []
    for n in ast.walk(_parsed(path)):
        if isinstance(n, ast.Import) and any(a.name.split(".")[0] == "mxnet" for a in n.names):
            found.append(f"line {n.lineno}: import mxnet")
        elif isinstance(n, ast.ImportFrom) and not n.level and \
                (n.module or "").split(".")[0] == "mxnet":
            found.append(f"line {n.lineno}: from mxnet")
        elif isinstance(n, ast.Name) and n.id in ("load_mxnet", "run_child"):
            found.append(f"line {n.lineno}: {n.id}")
    return found


def test_every_module_is_in_a_stage_and_reaches_only_earlier_stages() -> None:
    graph = _graph()
    assert "mxmirror.planning.strategies.search" in graph and graph["mxmirror.api"]
    assert _violations(graph) == []


def test_the_package_has_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


def test_the_checks_find_what_they_look_for() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    # an ir module reaching the runtime through a planning module, and a module in no stage
    graph = {"mxmirror.ir.x": {"mxmirror.planning.y"}, "mxmirror.planning.y":
             {"mxmirror.runtime.z"}, "mxmirror.runtime.z": set(), "mxmirror.stray": set()}
    found = _violations(graph)
    assert "mxmirror.stray belongs to no stage" in found
    assert "mxmirror.ir.x (ir) reaches mxmirror.runtime.z (runtime)" in found


def test_mxnet_is_reached_only_at_the_edges() -> None:
    allowed = {i for i, (name, _) in enumerate(STAGES) if name in MXNET_STAGES}
    where = {name: _reaches_mxnet(path) for name, path in _modules().items()
             if _stage(name) not in allowed}
    assert {name: lines for name, lines in where.items() if lines} == {}
    assert _reaches_mxnet(PKG / "adapter" / "symbol.py"), "the check finds the loader"


def test_rooms_are_small_and_the_top_is_short() -> None:
    long = {name: n for name, path in _modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}
    assert len(list(PKG.glob("*.py"))) <= MAX_TOP_MODULES


CORE_PLANS_WITHOUT_MXNET = r"""
import sys
sys.modules["mxnet"] = None  # any import of mxnet now raises ImportError
import json
from pathlib import Path
from mxmirror.ir import graph_json
from mxmirror.planning.analysis import Analysis
from mxmirror.planning.decide import decide
from mxmirror.planning.registry import resolve

stored = json.loads(Path(sys.argv[1]).read_text())
graph = graph_json.load(stored["graph"])
analysis = Analysis(graph)
out = {}
for policy, budget, never_worse in stored["policies"]:
    name, budget_bytes = resolve(policy.split()[-1], budget)
    d = decide(analysis, name, budget_bytes, never_worse)
    out[policy] = [d.choice.score.planned_bytes, sorted(d.choice.score.recomputed_ids),
                   d.choice.segments is not None]
assert "mxnet" not in [m for m in sys.modules if sys.modules[m] is not None]
print(json.dumps(out))
"""


@pytest.mark.parametrize("network", ["cifar_resnet", "lstm"])
def test_the_planning_core_plans_a_stored_graph_with_mxnet_unimportable(tmp_path,
                                                                        network) -> None:
    """A graph read by the MXNet side is stored as JSON with its templates; a child with
    mxnet blocked in sys.modules plans it by every policy, and gets the plans (bytes,
    recomputed nodes, execution kind) the MXNet-side process gets."""
    import json

    from mxmirror.api import prepare
    from mxmirror.ir import graph_json
    from symbols.lstm import input_shapes, paper_lstm
    from symbols.resnet import resnet

    if network == "lstm":
        sym, shapes = paper_lstm(6, num_layers=2, num_hidden=32, num_embed=32), \
            input_shapes(6, 4, num_layers=2, num_hidden=32)
    else:
        sym = resnet([3, 3, 3], bottleneck=False, num_classes=10, image_shape=(3, 16, 16))
        shapes = {"data": (4, 3, 16, 16), "softmax_label": (4,)}
    prep = prepare(sym, **shapes)
    sqrt = prep.plan("sqrt").planned_bytes
    least = prep.own_plan("recursive").planned_bytes
    # the segmented policies by their own plans too (small graphs: one recomputation wins)
    policies = [("none", None, True), ("cheap", None, True), ("sqrt", None, True),
                ("search", None, True), ("budget", sqrt, True), ("recursive", None, True),
                ("own recursive", None, False), ("own multilevel", least * 3 // 2, False)]
    expected = {}
    for policy, budget, never_worse in policies:
        p = (prep.plan if never_worse else prep.own_plan)(policy.split()[-1], budget)
        expected[policy] = [p.planned_bytes, sorted(p.recomputed_ids),
                            p.execution.kind == "segmented"]
    stored = tmp_path / "graph.json"
    stored.write_text(json.dumps({"graph": graph_json.dump(prep.analysis.graph),
                                  "policies": policies}))
    proc = subprocess.run([sys.executable, "-c", CORE_PLANS_WITHOUT_MXNET, str(stored)],
                          capture_output=True, text=True, cwd=PKG.parent, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == expected
    assert any(kind for _, _, kind in got.values()), "a segmented plan was made too"
