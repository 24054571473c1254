"""Recursion trees over the chain of cuts, and the walks that run them.

``tree[(s, e)] = mid``: to backpropagate segments s+1..e from the state at cut s, run
forward to ``mid`` keeping only that state, backpropagate (mid, e], drop it, then
backpropagate (s, mid]. A leaf (s, s+1) runs the segment's forward then its backward.
Binary midpoints give the paper's recursion (O(log n) stored states, O(n log n)
recompute).
"""

from __future__ import annotations

Tree = dict[tuple[int, int], int]


# ----------------------------------------------------------------- schedules
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


class Driver:
    """What a schedule walk does per step; subclassed by the executor and the dry run."""

    def fwd(self, i: int, state: dict, first: bool) -> dict:  # pragma: no cover
        raise NotImplementedError

    def forward_backward(self, i: int, state: dict) -> None:  # pragma: no cover
        raise NotImplementedError

    def hold(self, state: dict) -> None:
        pass

    def release(self, state: dict) -> None:
        pass


def walk_forward(drv: Driver, tree: Tree, m: int) -> dict[int, dict]:
    """First (training) forward: run every segment, keep the states on the spine."""
    keep = set(spine(tree, m))
    stored = {0: {}}
    drv.hold(stored[0])
    state: dict = {}
    for i in range(1, m + 1):
        state = drv.fwd(i, state, True)
        if i in keep:
            stored[i] = state
            drv.hold(state)
    return stored


def walk_backward(drv: Driver, tree: Tree, m: int, stored: dict[int, dict]) -> None:
    """Backward per the tree, from the states the first forward stored."""
    sp = spine(tree, m)
    drv.forward_backward(m, stored[sp[-1]])
    for j in range(len(sp) - 2, -1, -1):
        drv.release(stored.pop(sp[j + 1]))
        _walk_range(drv, tree, sp[j], sp[j + 1], stored[sp[j]])
    drv.release(stored.pop(0))


def _walk_range(drv: Driver, tree: Tree, s: int, e: int, state_s: dict) -> None:
    if e == s + 1:
        drv.forward_backward(e, state_s)
        return
    mid = tree[(s, e)]
    st = state_s
    for i in range(s + 1, mid + 1):
        st = drv.fwd(i, st, False)
    drv.hold(st)
    _walk_range(drv, tree, mid, e, st)
    drv.release(st)
    del st
    _walk_range(drv, tree, s, mid, state_s)
