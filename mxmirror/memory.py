"""MXNet 1.9.1's static memory planner, simulated (src/nnvm/plan_memory.cc).

Reference counts per entry, in-place reuse where the op declares it, and a free
list matched by size within a factor (NNVM_EXEC_MATCH_RANGE, 16). Like MXNet,
every element counts 4 bytes whatever its dtype, and arguments, argument
gradients and workspace are not counted: the result is the figure MXNet prints
as ``Total X MB allocated``.

Strategies: ``none`` (every entry its own buffer), ``inplace`` (in-place only),
``sharing`` (in-place + sharing, MXNet's default).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from . import ops
from .training_graph import TrainingGraph

STRATEGIES = ("none", "inplace", "sharing")
BAD, EXTERNAL = -1, -2
ELEMENT_BYTES = 4  # plan_memory.cc: "assume 4 bytes for now"


@dataclass
class SimResult:
    """What the simulated planner allocated."""

    total_bytes: int
    storage: list[int]  # storage id per entry (negative: not allocated here)
    block_bytes: list[int]  # final size of each storage block
    timeline: list[int] = field(default_factory=list)  # live planned bytes after each node

    @property
    def mb(self) -> float:
        return self.total_bytes / 2**20


class _Allocator:
    """MXGraphAllocator: a free list ordered by block size, searched within a range."""

    def __init__(self, match_range: int) -> None:
        self.match_range = match_range
        self.free: list[tuple[int, int, int]] = []  # (bytes, insertion seq, storage id)
        self.seq = 0
        self.blocks: list[int] = []

    def request(self, size: int) -> int:
        if self.match_range == 0:
            return self._alloc(size)
        keys = self.free
        lo = bisect.bisect_left(keys, (size // self.match_range, -1, -1))
        mid = bisect.bisect_left(keys, (size, -1, -1))
        hi = bisect.bisect_right(keys, (size * self.match_range, float("inf"), 0))
        if mid < hi:  # smallest block at least as large
            _, _, sid = keys.pop(mid)
        elif mid > lo:  # else the largest smaller block, grown
            _, _, sid = keys.pop(mid - 1)
        else:
            return self._alloc(size)
        self.blocks[sid] = max(self.blocks[sid], size)
        return sid

    def release(self, sid: int) -> None:
        self.seq += 1
        bisect.insort(self.free, (self.blocks[sid], self.seq, sid))

    def _alloc(self, size: int) -> int:
        self.blocks.append(size)
        return len(self.blocks) - 1


def simulate(tg: TrainingGraph, strategy: str = "sharing", match_range: int = 16,
             timeline: bool = False) -> SimResult:
    """Run the planner over the training graph and return MXNet's figure."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {STRATEGIES}")
    inplace = strategy != "none"
    alloc = _Allocator(match_range if strategy == "sharing" else 0)
    n_entries = tg.num_entries
    ref = [0] * n_entries
    nodes = tg.nodes
    facts = [None if n.op is None else ops.memory_facts(n.op, len(n.inputs)) for n in nodes]
    for n, f in zip(nodes, facts):
        if n.op is None:
            continue
        ignore = f.ignore_inputs
        for i, (src, k) in enumerate(n.inputs):
            if i not in ignore:
                ref[src.eid + k] += 1
    for e in tg.outputs:
        ref[tg.entry(e)] += 1
    storage = [BAD] * n_entries
    for e in tg.outputs[tg.num_forward_outputs:]:
        storage[tg.entry(e)] = EXTERNAL
    sref = [0] * (n_entries + 1)
    live = 0
    live_line: list[int] = []
    block_live: dict[int, int] = {}
    for n, f in zip(nodes, facts):
        if n.op is None:
            if timeline:
                live_line.append(live)
            continue
        base = n.eid
        if inplace and f.inplace:
            taken = [False] * len(n.inputs)
            ignore_all = len(f.ignore_inputs) == len(n.inputs) and len(n.inputs) > 0
            for (i_in, i_out), identity in zip(f.inplace, f.identity):
                if i_in >= len(n.inputs) or i_out >= len(n.sizes):
                    continue
                eo = base + i_out
                src, k = n.inputs[i_in]
                ei = src.eid + k
                sid_in = storage[ei]
                same = n.sizes[i_out] == src.sizes[k]
                if (not taken[i_in] and storage[eo] == BAD and sid_in >= 0
                        and ((sref[sid_in] == 1 and not ignore_all) or (identity and same))
                        and ref[eo] > 0 and same):
                    taken[i_in] = True
                    storage[eo] = sid_in
                    sref[sid_in] += ref[eo]
        # allocate the rest, largest first (equal sizes: last output first)
        order = sorted(range(len(n.sizes)), key=lambda i: (n.sizes[i], i), reverse=True)
        for i in order:
            eo = base + i
            if storage[eo] != BAD:
                continue
            sid = alloc.request(n.sizes[i] * ELEMENT_BYTES)
            storage[eo] = sid
            if sid >= len(sref) - 1:
                sref.extend([0] * (sid - len(sref) + 2))
            sref[sid] = ref[eo]
            if timeline:
                block_live[sid] = alloc.blocks[sid]
        for i, (src, k) in enumerate(n.inputs):
            if i in f.ignore_inputs:
                continue
            sid = storage[src.eid + k]
            if sid < 0:
                continue
            sref[sid] -= 1
            if sref[sid] == 0:
                alloc.release(sid)
                block_live.pop(sid, None)
        for i in range(len(n.sizes)):
            sid = storage[base + i]
            if sid >= 0 and sref[sid] == 0:
                alloc.release(sid)
                block_live.pop(sid, None)
        if timeline:
            live_line.append(sum(block_live.values()))
    total = sum(alloc.blocks)
    return SimResult(total, storage, alloc.blocks, live_line)
