"""Policy ``search`` (alias ``optimal``): the least planned memory a search finds with each
node recomputed at most once. A heuristic, not a proof of optimality.

Starts: Algorithm 3's wider budget grid, and a dynamic program over the chain of
cut points (for a bound M on the bytes of any segment, the cuts that keep every
segment within M at the least total pinned bytes: exact over the chain, linear
with a monotone window; sweeping M gives the Pareto front of kept bytes vs
largest segment). Then, each move scored by the simulator (MXNet's own planner):
per-stage budgets by coordinate descent, a round-robin local search over the
cuts, a search at the simulated peak, and a taper search of segment lengths.
The result is never worse than any start, nor than the cheap plan (which recomputes
only cheap ops and keeps no segment boundary: on small graphs it can be the least), but
other plans may be smaller (docs/benchmark.md records a stochastic search that found one).
"""

from __future__ import annotations

from collections import deque

from mxmirror.planning.algorithm3 import candidates, segment_mirror
from mxmirror.planning.analysis import Analysis, Cut
from mxmirror.planning.choice import Choice, mirror_choice
from mxmirror.planning.strategies.cheap import cheap_mirror
from mxmirror.sim import memory_plan, training_graph

FRONT_POINTS = 16


def min_checkpoints(prefix: list[int], cuts: list[Cut], bound: int) -> list[Cut] | None:
    """Cuts of least total bytes such that no segment holds more than `bound` bytes."""
    end = prefix[-1]
    at = [prefix[c.pos + 1] for c in cuts]  # bytes up to and including each cut
    n = len(cuts)
    best = [None] * n
    back = [-1] * n
    window: deque[int] = deque()  # indices of reachable predecessors, best first
    for j in range(n):
        # drop predecessors too far behind
        while window and at[j] - at[window[0]] > bound:
            window.popleft()
        cands = []
        if at[j] <= bound:  # the chain's start is within reach
            cands.append((0, -1))
        if window:
            cands.append((best[window[0]], window[0]))
        if cands:
            cost, prev = min(cands)
            best[j] = cost + cuts[j].pinned
            back[j] = prev
            while window and best[window[-1]] >= best[j]:
                window.pop()
            window.append(j)
    if end <= bound:
        return []
    finals = [j for j in range(n) if best[j] is not None and end - at[j] <= bound]
    if not finals:
        return None
    j = min(finals, key=lambda k: best[k])
    chosen = []
    while j != -1:
        chosen.append(cuts[j])
        j = back[j]
    return chosen[::-1]


def checkpoint_front(a: Analysis, points: int = FRONT_POINTS) -> list[tuple[int, int, list[Cut]]]:
    """(kept + bound, bound, cuts) along the Pareto front of kept bytes vs largest segment."""
    cuts = a.cuts
    prefix = a.prefix_bytes
    if not cuts:
        return []
    lo = max(max(prefix[c.pos + 1] - prefix[c.pos] for c in cuts), 1)
    hi = prefix[-1]
    out = []
    for k in range(points):
        bound = int(lo * (hi / lo) ** (k / (points - 1)))
        chosen = min_checkpoints(prefix, cuts, bound)
        if chosen is not None:
            kept = sum(c.pinned for c in chosen)
            out.append((kept + bound, bound, chosen))
    return out


MAX_LOCAL_STEPS = 120
SWEEPS = 2
FACTORS = (0.0, 0.25, 0.5, 0.71, 1.41, 2.0, 4.0)


def regions(cuts: list[Cut]) -> list[int]:
    """Region index per cut: runs of cuts of about the same size (a ResNet stage)."""
    out, last, r = [], None, -1
    for c in cuts:
        cls = max(c.pinned, 1).bit_length()
        if cls != last:
            r, last = r + 1, cls
        out.append(r)
    return out


def greedy_by_region(a: Analysis, region: list[int], budgets: list[float]) -> list[Cut]:
    """Algorithm 3 with its own byte budget per region of the chain."""
    by_pos = {c.pos: (c, region[k]) for k, c in enumerate(a.cuts)}
    chosen, acc, r = [], 0, 0
    for i, b in enumerate(a.node_bytes):
        acc += b
        hit = by_pos.get(i)
        if hit is not None:
            c, r = hit
            if acc > budgets[r]:
                chosen.append(c)
                acc = 0
    return chosen


