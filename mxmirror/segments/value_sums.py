"""The gradient of a value read in several segments, summed as MXNet sums it.

The rule, for every gradient sum a segmented plan splits across segments (a value's here,
a weight's in ``grad_sums``): the plan must compute MXNet's own expression of that sum,
operand for operand. MXNet's gradient pass (src/nnvm/gradient.cc, tag 1.9.1, as
``sim.gradient_pass`` states it) lists a value's terms in one order (its head gradient
first, then its readers in reverse forward order, inputs in order), drops zero ops where
others remain, and ``AggregateGradient`` sums them: one term as is, 2-7 one ElementWiseSum,
whose CPU kernel adds 2-4 inputs right to left (``a + (b + (c + d))``) and 5-7 left to
right, 8 or more a left-to-right chain of ``_grad_add``. IEEE addition is commutative but
not associative: any other grouping of the same terms may round otherwise.

The segmented executor sums the gradient of a value made in segment p and read in later
segments in three places: the template of each reader segment r sums the terms of r's own
readers (r's *block*: its gradient of the value's slot); the runner combines the blocks
as the backwards produce them (the last segment first); and p's template sums what the
runner delivers (its gradient input, ``ograd``) with the terms of p's own readers. Each
template sums with MXNet's gradient pass over its own graph, in its own order, which is
modelled here from that graph.

``value_sums`` finds, for every value whose terms cross a cut and whose sum has three terms
or more (two terms are one addition, whichever way), the combination of blocks that makes
MXNet's expression: the sub-expression of MXNet's sum that stands where p's template adds
the gradient input, made of whole blocks. Adding the blocks one by one as they come (the
runner's default) is that combination where MXNet's sum is a left fold over them (5 terms
or more, one term per block); where it is not, the runner holds blocks apart and adds them
as MXNet's sum groups them (a ``Program``): a value read by three segments, as an unrolled
LSTM layer's output is by the next step, the next layer and a ResidualCell's sum, is
``x + (y + z)`` (one ElementWiseSum of three), not ``(x + y) + z``. Where no combination of
whole blocks is MXNet's sum (a block's terms are no sub-sum of it, or p's own terms are
not where MXNet adds them), the plan cannot compute MXNet's gradient: the value is
``inexact``, and the planner does not use the plan (``Segments.exact``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from mxmirror.ir import backward
from mxmirror.ir.graph import Entry, Graph
from mxmirror.segments.grad_sums import _plus, _sum
from mxmirror.sim import gradient_pass, training_graph

OGRAD = "ograd"  # the leaf of a producer's sum that the runner delivers

Expr = Any  # a leaf (an origin, OGRAD) or ("+", a, b)


@dataclass(frozen=True)
class Program:
    """How the runner combines one value's blocks: a binary tree whose leaves are reader
    segments. Each block, as its backward produces it, is added to the partial sum of its
    sibling where that is complete (climbing while it can), else held; the root is the
    gradient input of the producer. Nodes are numbered; the root has no parent."""

    leaf: dict[int, int]  # reader segment -> its leaf node (absent: a zero block, unused)
    parent: dict[int, int]
    sibling: dict[int, int]
    root: int  # -1: no leaf (every block is zero ops): the gradient input is -0
    held: dict[int, int]  # reader segment -> partial sums held after its backward

    @classmethod
    def of(cls, tree: Expr, order: list[int]) -> Program:
        """The program of `tree` (leaves ("seg", r), nodes ("+", a, b)); `order`: the
        reader segments in the order their backwards run."""
        leaf, parent, sibling = {}, {}, {}
        count = [0]

        def walk(t: Expr) -> int:
            node = count[0]
            count[0] += 1
            if t[0] == "seg":
                leaf[t[1]] = node
            else:
                a, b = walk(t[1]), walk(t[2])
                parent[a] = parent[b] = node
                sibling[a], sibling[b] = b, a
            return node

        root = walk(tree)
        held, parts = {}, set()
        for r in order:
            node = leaf.get(r)
            if node is not None:
                while node != root and sibling[node] in parts:
                    parts.discard(sibling[node])
                    node = parent[node]
                parts.add(node)
            held[r] = len(parts)
        return cls(leaf, parent, sibling, root, held)


@dataclass
class ValueSums:
    """What the segmented executor needs to sum values' gradients as MXNet does."""

    programs: dict[Entry, Program] = field(default_factory=dict)  # not one by one
    inexact: dict[Entry, str] = field(default_factory=dict)  # value -> why


