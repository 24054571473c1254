"""Recursion trees over the chain of cuts, and the schedule of a tree as a list of
operations: the data that the dry run (``segments.cost``) and the segmented executor
(``runtime.segmented.runner``) both replay, so what is planned is what runs.

``tree[(s, e)] = mid``: to backpropagate segments s+1..e from the state at cut s, run
forward to ``mid`` keeping only that state, backpropagate (mid, e], drop it, then
backpropagate (s, mid]. A leaf (s, s+1) runs the segment's forward then its backward.
Binary midpoints give the paper's recursion (O(log n) stored states, O(n log n)
recompute).

A state is named by its cut: the state at cut c holds the values crossing it (cut 0 holds
none and is always there). ``Forward(i)`` runs segment i from the state at cut i - 1 and
gives the state at cut i; the state it ran from is dropped then, unless kept. The
training forward is every operation before the first ``Backward`` (``backward_start``).
"""

from __future__ import annotations

from typing import NamedTuple, Union

Tree = dict[tuple[int, int], int]


class Forward(NamedTuple):
    """Run segment `segment` forward; `keep`: hold the state it gives (at cut `segment`)
    until its ``Release``."""

    segment: int
    keep: bool = False


class Backward(NamedTuple):
    """Run segment `segment`'s backward from the kept state at the cut before it, after
    running its forward again, unless `rerun` is False (its forward is the operation
    just run: the last segment, right after the training forward)."""

    segment: int
    rerun: bool = True


class Release(NamedTuple):
    """Drop the state kept at cut `cut`."""

    cut: int


Operation = Union[Forward, Backward, Release]


# ----------------------------------------------------------------- trees
def binary_tree(m: int, lo: int = 0, hi: int | None = None) -> Tree:
    """The paper's recursion with k = 1: split every range at its midpoint."""
    hi = m if hi is None else hi
    tree: Tree = {}
    stack = [(lo, hi)]
    while stack:
        s, e = stack.pop()
        if e - s < 2:
            continue
        mid = (s + e) // 2
        tree[(s, e)] = mid
        stack += [(s, mid), (mid, e)]
    return tree


def store_all_tree(m: int) -> Tree:
    """Keep every cut (one recomputation per segment): the sqrt plan's shape."""
    return {(s, m): s + 1 for s in range(m - 1)}


def spine(tree: Tree, m: int) -> list[int]:
    """Cuts stored by the first forward pass: 0 = s0 < s1 < ... < m-1."""
    out, s = [0], 0
    while m - s > 1:
        s = tree[(s, m)]
        out.append(s)
    return out


# ----------------------------------------------------------------- operations
def operations(tree: Tree, m: int) -> list[Operation]:
    """The schedule of `tree` over `m` segments, in the order it runs: the training
    forward (every segment once, keeping the states on the tree's spine), then the
    backward, the last segment first on its live forward, each range recursing as the
    tree says."""
    sp = spine(tree, m)
    kept = set(sp)
    ops: list[Operation] = [Forward(i, i in kept) for i in range(1, m + 1)]
    ops.append(Backward(m, rerun=False))
    # ranges between consecutive spine cuts, last first; a Release is pushed as a cut
    todo: list[tuple[int, int] | int] = []
    for j in range(len(sp) - 1):
        todo += [(sp[j], sp[j + 1]), sp[j + 1]]
    while todo:
        item = todo.pop()
        if isinstance(item, int):
            ops.append(Release(item))
            continue
        s, e = item
        if e == s + 1:
            ops.append(Backward(e))
            continue
        mid = tree[(s, e)]
        ops += [Forward(i, i == mid) for i in range(s + 1, mid + 1)]
        todo += [(s, mid), mid, (mid, e)]  # (mid, e] first, then drop mid, then (s, mid]
    return ops


def runs_forward(op: Operation) -> bool:
    """Whether `op` runs its segment's forward: a ``Forward``, or a ``Backward`` that runs
    it again first."""
    return type(op) is Forward or (type(op) is Backward and op.rerun)


def forward_runs(tree: Tree, m: int) -> list[int]:
    """How many times the schedule of `tree` runs each segment's forward (segments 1..m)."""
    runs = [0] * m
    for op in operations(tree, m):
        if runs_forward(op):
            runs[op.segment - 1] += 1
    return runs


def forward_only(m: int) -> list[Operation]:
    """An inference forward: every segment once, nothing kept."""
    return [Forward(i) for i in range(1, m + 1)]


def backward_start(ops: list[Operation]) -> int:
    """Where the backward begins: the training forward is ``ops[:backward_start(ops)]``."""
    return next(j for j, op in enumerate(ops) if type(op) is Backward)