def choose(a: Analysis, budget_bytes: int | None = None) -> Choice:
    pts = checkpoint_front(a)
    grid = candidates(a, steps=17, spread=8.0)
    mirror_losses = not grid or bool(a.losses & grid[0].mirror) or not a.losses

    def evaluate(chosen, below=None):
        """(score, mirror set) of a list of cuts; score None: not below `below` bytes."""
        mirror = segment_mirror(a, chosen, mirror_losses=mirror_losses)
        return a.score_below(mirror, below), mirror

    best = None
    best_b = None
    for c in grid:
        s, mirror = evaluate(c.cuts, best and best[0].planned_bytes)
        if s is not None:
            best, best_b = (s, mirror, c.cuts), c.budget
    for _, _, chosen in pts:
        s, mirror = evaluate(chosen, best and best[0].planned_bytes)
        if s is not None:
            best = (s, mirror, chosen)
    if best is None or best[0].planned_bytes >= a.baseline.planned_bytes:
        return _or_cheap(a, Choice(a.baseline))
    # a byte budget per region (stage), by coordinate descent from the best uniform one
    region = regions(a.cuts)
    n_regions = max(region, default=-1) + 1
    if best_b is not None and 1 < n_regions <= 8:
        budgets = [best_b] * n_regions
        for _ in range(SWEEPS):
            for r in range(n_regions):
                for f in FACTORS:
                    trial = list(budgets)
                    trial[r] = budgets[r] * f
                    chosen = greedy_by_region(a, region, trial)
                    s, mirror = evaluate(chosen, best[0].planned_bytes)
                    if s is not None:
                        best, budgets = (s, mirror, chosen), trial
    best = _local_search(evaluate, a.cuts, *best)
    best = _peak_search(a, evaluate, *best)
    s, mirror, chosen = _taper_search(evaluate, a.cuts, *best)
    return _or_cheap(a, mirror_choice(a, mirror, chosen))


def _or_cheap(a: Analysis, found: Choice) -> Choice:
    """`found`, or the cheap plan where that holds less memory."""
    mirror = cheap_mirror(a)
    if not mirror:
        return found
    cheap = mirror_choice(a, mirror)
    return cheap if cheap.score.planned_bytes < found.score.planned_bytes else found


