"""The package's shape: no import cycle (module-level and lazy imports alike), and the
planner core reaches MXNet only through the adapter."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "mxmirror"
# planning only: graphs, simulation, policies, the segment model, the plan value
CORE = ("mxmirror.graph", "mxmirror.analysis", "mxmirror.memory", "mxmirror.training_graph",
        "mxmirror.segments", "mxmirror.ops", "mxmirror.templates", "mxmirror.plan",
        "mxmirror.planners")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of the package this module imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
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


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


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


def test_the_package_has_no_import_cycle() -> None:
    graph = _graph()
    assert "mxmirror.planners.search" in graph and graph["mxmirror.api"], "nothing was read"
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_planner_core_imports_mxnet_only_through_the_adapter() -> None:
    for name, path in _modules().items():
        if not name.startswith(CORE):
            continue
        tree = ast.parse(path.read_text())
        direct = [n for n in ast.walk(tree)
                  if (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "mxnet"
                                                        for a in n.names))
                  or (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0]
                      == "mxnet" and not n.level)]
        assert not direct, f"{name} imports mxnet directly"