def value_sums(sg: Any) -> ValueSums:
    """Per value whose gradient sum a cut splits: the runner's Program where adding the
    blocks one by one is not MXNet's sum, or why no combination is."""
    graph = sg.graph
    out = ValueSums()
    terms = _parent_terms(graph)
    seg_of = {nid: seg.index for seg in sg.segments for nid in seg.nodes}
    read_in: dict[Entry, list[int]] = {}  # value -> the later segments reading it, last first
    for seg in reversed(sg.segments):
        for e in seg.inputs:
            read_in.setdefault(e, []).append(seg.index)
    cap = gradient_pass.inplace_sum_cap()
    origins: dict[int, dict] = {}  # segment index -> _origins
    for e, ts in terms.items():
        if graph.nodes[e[0]].is_variable or len(ts) < 2:
            continue
        if len(ts) == 2 and not any(zero for _, zero in ts):
            continue  # one addition, in any order and grouping
        if all(zero for _, zero in ts):
            continue  # zeros, however summed
        p = seg_of[e[0]]
        readers = read_in.get(e, [])
        whole = _expr([(o, z) for o, z in ts], cap)
        if not readers and len([1 for _, z in ts if not z]) < 3:
            continue
        why = _check(sg, e, p, readers, whole, cap, out, origins)
        if why:
            out.inexact[e] = why
    return out


def _check(sg: Any, e: Entry, p: int, readers: list[int], whole: Expr, cap: int,
           out: ValueSums, origins: dict) -> str:
    """Fill `out` for value e (made in segment p, read in segments `readers`, last first),
    whose MXNet sum is `whole`; the reason it cannot be made, or ''."""
    mine = _producer_expr(sg, e, p, cap, origins)
    if mine is None:
        return "its producer's template sums terms of another origin"
    if not _contains(mine, OGRAD):
        return "" if mine == whole else "its producer's template orders its terms otherwise"
    blocks: dict[Expr, int] = {}
    for r in readers:
        b = _block_expr(sg, e, r, cap, origins)
        if b is None:
            return f"segment {r}'s template sums terms of another origin"
        if b != "zero":
            blocks[b] = r
    if not blocks:  # only zero ops outside: the gradient input is -0, which adds nothing
        if _without_zero(mine) != whole:
            return "its producer's template sums its own terms otherwise"
        out.programs[e] = Program({}, {}, {}, -1, dict.fromkeys(readers, 0))
        return ""
    wanted = _solve(whole, mine)
    if wanted is None:
        return ("its producer's own terms are not where MXNet's sum adds them "
                "(the sum of the other segments' terms cannot stand in one place)")
    tree = _cover(wanted, blocks)
    if tree is None:
        return "a segment's own sum of its terms is no part of MXNet's sum"
    default = None
    for r in readers:  # the runner's default: every block added as it comes
        default = ("seg", r) if default is None else _plus(default, ("seg", r))
    if tree != default:
        if e in sg.one_hop:
            return "its gradient goes straight to its producer"
        out.programs[e] = Program.of(tree, readers)
    return ""


def _expr(ts: list, cap: int) -> Expr:
    """AggregateGradient's expression of terms [(leaf, zero op)]: zero ops dropped where
    others remain."""
    kept = [o for o, zero in ts if not zero] or [ts[0][0]]
    return _sum(kept, cap)


def _without_zero(x: Expr) -> Expr:
    """`x` with OGRAD := -0, which IEEE addition adds exactly (x + -0 = x for every x,
    +0 and -0 included)."""
    if not _is_sum(x):
        return x
    a, b = _without_zero(x[1]), _without_zero(x[2])
    return b if a == OGRAD else a if b == OGRAD else _plus(a, b)


def _contains(x: Expr, leaf: Expr) -> bool:
    if x == leaf:
        return True
    return _is_sum(x) and (_contains(x[1], leaf) or _contains(x[2], leaf))


def _solve(whole: Expr, mine: Expr) -> Expr | None:
    """The expression R for which `mine` with OGRAD := R is `whole`, or None."""
    if mine == OGRAD:
        return whole
    if not (_is_sum(mine) and _is_sum(whole)):
        return None
    with_leaf, other = (mine[1], mine[2]) if _contains(mine[1], OGRAD) else (mine[2], mine[1])
    if whole[1] == other:
        return _solve(whole[2], with_leaf)
    if whole[2] == other:
        return _solve(whole[1], with_leaf)
    return None


def _is_sum(x: Expr) -> bool:
    return isinstance(x, tuple) and len(x) == 3 and x[0] == "+"