def _local_search(evaluate, cuts, best, mirror, chosen):
    """Drop, shift or add one cut at a time while simulated memory falls.

    The cuts are visited round robin (an accepted move does not restart the scan), so a
    bounded number of steps reaches every part of the chain; a pass with no improvement ends
    it. "Add" puts a cut a quarter, half or three quarters of the way from the kept cut before.
    `evaluate` scores a list of cuts (memoized by the Analysis; None: not below the bound).
    """
    by_pos = cuts  # sorted by position
    index = {c.pos: i for i, c in enumerate(by_pos)}
    steps, j, quiet = 0, 0, 0
    while chosen and steps < MAX_LOCAL_STEPS and quiet <= len(chosen):
        j %= len(chosen)
        i = index.get(chosen[j].pos)
        options = [chosen[:j] + chosen[j + 1:]]
        if i is not None:
            for d in (-1, 1):
                if 0 <= i + d < len(by_pos):
                    options.append(chosen[:j] + [by_pos[i + d]] + chosen[j + 1:])
            lo = index.get(chosen[j - 1].pos, -1) if j > 0 else -1
            for mid in sorted({lo + (i - lo) * q // 4 for q in (1, 2, 3)}):
                if lo < mid < i:
                    options.append(chosen[:j] + [by_pos[mid]] + chosen[j:])
        accepted = False
        for opt in options:
            s, m = evaluate(opt, best.planned_bytes)
            steps += 1
            if s is not None:
                best, mirror, chosen, accepted = s, m, opt, True
                break
            if steps >= MAX_LOCAL_STEPS:
                break
        quiet = 0 if accepted else quiet + 1
        j += 1
    return best, mirror, chosen


PEAK_STEPS = 60


def _peak_position(a: Analysis, mirror: frozenset[int]) -> int | None:
    """Forward position of the last node recomputed before the simulated peak of live bytes:
    the segment whose recomputation sets the peak."""
    pos = a.pos
    if a.resolved is not None:
        fg, _ = a.resolved.flat(mirror)
        copies = [a.compiled.copy_of.get(i) for i in fg.order]  # graph id of each copy
        line = memory_plan.simulate_flat(fg, timeline=True).timeline
    else:
        tg = training_graph.build(a.graph, set(mirror))
        copies = [t.fwd if t.role == "mirror" else None for t in tg.nodes]
        line = memory_plan.simulate(tg, timeline=True).timeline
    p = max(range(len(line)), key=line.__getitem__)
    for g in reversed(copies[:p + 1]):
        if g is not None and g in pos:
            return pos[g]
    return None


def _peak_search(a: Analysis, evaluate, best, mirror, chosen):
    """Split or shrink the segment recomputed at the peak while simulated memory falls.

    The round-robin search treats every cut alike; the peak is where a change pays. Moves:
    a cut a quarter, half or three quarters into the peak segment, or one of its two bounding
    cuts moved one candidate inwards.
    """
    by_pos = a.cuts
    steps = 0
    while steps < PEAK_STEPS:
        x = _peak_position(a, best.recomputed_ids)
        if x is None:
            break
        chosen = sorted(chosen, key=lambda c: c.pos)
        k = max((j for j, c in enumerate(chosen) if c.pos < x), default=-1)
        lo = chosen[k].pos if k >= 0 else -1
        hi = chosen[k + 1].pos if k + 1 < len(chosen) else len(a.order)
        inside = [c for c in by_pos if lo < c.pos < hi]
        options = []
        for q in (2, 1, 3):
            if inside:
                options.append(chosen[:k + 1] + [inside[len(inside) * q // 4]] + chosen[k + 1:])
        if inside and k >= 0:
            options.append(chosen[:k] + [inside[0]] + chosen[k + 1:])
        if inside and k + 1 < len(chosen):
            options.append(chosen[:k + 1] + [inside[-1]] + chosen[k + 2:])
        found = None
        for opt in options:
            s, m = evaluate(opt, (found or best).planned_bytes)
            steps += 1
            if s is not None:
                found, fm, fc = s, m, opt
        if found is None:
            break
        best, mirror, chosen = found, fm, fc
    return best, mirror, chosen


PIECES = 6
TAPER_SWEEPS = 3
TAPERS = (0.0, 0.4, 0.7)  # first piece this much longer than the mean, the last shorter


def _taper_search(evaluate, cuts, best, mirror, chosen):
    """Segment lengths per region, constant over each of PIECES stretches, by coordinate descent.

    Two effects decide MXNet's figure beyond the live bytes. Checkpoints are released as
    backward goes, so segments may grow towards the start of the network (the late ones are
    recomputed while every checkpoint is held). And MXNet's free list reuses blocks exactly
    only when segments repeat the same sizes, so runs of equal segments beat a smooth taper.
    Lengths count candidate cuts (residual units in a ResNet stage); the descent starts from
    the current plan's mean spacing, flat and tapered (TAPERS), and the best result wins.
    """
    by_pos = cuts  # sorted by position
    index = {c.pos: i for i, c in enumerate(by_pos)}
    region = regions(by_pos)
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(region):
        groups.setdefault(r, []).append(i)
    taken = sorted(index[c.pos] for c in chosen if c.pos in index)
    gaps, start = {}, {}
    for r, idx in groups.items():
        mine = [idx.index(i) for i in taken if region[i] == r]
        if len(idx) >= 4 * PIECES and len(mine) >= 2:
            gaps[r] = (mine[-1] - mine[0]) / (len(mine) - 1)
            start[r] = mine[0]
    if not gaps:
        return best, mirror, chosen
    fixed = [i for i in taken if region[i] not in gaps]

    def run(ls, below=None):
        sel = list(fixed)
        for r, pieces in ls.items():
            idx, u = groups[r], start[r]
            while u < len(idx):
                sel.append(idx[u])
                u += pieces[min(PIECES - 1, u * PIECES // len(idx))]
        opt = [by_pos[i] for i in sorted(sel)]
        return (*evaluate(opt, below), opt)

    found = (best, mirror, chosen)
    for taper in TAPERS:
        lengths = {r: [max(1, round(g * (1 + taper * (0.5 - k / (PIECES - 1)))))
                       for k in range(PIECES)] for r, g in gaps.items()}
        cur = run(lengths)
        for _ in range(TAPER_SWEEPS):
            moved = False
            for r in lengths:
                for k in range(PIECES):
                    for d in (-2, -1, 1, 2):
                        trial = {q: list(v) for q, v in lengths.items()}
                        trial[r][k] += d
                        if trial[r][k] < 1:
                            continue
                        got = run(trial, cur[0].planned_bytes)
                        if got[0] is not None:
                            cur, lengths, moved = got, trial, True
            if not moved:
                break
        if cur[0].planned_bytes < found[0].planned_bytes:
            found = cur
    return found
