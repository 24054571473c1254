"""The planner's fast paths against literal references, on random mirror sets.

``memory_plan.simulate_flat`` runs the compiled planner (``sim/_planner.c``) on each node's
facts decoded once (``node_steps``: variable reads left out, unread outputs checked only when
one was allocated), ``sim.resolved`` resolves a mirror set in C as ``CompiledTraining.flat``
states it, ``Analysis.drop_unread`` and ``segment_mirror`` read precomputed tables,
and the multi-level DP's table is compiled (``planning/_dp.c``). Here each is compared with
a plain reading of what it replaces: MXNet's plan_memory.cc node by node (every read, every
output), the set comprehensions over the op order, and the DP's numpy statement. Storage ids,
block sizes, totals and timelines must be identical, for every strategy, on the training
graphs of real networks and on random flat graphs (few distinct sizes, so the free list holds
many blocks of one size), and ``stop_at`` must stop exactly when the full simulation's total
reaches it.
"""

from __future__ import annotations

import bisect
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_compiled import NETS
from test_properties import SETTINGS, build, networks, shapes_for

from mxmirror.api import prepare
from mxmirror.ir import ops
from mxmirror.planning import dp
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
        first_read = (any(r == ("out", 0) for tn in nodes for r in tn.inputs)
                      or any(n.id in present and (v.id, 0) in n.inputs for n in a.order))
        read = (any(r[0] == "out" for tn in nodes for r in tn.inputs)
                or any(c in present for c in a.graph.consumers.get(v.id, ())))
        if not gradient_pass.has_mirror_copy(v) or (
                not first_read and ops.must_write(v.op, v.attrs)):
            kept.discard(v.id)
        elif read or any(tn.control_fwd for tn in nodes):
            present.add(v.id)
    return kept


def _check(a, mirror: frozenset[int]) -> None:
    kept = a.drop_unread(mirror)
    assert kept == reference_drop_unread(a, mirror)
    for mm in (kept, mirror):  # the compiled resolution as CompiledTraining.flat states it
        fg, made = a.compiled.flat(mm)
        got, got_made = a.resolved.flat(mm)
        assert (list(got.order), got_made, list(got.ins), list(got.ref)) == \
            (fg.order, made, fg.ins, fg.ref)
        assert memory_plan.simulate_flat(got).total_bytes == \
            memory_plan.simulate_flat(fg).total_bytes
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


@st.composite
def flat_graphs(draw):
    """A FlatGraph of random nodes: variables and ops reading earlier entries, 1-3 outputs of
    a few sizes (equal sizes queue in the free list; factors of 16 and more test its match
    range), random in-place pairs (identities too) and ignored inputs, some graph outputs,
    some of them argument gradients."""
    n = draw(st.integers(2, 40))
    sizes_pool = draw(st.lists(st.sampled_from([1, 2, 3, 16, 17, 64, 300, 4096]),
                               min_size=1, max_size=4))
    facts, sizes, ins, in_start, base = [], [], [], [0], []
    n_entries = 0
    for i in range(n):
        variable = i == 0 or draw(st.integers(0, 4)) == 0
        n_out = 1 if variable else draw(st.integers(1, 3))
        sz = [draw(st.sampled_from(sizes_pool)) for _ in range(n_out)]
        reads = [] if variable else draw(st.lists(st.integers(0, n_entries - 1), max_size=4))
        if variable:
            facts.append(None)
        else:
            ignore = frozenset(draw(st.lists(st.integers(0, max(len(reads) - 1, 0)),
                                             max_size=2))) if reads else frozenset()
            # never in place on an ignored input (no MXNet op is: ops.FACTS)
            pairs = tuple(p for p in draw(st.lists(st.tuples(
                st.integers(0, max(len(reads) - 1, 0)), st.integers(0, n_out - 1)),
                max_size=3)) if p[0] not in ignore)
            identity = tuple(draw(st.booleans()) for _ in pairs)
            facts.append(ops.MemoryFacts(pairs, identity, ignore))
        sizes.append(sz)
        base.append(n_entries)
        n_entries += n_out
        ins += reads
        in_start.append(len(ins))
    esize = [s for sz in sizes for s in sz]
    op_entries = [e for i in range(n) if facts[i] is not None
                  for e in range(base[i], base[i] + len(sizes[i]))]
    heads = draw(st.lists(st.sampled_from(op_entries), max_size=3)) if op_entries else []
    grads = draw(st.lists(st.sampled_from(op_entries), max_size=3, unique=True)) \
        if op_entries else []
    order = list(range(n))
    if draw(st.booleans()):  # a subset of the nodes runs, as a FlatGraph of a mirror set
        order = [i for i in order if i == 0 or draw(st.integers(0, 5))]
    return memory_plan.FlatGraph(order, facts, sizes, ins, in_start, base, esize,
                                 heads + [g for g in grads if g not in heads], len(heads),
                                 [memory_plan.allocation_order(sz) for sz in sizes])


