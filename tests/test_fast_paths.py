"""The planner's fast paths against literal references, on random mirror sets.

``memory_plan.simulate_flat`` decodes each node once (``node_steps``: variable reads left out,
unread outputs checked only when one was allocated), and ``Analysis.drop_unread`` and
``segment_mirror`` read precomputed tables. Here each is compared with a plain reading of
what it replaces: MXNet's plan_memory.cc node by node (every read, every output), and the
set comprehensions over the op order. Storage ids, block sizes, totals and timelines must
be identical, for every strategy, and ``stop_at`` must stop exactly when the full
simulation's total reaches it.
"""

from __future__ import annotations

import bisect
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_compiled import NETS
from test_properties import SETTINGS, build, networks, shapes_for

from mxmirror.api import prepare
from mxmirror.ir import ops
from mxmirror.planning.algorithm3 import segment_mirror
from mxmirror.sim import gradient_pass, memory_plan
from mxmirror.sim.memory_plan import BAD, ELEMENT_BYTES, EXTERNAL


def reference_simulate(fg: memory_plan.FlatGraph, strategy: str = "sharing", match_range: int = 16):
    """MXPlanMemory read literally: (total bytes, storage per entry, blocks, timeline)."""
    inplace = strategy != "none"
    mr = match_range if strategy == "sharing" else 0
    ref = [0] * len(fg.esize)
    for i in fg.order:
        f = fg.facts[i]
        if f is not None:
            for j, e in enumerate(fg.ins[fg.in_start[i]:fg.in_start[i + 1]]):
                if j not in f.ignore_inputs:
                    ref[e] += 1
    for e in fg.outputs:
        ref[e] += 1
    storage = [BAD] * len(fg.esize)
    for e in fg.outputs[fg.num_forward_outputs:]:
        storage[e] = EXTERNAL
    sref: dict[int, int] = {}
    blocks: list[int] = []
    free: list[tuple[int, int, int]] = []  # (bytes, release order, storage id): a multimap
    live: dict[int, int] = {}
    line: list[int] = []
    released = [0]

    def release(sid: int) -> None:
        released[0] += 1
        free.append((blocks[sid], released[0], sid))
        free.sort()
        live.pop(sid, None)

    for i in fg.order:
        f = fg.facts[i]
        if f is None:
            line.append(0)
            continue
        inputs = fg.ins[fg.in_start[i]:fg.in_start[i + 1]]
        sizes, base = fg.sizes[i], fg.base[i]
        taken = set()
        for (i_in, i_out), identity in zip(f.inplace, f.identity) if inplace else ():
            if i_in >= len(inputs) or i_out >= len(sizes):
                continue
            ei, eo = inputs[i_in], base + i_out
            sid = storage[ei]
            same = sizes[i_out] == fg.esize[ei]
            ignore_all = len(f.ignore_inputs) == len(inputs) > 0
            if (i_in not in taken and storage[eo] == BAD and sid >= 0 and ref[eo] > 0 and same
                    and ((sref[sid] == 1 and not ignore_all) or identity)):
                taken.add(i_in)
                storage[eo] = sid
                sref[sid] += ref[eo]
        for k in fg.out_order[i]:
            eo = base + k
            if storage[eo] != BAD:
                continue
            size = sizes[k] * ELEMENT_BYTES
            sid = -1
            if mr:
                at = bisect.bisect_left(free, (size, -1, -1))
                if at < len(free) and free[at][0] <= size * mr:
                    sid = free.pop(at)[2]
                elif at and free[at - 1][0] >= size // mr:
                    sid = free.pop(at - 1)[2]
            if sid < 0:
                sid = len(blocks)
                blocks.append(size)
            blocks[sid] = max(blocks[sid], size)
            storage[eo] = sid
            sref[sid] = ref[eo]
            live[sid] = blocks[sid]
        for j, e in enumerate(inputs):
            sid = storage[e]
            if sid >= 0 and j not in f.ignore_inputs:
                sref[sid] -= 1
                if not sref[sid]:
                    release(sid)
        for eo in range(base, base + len(sizes)):
            sid = storage[eo]
            if sid >= 0 and not sref[sid]:
                release(sid)
        line.append(sum(live.values()))
    return sum(blocks), storage, blocks, line


def reference_drop_unread(a, mirror: frozenset[int]) -> set[int]:
    """Analysis.drop_unread as the op order and the templates state it."""
    kept, present = set(mirror), set()
    for v in reversed(a.order):
        if v.id not in kept:
            continue
        nodes = v.template.nodes if v.template is not None else []
        read = (any(r[0] == "out" for tn in nodes for r in tn.inputs)
                or any(c in present for c in a.graph.consumers.get(v.id, ())))
        if not gradient_pass.has_mirror_copy(v) or (not read and v.op in ops.MUST_WRITE):
            kept.discard(v.id)
        elif read or any(tn.control_fwd for tn in nodes):
            present.add(v.id)
    return kept


def _check(a, mirror: frozenset[int]) -> None:
    kept = a.drop_unread(mirror)
    assert kept == reference_drop_unread(a, mirror)
    fg, _ = a.compiled.flat(kept)
    for strategy in memory_plan.STRATEGIES:
        sim = memory_plan.simulate_flat(fg, strategy, timeline=True)
        assert (sim.total_bytes, sim.storage, sim.block_bytes, sim.timeline) == \
            reference_simulate(fg, strategy), strategy
    total = memory_plan.simulate_flat(fg).total_bytes
    for stop in (total, total + 1, total // 2, 1):
        got = memory_plan.simulate_flat(fg, stop_at=stop)
        assert (got is None) == (total >= stop)


@pytest.mark.parametrize("name", sorted(NETS))
def test_fast_paths_equal_references(name: str) -> None:
    sym, shapes = NETS[name]()
    a = prepare(sym, **shapes).analysis
    ids = [n.id for n in a.order]
    rng = random.Random(11)
    sets = [frozenset(), frozenset(ids)]
    sets += [frozenset(i for i in ids if rng.random() < p) for p in (0.2, 0.5, 0.8)]
    for mirror in sets:
        _check(a, mirror)
    cuts = rng.sample(a.cuts, min(3, len(a.cuts)))
    for only_cheap in (False, True):
        for losses in (False, True):
            keep = set() if losses else set(a.losses)
            for c in cuts:
                keep |= c.keep
            assert segment_mirror(a, cuts, only_cheap, losses) == {
                n.id for n in a.order if n.id not in keep and n.id not in a.blockers
                and not (only_cheap and not ops.is_cheap(n.op))}


@settings(max_examples=15, **SETTINGS)
@given(networks(), st.lists(st.floats(0, 1), min_size=2, max_size=2), st.randoms())
def test_fast_paths_on_random_networks(net, rates, rnd) -> None:
    recipe, heads = net
    sym = build(recipe, heads, hidden=16)
    a = prepare(sym, **shapes_for(sym, 8, 16)).analysis
    for rate in rates:
        _check(a, frozenset(n.id for n in a.order if rnd.random() < rate))