def _cover(x: Expr, blocks: dict[Expr, int]) -> Expr | None:
    """`x` as a tree of whole blocks (leaves ("seg", r)), or None."""
    if x in blocks:
        return ("seg", blocks[x])
    if not _is_sum(x):
        return None
    a, b = _cover(x[1], blocks), _cover(x[2], blocks)
    return None if a is None or b is None else _plus(a, b)


# ----------------------------------------------------------------- the graphs' own sums
_PARENT: dict[int, tuple[Any, dict]] = {}  # id of a graph -> (a weak reference, its terms)
_TEMPLATE: dict[str, dict] = {}  # segment structure -> its sub-graph's terms


def _parent_terms(graph: Graph) -> dict:
    """training_graph.gradient_terms of the whole graph, kept while the graph lives."""
    found = _PARENT.get(id(graph))
    if found is None or found[0]() is not graph:
        found = _PARENT[id(graph)] = (weakref.ref(graph), training_graph.gradient_terms(graph))
        weakref.finalize(graph, _PARENT.pop, id(graph), None)
    return found[1]


def _template_terms(seg: Any) -> dict:
    """training_graph.gradient_terms of a segment's sub-graph (the same for every segment
    of its structure)."""
    found = _TEMPLATE.get(seg.structure)
    if found is None:
        if len(_TEMPLATE) > 256:
            _TEMPLATE.clear()
        backward.attach(seg.graph)
        found = _TEMPLATE[seg.structure] = training_graph.gradient_terms(seg.graph)
    return found


def _origins(seg: Any, cache: dict) -> dict:
    """A sub-graph origin -> the parent's: the segment's nodes are the sub-graph's first
    op nodes, in order; a flat Reshape read by the ``dot`` of a gradient input is OGRAD
    (a boundary value's) or ("head", j) (graph head j's); the hint of a template head that
    is a graph head is that head's (kept in `cache` by segment)."""
    if seg.index in cache:
        return cache[seg.index]
    sub = seg.graph
    ops_ = [n.id for n in sub.nodes if not n.is_variable]
    out: dict = {}
    for k, nid in enumerate(seg.nodes):
        out[ops_[k]] = nid
    slot = dict(seg.slots)
    reshape: dict[int, Expr] = {}
    for nid in ops_[len(seg.nodes):]:
        nd = sub.nodes[nid]
        if nd.op == "dot":
            (flat, _), (g, _) = nd.inputs
            key = slot.get(sub.nodes[g].name)
            if key is not None and key[0] == "ograd":
                reshape[flat] = OGRAD
            elif key is not None and key[0] == "hgrad":
                reshape[flat] = ("head", key[1])
    heads = {len(seg.outputs) + q: j for q, j in enumerate(seg.heads)}
    found = cache[seg.index] = {"node": out, "reshape": reshape, "head": heads,
                                "local": {nid: ops_[k] for k, nid in enumerate(seg.nodes)}}
    return found


def _map(ts: list, o: dict) -> list | None:
    """Sub-graph terms [(origin, zero)] in the parent's leaves (`o`: _origins); None where
    one has none."""
    out = []
    for origin, zero in ts:
        if origin[0] == "head":
            j = o["head"].get(origin[1])
            if j is None:
                if zero:
                    continue
                return None
            out.append((("head", j), zero))
        elif origin[0] in o["node"]:
            out.append(((o["node"][origin[0]], origin[1]), zero))
        elif origin[0] in o["reshape"]:
            out.append((o["reshape"][origin[0]], zero))
        elif zero:
            out.append((("zero", origin), zero))  # a BlockGrad's: dropped where others remain
        else:
            return None
    return out


def _producer_expr(sg: Any, e: Entry, p: int, cap: int, cache: dict) -> Expr | None:
    """The sum producer segment p's template makes of value e's gradient."""
    seg = sg.segments[p - 1]
    o = _origins(seg, cache)
    ts = _map(_template_terms(seg).get((o["local"][e[0]], e[1]), []), o)
    return None if not ts else _expr(ts, cap)


def _block_expr(sg: Any, e: Entry, r: int, cap: int, cache: dict) -> Expr | None:
    """The sum reader segment r's template makes of the gradient of its slot for value e:
    an expression, "zero" (zero ops only), or None (a term of unknown origin)."""
    seg = sg.segments[r - 1]
    name = next(n for n, key in seg.slots if key == ("state", e))
    var = next(n.id for n in seg.graph.nodes if n.name == name)
    ts = _map(_template_terms(seg).get((var, 0), []), _origins(seg, cache))
    if ts is None:
        return None
    if not ts or all(zero for _, zero in ts):
        return "zero"
    return _expr(ts, cap)
