"""Seeing a plan: graphviz drawings of the forward graph (tools/timeline.py: memory
over the training step).

``plot_plan`` draws the forward graph with three visibly different kinds of node:

- **checkpoint** (green, bold border): a kept segment-boundary value;
- **recomputed** (orange, dashed border): dropped after the forward pass and
  recomputed in backward;
- **kept** (grey, solid): kept but not a checkpoint (e.g. a convolution output
  under ``cheap``, a Dropout, a loss).

Nodes are grouped into *segments* (the nodes between consecutive checkpoint cuts in
forward order), drawn as alternately coloured clusters. ``collapse`` keeps graphs of
thousands of layers readable: ``"block"`` draws one box per residual unit / LSTM step,
``"segment"`` one box per segment, ``"prefix:N"`` one box per run of nodes sharing
their first N name components, ``"auto"`` (the command line's default) every node of a
small graph and a large one by block, or by segment where blocks would still be too many
boxes to read, at most MAX_INCHES on its long side. A collapsed box is striped in
proportion to the MB that is checkpointed / recomputed / kept inside it.

Output is deterministic: the same plan gives the same DOT text byte for byte.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mxmirror.errors import PlanError
from mxmirror.log import mb_text
from mxmirror.planning.analysis import node_bytes
from mxmirror.runtime.plan import Plan

ROLES = ("checkpoint", "recomputed", "kept")
STYLE = {
    "checkpoint": {"style": "filled,bold", "fillcolor": "#2e7d32", "fontcolor": "white",
                   "color": "#1b5e20", "penwidth": "2.5"},
    "recomputed": {"style": "filled,dashed", "fillcolor": "#ffcc80", "color": "#e65100",
                   "penwidth": "1.5"},
    "kept": {"style": "filled", "fillcolor": "#e0e0e0", "color": "#616161"},
}
SEGMENT_BG = ("#e3f2fd", "#fff8e1")  # alternating cluster backgrounds
STRIPE = {"checkpoint": "#81c784", "recomputed": "#ffcc80", "kept": "#e0e0e0"}
COLLAPSE_MODES = ("auto", "none", "block", "segment", "prefix:N")
FULL_NODES = 100  # collapse="auto" draws every node of a graph of at most this many op nodes
MAX_BOXES = 40  # ... else one box per block if that gives at most this many, else per segment
MAX_INCHES = 104  # long side of a collapsed drawing: about 10k px at dot's 96 dpi
RENDER_FORMATS = ("svg", "png", "pdf")
NO_DOT = ("install Graphviz: apt-get install graphviz, brew install graphviz or conda install "
          "graphviz")
TIMELINE_FORMATS = ("png", "svg", "pdf")



def node_roles(plan: Plan) -> dict[int, str]:
    """checkpoint / recomputed / kept for every op node."""
    ckpt = set(plan.checkpoints)
    roles = {}
    for n in plan.graph.op_nodes:
        if n.id in plan.recomputed_ids:
            roles[n.id] = "recomputed"
        elif n.name in ckpt:
            roles[n.id] = "checkpoint"
        else:
            roles[n.id] = "kept"
    return roles


def segments(plan: Plan) -> dict[int, int]:
    """Segment index (0, 1, ...) of every op node, in forward order.

    A cut is a position in the forward order where every value crossing it
    (produced at or before, read after) is a checkpoint; a segment is the run of
    nodes between two consecutive cuts. A segment made only of checkpoints (the
    second half of a c/h pair) joins the one before it. A plan without
    checkpoints is one segment.
    """
    a = plan.analysis
    order = a.order
    ckpt_names = set(plan.checkpoints)
    ckpt = {n.id for n in order if n.name in ckpt_names}
    heads = {h[0] for h in plan.graph.heads}
    last = a.last_use
    ends: dict[int, list[int]] = {}
    live = 0
    live_other = 0  # crossing values that are not checkpoints
    raw: list[int] = []
    seg = 0
    for i, n in enumerate(order):
        if last[n.id] > i and n.id not in heads:
            ends.setdefault(last[n.id], []).append(n.id)
            live += 1
            live_other += n.id not in ckpt
        for k in ends.pop(i, ()):
            live -= 1
            live_other -= k not in ckpt
        raw.append(seg)
        if live and not live_other:
            seg += 1
    # merge segments made only of checkpoints into the previous one, renumber
    members: dict[int, list[int]] = {}
    for n, s in zip(order, raw):
        members.setdefault(s, []).append(n.id)
    out: dict[int, int] = {}
    index = -1
    for s in sorted(members):
        ids = members[s]
        if index < 0 or not all(i in ckpt for i in ids):
            index += 1
        for i in ids:
            out[i] = index
    return out


def _block_key(name: str) -> str:
    """'stage1_unit1_conv_sc' -> 'stage1_unit1', 't3_l0_c_tanh' -> 't3_l0', 't3_cls' -> 't3'.

    The name without its last '_' part, cut after the last part holding a digit
    (the unit / step / layer index); without such a part, the first part.
    """
    parts = name.split("_")
    if len(parts) == 1:
        return name
    head = parts[:-1]
    idx = [i for i, p in enumerate(head) if any(ch.isdigit() for ch in p)]
    return "_".join(head[: idx[-1] + 1]) if idx else head[0]


def _block_keys(names: list[str]) -> list[str]:
    """Group names into runs sharing a block key ('stage1_unit1', 't3').

    A node joins the current run when its key equals the run's key or one
    extends the other ('t3' then 't3_l0'): so an unrolled LSTM collapses to one
    box per time step and a ResNet to one box per residual unit.
    """
    runs: list[list] = []  # [key, count]
    for name in names:
        key = _block_key(name)
        run = runs[-1] if runs else None
        if run is not None and (key == run[0] or key.startswith(run[0] + "_")):
            run[1] += 1
        elif run is not None and run[0].startswith(key + "_"):
            run[0] = key
            run[1] += 1
        else:
            runs.append([key, 1])
    # a key may come back later ('t3' after 't3_l0'...): number repeated runs apart
    return [f"{key}\x00{i}" for i, (key, count) in enumerate(runs) for _ in range(count)]


def _group_keys(names: list[str], collapse) -> list[str] | None:
    if collapse in (None, "none", False):
        return None
    if callable(collapse):
        return [str(collapse(n)) for n in names]
    if collapse == "block":
        return _block_keys(names)
    m = re.fullmatch(r"prefix:(\d+)", str(collapse))
    if m and int(m.group(1)) > 0:
        depth = int(m.group(1))
        return ["_".join(n.split("_")[:depth]) for n in names]
    if collapse == "segment":
        return ["" for _ in names]
    raise PlanError(f"unknown collapse {collapse!r}; choose from {', '.join(COLLAPSE_MODES)} "
                    "(e.g. prefix:2)")


def auto_collapse(plan: Plan) -> tuple[str | None, str]:
    """collapse="auto": the mode for this plan's drawing, and a note saying what was done
    and how to get every node ("" when every node is drawn)."""
    nodes = len(plan.graph.op_nodes)
    if nodes <= FULL_NODES:
        return None, ""
    mode = "block"
    boxes = len(build_groups(plan, mode)[0])
    if boxes > MAX_BOXES:
        mode = "segment"
        boxes = len(build_groups(plan, mode)[0])
    return mode, (f"{nodes} op nodes drawn as {boxes} boxes, one per {mode}; "
                  f"--collapse none draws every node")


def check_collapse(collapse: str | None) -> str | None:
    """The collapse mode, or a PlanError naming the valid ones."""
    if collapse in (None, "none", "auto"):
        return None if collapse == "none" else collapse
    _group_keys(["x"], collapse)
    return collapse


def check_outputs(graph_path: str | None, timeline_path: str | None) -> None:
    """Fail before planning if an output cannot be written (format, folder)."""
    for path, formats in ((graph_path, ("dot", "gv", *RENDER_FORMATS)),
                          (timeline_path, TIMELINE_FORMATS)):
        if not path:
            continue
        p = Path(path)
        if p.suffix.lstrip(".").lower() not in formats:
            raise PlanError(f"cannot write {p.name!r}: give a file ending in "
                            + ", ".join("." + f for f in formats))
        if not p.parent.is_dir():
            raise PlanError(f"cannot write {p}: folder {p.parent} does not exist")


@dataclass
class Group:
    """One drawn box: a single node, or a run of nodes collapsed together."""

    gid: int
    segment: int
    key: str
    ids: list[int] = field(default_factory=list)
    mb: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ROLES, 0.0))
    count: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLES, 0))


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attrs(d: dict[str, str]) -> str:
    return ", ".join(f"{k}={_quote(str(v))}" for k, v in d.items())


def build_groups(plan: Plan, collapse: str | Callable[[str], str] | None = None
                 ) -> tuple[list[Group], dict[int, int]]:
    """The boxes to draw (in forward order) and node id -> box index."""
    order = plan.analysis.order
    roles = node_roles(plan)
    seg = segments(plan)
    keys = _group_keys([n.name for n in order], collapse)
    groups: list[Group] = []
    where: dict[int, int] = {}
    for i, n in enumerate(order):
        if keys is None:
            new = True
        else:
            g = groups[-1] if groups else None
            new = g is None or g.segment != seg[n.id] or g.key != keys[i]
        if new:
            groups.append(Group(len(groups), seg[n.id], "" if keys is None else keys[i]))
        g = groups[-1]
        g.ids.append(n.id)
        r = roles[n.id]
        g.mb[r] += node_bytes(n) / 2**20
        g.count[r] += 1
        where[n.id] = g.gid
    return groups, where


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _legend(plan: Plan, nseg: int, collapse) -> list[str]:
    """The graph's title and legend, as an HTML-like label (policy, baseline, planned MB)."""
    n_ops = len(plan.graph.op_nodes)
    saved = 1 - plan.planned_mb / plan.baseline_mb if plan.baseline_mb else 0.0
    title = (f"policy={plan.policy}   baseline={mb_text(plan.baseline_mb, 0)}   "
             f"planned={mb_text(plan.planned_mb, 0)} ({-saved:+.0%})   "
             f"recompute={plan.recompute_ratio:.2f}x extra forward")
    sub = (f"{len(plan.recomputed_ids)} of {n_ops} op nodes recomputed, "
           f"{len(plan.checkpoints)} checkpoints, {nseg} segment{'s' * (nseg != 1)}"
           + (f"; collapsed by {collapse if isinstance(collapse, str) else 'key'}"
              if collapse not in (None, "none", False) else "")
           + "; MB = forward output bytes as MXNet counts them")
    cells = [
        f'<td bgcolor="{STYLE["checkpoint"]["fillcolor"]}" style="rounded">'
        '<font color="white">checkpoint: kept segment boundary</font></td>',
        f'<td bgcolor="{STYLE["recomputed"]["fillcolor"]}" style="dashed">'
        'recomputed in backward</td>',
        f'<td bgcolor="{STYLE["kept"]["fillcolor"]}">kept, not a checkpoint</td>',
    ]
    if collapse not in (None, "none", False):
        cells.append('<td>collapsed box: stripes = share of its MB; '
                     'bold green border: holds a checkpoint</td>')
    if collapse != "segment":
        cells.append(f'<td bgcolor="{SEGMENT_BG[0]}">segment</td>'
                     f'<td bgcolor="{SEGMENT_BG[1]}">next segment</td>')
    label = ('<<table border="0" cellborder="1" cellspacing="3" cellpadding="4">'
             f'<tr><td colspan="{len(cells) + (collapse != "segment")}" border="0">'
             f'<font point-size="16"><b>mxmirror plan: {_html(title)}</b></font></td></tr>'
             f'<tr><td colspan="{len(cells) + (collapse != "segment")}" border="0">'
             f'{_html(sub)}</td></tr><tr>{"".join(cells)}</tr></table>>')
    return [f"  label={label}; labelloc=t; labeljust=l;"]