def test_no_op_works_in_place_on_an_ignored_input() -> None:
    """What flat_graphs keeps to: a block in place on an input whose read is not counted
    could be released twice."""
    for facts in (*ops.FACTS.values(), *ops.FACTS_BY_ARITY.values()):
        assert not {i for i, _ in facts.inplace} & facts.ignore_inputs, facts


@settings(max_examples=300, **SETTINGS)
@given(flat_graphs())
def test_compiled_planner_equals_reference_on_random_flat_graphs(fg) -> None:
    for strategy in memory_plan.STRATEGIES:
        for match_range in (16, 2):
            sim = memory_plan.simulate_flat(fg, strategy, match_range, timeline=True)
            assert (sim.total_bytes, sim.storage, sim.block_bytes, sim.timeline) == \
                reference_simulate(fg, strategy, match_range), (strategy, match_range)
    total = memory_plan.simulate_flat(fg).total_bytes
    for stop in {max(total, 1), total + 1, max(total // 2, 1), 1}:  # > 0: an allocation stops
        got = memory_plan.simulate_flat(fg, stop_at=stop)
        assert (got is None) == (total >= stop)


def reference_table(flops: list[float], state_bytes: list[int], unit: float, levels: int):
    """dp.Table's cost and arg as numpy states the DP, one (s, e) pair at a time."""
    m = len(flops)
    bu = np.array([math.ceil(b / unit) if b > 0 else 0 for b in state_bytes], dtype=np.int64)
    prefix = np.concatenate(([0.0], np.cumsum(flops)))
    Ms = np.arange(levels + 1)
    cost = np.full((m + 1, m + 1, levels + 1), np.inf)
    arg = np.full((m + 1, m + 1, levels + 1), -1, dtype=np.int32)
    for s in range(m):
        cost[s, s + 1, :] = flops[s]
    for length in range(2, m + 1):
        for s in range(0, m - length + 1):
            e = s + length
            mids = np.arange(s + 1, e)
            pair = bu[s + 1:e].copy()
            pair[1:] += bu[s + 1:e - 1]
            peak = np.maximum.accumulate(pair)
            idx = Ms[None, :] - bu[mids][:, None]
            right = np.take_along_axis(cost[mids, e, :], np.clip(idx, 0, levels), axis=1)
            right[idx < 0] = np.inf
            tot = (prefix[mids] - prefix[s])[:, None] + right + cost[s, s + 1:e, :]
            tot[peak[:, None] > Ms[None, :]] = np.inf
            j = tot.argmin(axis=0)
            cost[s, e, :] = tot[j, Ms]
            arg[s, e, :] = mids[j]
    return cost, arg


@settings(max_examples=150, **SETTINGS)
@given(st.integers(1, 24), st.sampled_from([2, 7, 64]), st.randoms())
def test_compiled_dp_table_equals_numpy(m, levels, rnd) -> None:
    """Ties included: FLOPs and states drawn from a few values."""
    flops = [rnd.choice([0.0, 1.0, 2.0, rnd.random() * 10]) for _ in range(m)]
    states = [rnd.choice([0, 1, 5, rnd.randint(0, 1000)]) for _ in range(m + 1)]
    unit = max(sum(states) / rnd.choice([2, 16, 64]), 1.0)
    table = dp.Table(flops, states, unit, levels)
    cost, arg = reference_table(flops, states, unit, levels)
    assert np.array_equal(table.cost, cost)
    assert np.array_equal(table.arg, arg)