def to_dot(plan: Plan, collapse: str | Callable[[str], str] | None = None) -> str:
    """Deterministic DOT source of the plan's forward graph.

    collapse: None/"none" (every op node), "block" (residual units, LSTM steps:
    runs of names sharing a prefix), "segment" (one box per segment),
    "prefix:N" (runs sharing the first N '_'-separated name components), "auto"
    (auto_collapse), or a function name -> key (consecutive nodes with one key share
    a box). Collapsed drawings are at most MAX_INCHES on their long side.
    """
    graph = plan.graph
    capped = collapse not in (None, "none", False)  # asked for every node: the whole of it
    if collapse == "auto":
        collapse = auto_collapse(plan)[0]
    groups, where = build_groups(plan, collapse)
    nseg = (groups[-1].segment + 1) if groups else 0
    collapsed = collapse not in (None, "none", False)
    lines = ["digraph plan {",
             '  rankdir=TB; newrank=true; nodesep=0.25; ranksep=0.3;'
             + (f' size="{MAX_INCHES},{MAX_INCHES}";' if capped else ""),
             '  node [shape=box, fontname="Helvetica", fontsize=10, margin="0.08,0.03"];',
             '  edge [fontname="Helvetica", fontsize=8, color="#757575", arrowsize=0.6];',
             '  graph [fontname="Helvetica"];']
    lines += _legend(plan, nseg, collapse)
    by_seg: dict[int, list[Group]] = {}
    for g in groups:
        by_seg.setdefault(g.segment, []).append(g)
    for s in sorted(by_seg):
        members = by_seg[s]
        ids = [i for g in members for i in g.ids]
        mb = sum(sum(g.mb.values()) for g in members)
        rec = sum(g.count["recomputed"] for g in members)
        ck = sum(g.count["checkpoint"] for g in members)
        seg_label = (f"segment {s}: {len(ids)} nodes, {mb_text(mb)}, {rec} recomputed, "
                     f"{ck} checkpoint{'s' * (ck != 1)}")
        boxes = [_box(plan, g, collapse, seg_label) for g in members]
        if collapse == "segment":
            lines += ["  " + b for b in boxes]
            continue
        lines.append(f"  subgraph cluster_s{s} {{")
        lines.append(f"    label={_quote(seg_label)}; labeljust=l; fontsize=9; "
                     f'style="filled,rounded"; color="#90a4ae"; '
                     f"fillcolor={_quote(SEGMENT_BG[s % 2])};")
        lines += ["    " + b for b in boxes]
        lines.append("  }")
    edges: dict[tuple[int, int], float] = {}
    seen_src: set[tuple[int, int, int]] = set()
    for g in groups:
        for nid in g.ids:
            for src, _ in graph.nodes[nid].inputs:
                if graph.nodes[src].is_variable or where[src] == g.gid:
                    continue
                key = (where[src], g.gid)
                mb = 0.0
                if (src, *key) not in seen_src:
                    seen_src.add((src, *key))
                    mb = node_bytes(graph.nodes[src]) / 2**20
                edges[key] = edges.get(key, 0.0) + mb
    for (a, b), mb in sorted(edges.items()):
        label = f" [label={_quote(mb_text(mb))}]" if collapsed else ""
        lines.append(f"  g{a} -> g{b}{label};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _box(plan: Plan, g: Group, collapse, seg_label: str) -> str:
    graph = plan.graph
    mb = sum(g.mb.values())
    if len(g.ids) == 1 and collapse != "segment":
        n = graph.nodes[g.ids[0]]
        role = next(r for r in ROLES if g.count[r])
        label = f"{n.name}\n{n.op}  {mb_text(mb)}"
        return (f"g{g.gid} [label={_quote(label)}, class={_quote(role)}, "
                f"tooltip={_quote(n.name)}, {_attrs(STYLE[role])}];")
    first, last = graph.nodes[g.ids[0]].name, graph.nodes[g.ids[-1]].name
    if collapse == "segment":
        head = seg_label.split(":")[0]
        label = (f"{head}  ({len(g.ids)} nodes)\n{first} .. {last}\n{mb_text(mb)} forward, "
                 f"{g.count['recomputed']} recomputed, {g.count['kept']} kept, "
                 f"{g.count['checkpoint']} checkpoint{'s' * (g.count['checkpoint'] != 1)}")
    else:
        label = (f"{g.key.split(chr(0))[0] or first}  ({len(g.ids)} nodes)\n{mb_text(mb)}   "
                 f"{g.count['recomputed']} recomputed"
                 + (f", {g.count['kept']} kept" if g.count["kept"] else "")
                 + (f", {g.count['checkpoint']} ckpt" if g.count["checkpoint"] else ""))
    total = mb or 1.0
    parts = [(r, g.mb[r] / total) for r in ROLES if g.count[r]]
    if sum(f for _, f in parts) <= 0:  # all zero-byte nodes: stripe by count
        parts = [(r, g.count[r] / len(g.ids)) for r in ROLES if g.count[r]]
    fill = ":".join(f"{STRIPE[r]};{max(f, 0.001):.3f}" for r, f in parts)
    role = "group_checkpoint" if g.count["checkpoint"] else (
        "group_recomputed" if g.count["recomputed"] == len(g.ids) else "group")
    attrs = {"style": "filled,striped" + (",bold" if g.count["checkpoint"] else ""),
             "fillcolor": fill, "penwidth": "2.5" if g.count["checkpoint"] else "1",
             "color": STYLE["checkpoint"]["color"] if g.count["checkpoint"] else "#616161"}
    return (f"g{g.gid} [label={_quote(label)}, class={_quote(role)}, "
            f"tooltip={_quote(first + ' .. ' + last)}, {_attrs(attrs)}];")


def plot_plan(plan: Plan, path: str | Path,
              collapse: str | Callable[[str], str] | None = None) -> tuple[Path, str]:
    """Write .dot/.gv, or render .svg/.png/.pdf through graphviz's `dot` when installed.

    Returns (file written, note); the note says how a "auto" drawing was collapsed.
    Without `dot` the DOT source is written next to the requested file and the note says
    so (the command line makes that an error).
    """
    path = Path(path)
    note = auto_collapse(plan)[1] if collapse == "auto" else ""
    source = to_dot(plan, collapse=collapse)
    check_outputs(str(path), None)
    fmt = path.suffix.lstrip(".").lower()
    if fmt in ("dot", "gv"):
        _write(path, source.encode())
        return path, note
    if shutil.which("dot") is None:
        dot_path = path.with_suffix(".dot")
        _write(dot_path, source.encode())
        return dot_path, (f"Graphviz's dot is not installed ({NO_DOT}): wrote the DOT "
                          f"source to {dot_path} instead")
    import graphviz

    try:
        data = graphviz.Source(source, format=fmt).pipe()
    except Exception as exc:  # graphviz reports dot's own failure
        raise PlanError(f"graphviz could not render {path.name}: {exc}") from None
    _write(path, data)
    return path, note


def _write(path: Path, data: bytes) -> None:
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise PlanError(f"cannot write {path}: {exc.strerror}") from None
